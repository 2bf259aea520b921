"""Settings that differ are never ranked together: the leaderboard's setting sections (the transfer
data a method reads, one architecture or a heterogeneous pool, the budget class, faults,
modalities, client models trained on peers' data) through the real CLI: ``leaderboard show``
(table, markdown, csv, json), ``--rank``, the HTML site and ``plot``, on a mixed folder of
hand-written records; and records written before the method section stated its transfer data
(schema < 1.6) or its peer data and predictor (< 1.7) fall back to the registered card. The
evaluated predictor is a column; real runs' records state it."""

from __future__ import annotations

import csv
import dataclasses
import hashlib
import io
import json
import re
from pathlib import Path
from typing import Any, Optional

import pytest

from hfl_bench.config import RunConfig, config_hash
from hfl_bench.record.check import problems as record_problems
from hfl_bench.recording import SCHEMA_VERSION
from hfl_bench.results.setting import PEER_DATA_REASON

from helpers import invoke_cli

FREE = "data-free, heterogeneous pool, protocol budget"
ONE_ARCH = "data-free, single architecture, protocol budget"
UNLABELLED = "unlabelled public set, heterogeneous pool, protocol budget"
LABELLED = "labelled public set, heterogeneous pool, protocol budget"
PRESET = "data-free, heterogeneous pool, preset paper"
PEERS = "data-free, heterogeneous pool, protocol budget, models trained on peers' data"
HETEROGENEOUS = ["mlp_small", "cnn_small", "resnet_tiny", "mlp_small"]


def record(method: str, acc: float, *, seed: int = 0, pool: str = "cpu", assignment: Optional[list] = None,
           transfer: Optional[str] = None, single: Optional[bool] = None, preset: Optional[str] = None,
           peer_data: Optional[bool] = None, predictor: Optional[str] = None, hparams: Optional[dict] = None,
           old: bool = False, **config: Any) -> dict:
    """One valid record of ``method`` on digits (4 clients, 2 rounds, a 200-sample public hold-out,
    so that every method here shares one protocol but for its setting section). ``old``: a 1.2
    record, whose method section states neither transfer data nor single-architecture need."""
    cfg = dataclasses.asdict(RunConfig(method=method, task="digits", pool=pool, partition="dirichlet", alpha=0.3,
                                       clients=4, rounds=2, seed=seed, public_size=200, **config))
    chash = config_hash(cfg)
    section: dict[str, Any] = {"name": method, "fidelity": "paper", "version": "1.0", "hparams": hparams or {}}
    if not old:
        section |= {k: v for k, v in (("transfer", transfer), ("single_architecture", single), ("preset", preset),
                                      ("peer_data", peer_data), ("predictor", predictor)) if v is not None}
    r = {
        # a record that states neither peer data nor predictor was written as 1.6
        "schema_version": "1.2" if old else SCHEMA_VERSION if peer_data is not None else "1.6",
        "record_id": hashlib.sha256(f"{chash}|{seed}|reproduced".encode()).hexdigest()[:16],
        "source": {"kind": "reproduced", "citation": None},
        "status": "ok", "error": None, "method": section,
        "task": {"name": "digits", "version": "1", "num_classes": 10, "n_train": 1000, "n_test": 200},
        "arch_pool": {"name": pool, "assignment": HETEROGENEOUS if assignment is None else assignment},
        "partition": {"scheme": "dirichlet", "params": {"alpha": 0.3}, "seed": seed, "hash": f"p{seed}",
                      "heldout_fraction": 0.2, "public_size": 200},
        "federation": {"n_clients": 4, "clients_per_round": 4, "rounds": 2, "local_epochs": 1, "topology": "p2p"},
        "selection": {"rule": "best_mean_local_val", "round": 2},
        "metrics": {"unit": "percent", "global_acc": acc, "local_acc": 80.0, "mean_val_acc": 85.0,
                    "per_arch_global_acc": {"mlp_small": acc}},
        "history": [{"round": r, "global_acc": acc - 10 * (2 - r), "local_acc": 80.0, "mean_val_acc": 85.0}
                    for r in (1, 2)],
        "cost": {"bytes_sent_per_client_per_round": 1000.0},
        "config": cfg, "config_hash": chash, "date": "2026-01-01T00:00:00+00:00",
    }
    assert record_problems(r) == [], record_problems(r)
    return r


def write(folder: Path, *rs: dict) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for r in rs:
        name = f"{r['method']['name']}__{r['config_hash']}__seed{r['config']['seed']}.json"
        (folder / name).write_text(json.dumps(r))
    return folder


@pytest.fixture(scope="module")
def mixed(tmp_path_factory) -> Path:
    """fedavg on cpu-cnn (the best figure, on one architecture); local and crad on cpu (data-free);
    fedmd on the labelled public set; fedcc and msfkd on the unlabelled one; crad again under a
    named preset (another learning rate: its own config). fedavg's, fedmd's and local's records are
    written as before 1.6 (no transfer data in the method section): the registered card says it."""
    return write(tmp_path_factory.mktemp("settings") / "runs",
                 record("fedavg", 99.0, pool="cpu-cnn", assignment=["cnn_small"] * 4, old=True),
                 record("local", 60.0, old=True),
                 record("crad", 70.0, transfer="none", single=False),
                 record("fedmd", 95.0, old=True),
                 record("fedcc", 65.0, transfer="public-unlabelled", single=False),
                 record("msfkd", 75.0, transfer="public-unlabelled", single=False),
                 record("crad", 90.0, transfer="none", single=False, preset="paper", lr=0.01))


def show(*args: str) -> str:
    result, stdout, _ = invoke_cli("leaderboard", "show", *args)
    assert result.exit_code == 0, result.output
    return stdout


def test_json_puts_each_group_in_its_section(mixed):
    board = json.loads(show(str(mixed), "--format", "json"))
    assert board["sections"] == [FREE, PRESET, ONE_ARCH, UNLABELLED, LABELLED]  # the data-free, heterogeneous one first
    sections = {(g["method"], g["section"]) for g in board["groups"]}
    assert sections == {("local", FREE), ("crad", FREE), ("crad", PRESET), ("fedavg", ONE_ARCH), ("fedcc", UNLABELLED),
                        ("msfkd", UNLABELLED), ("fedmd", LABELLED)}
    fedavg = next(g for g in board["groups"] if g["method"] == "fedavg")
    assert (fedavg["transfer"], fedavg["single_architecture"], fedavg["budget"]) == ("none", True, "protocol")
    preset = next(g for g in board["groups"] if g["section"] == PRESET)
    assert preset["budget"] == "paper"
    # the groups come one section after another, in the sections' order
    order = [g["section"] for g in board["groups"]]
    assert order == sorted(order, key=board["sections"].index)


def test_rank_ranks_only_within_a_section(mixed):
    ranked = json.loads(show(str(mixed), "--rank", "--format", "json"))["rank"]
    by = {(r["section"], r["method"]): r for r in ranked}
    # fedavg (99) on one architecture, fedmd (95) on the labelled set and the preset crad (90) have no
    # rival in their sections: never ranked, so local (60) and crad (70) compete alone, as do fedcc and msfkd
    assert set(by) == {(FREE, "crad"), (FREE, "local"), (UNLABELLED, "msfkd"), (UNLABELLED, "fedcc")}
    assert by[(FREE, "crad")]["mean_rank"] == 1.0 and by[(FREE, "local")]["mean_rank"] == 2.0
    assert by[(UNLABELLED, "msfkd")]["mean_rank"] == 1.0 and by[(UNLABELLED, "fedcc")]["mean_rank"] == 2.0
    assert all(x["n_methods"] == 2 for r in ranked for x in r["ranks"])
    assert [r["section"] for r in ranked] == [FREE, FREE, UNLABELLED, UNLABELLED]
    rows = list(csv.DictReader(io.StringIO(show(str(mixed), "--rank", "--format", "csv"))))
    assert [(r["section"], r["method"]) for r in rows] == [(FREE, "crad"), (FREE, "local"), (UNLABELLED, "msfkd"),
                                                          (UNLABELLED, "fedcc")]
    markdown = show(str(mixed), "--rank", "--format", "markdown")
    assert re.findall(r"^\*\*Setting: (.*)\*\*$", markdown, re.M) == [FREE, UNLABELLED]
    assert "| 1 | crad |" in markdown and "| 1 | msfkd |" in markdown  # numbered within each section
    table = show(str(mixed), "--rank")
    assert table.index(f"setting: {FREE}") < table.index("crad") < table.index(f"setting: {UNLABELLED}")
    ranking, unranked = table.split("not ranked:", 1)
    assert ranking.index(f"setting: {UNLABELLED}") < ranking.index("msfkd") and "fedavg" not in ranking
    # a method alone in its section is listed after the rankings, with the section
    assert f"fedavg, alone in setting: {ONE_ARCH}" in " ".join(unranked.split())


def test_table_markdown_and_csv_show_one_section_at_a_time(mixed):
    markdown = show(str(mixed), "--format", "markdown")
    parts = re.split(r"^\*\*Setting: (.*)\*\*$", markdown, flags=re.M)[1:]
    tables = dict(zip(parts[::2], parts[1::2]))
    assert list(tables) == [FREE, PRESET, ONE_ARCH, UNLABELLED, LABELLED]
    methods = {label: re.findall(r"^\| ([a-z-]+) \|", text, re.M)[1:] for label, text in tables.items()}  # minus header
    assert methods == {FREE: ["crad", "local"], PRESET: ["crad"], ONE_ARCH: ["fedavg"], UNLABELLED: ["msfkd", "fedcc"],
                       LABELLED: ["fedmd"]}
    table = " ".join(show(str(mixed)).split())  # a title wraps at its table's width
    titles = [table.index(f"setting: {label}") for label in tables]
    assert titles == sorted(titles)  # one terminal table per section, in order
    assert titles[0] < table.index("│ local") < titles[1] < table.index("fedavg") < titles[3] < table.index("fedmd")
    rows = {(r["method"], r["budget"]): r for r in csv.DictReader(io.StringIO(show(str(mixed), "--format", "csv")))}
    fedavg = rows[("fedavg", "protocol")]
    assert fedavg["section"] == ONE_ARCH and fedavg["single_architecture"] == "True"
    assert rows[("fedmd", "protocol")]["transfer"] == "public-labelled" and rows[("crad", "paper")]["section"] == PRESET


def test_html_site_has_one_section_per_setting(mixed, tmp_path):
    out = tmp_path / "site"
    result, _, _ = invoke_cli("leaderboard", "html", str(out), str(mixed))
    assert result.exit_code == 0, result.output
    index = (out / "index.html").read_text()
    headings = re.findall(r'<h2 class="setting">Setting: (.*)</h2>', index)
    assert headings == [FREE, PRESET, ONE_ARCH, UNLABELLED, LABELLED]
    assert 'id="filter-setting"' in index and f'data-setting="{LABELLED}" data-method="fedmd"' in index
    # each protocol table holds the groups of its setting only
    for section in re.findall(r'<section class="protocol" data-setting="([^"]*)">(.*?)</section>', index, re.S):
        label, body = section
        assert set(re.findall(r'data-setting="([^"]*)"', body)) == {label}
    rank = index[index.index('id="rank"'):index.index('id="plots"')]
    assert re.findall(r"<h3>Setting: (.*)</h3>", rank) == [FREE, UNLABELLED]
    ranking, unranked = rank.split("not ranked:", 1)
    assert "fedavg" not in ranking and "fedmd" not in ranking  # alone in their sections: listed after
    assert f"not ranked: fedavg, alone in setting: {ONE_ARCH}" in "not ranked:" + unranked
    pages = "".join(p.read_text() for p in (out / "groups").glob("*.html"))
    assert "setting section" in pages and ONE_ARCH in pages and LABELLED in pages  # each group page says its section


def test_plots_draw_one_figure_per_section(mixed, tmp_path):
    result, stdout, _ = invoke_cli("plot", "curves", str(mixed), "--out", str(tmp_path / "plots"), "--json")
    assert result.exit_code == 0, result.output
    written = json.loads(stdout)["written"]
    by_section = {w["section"]: w for w in written}
    assert set(by_section) == {FREE, PRESET, ONE_ARCH, UNLABELLED, LABELLED}
    assert Path(by_section[FREE]["png"]).name == "curves__digits.png"  # the default section keeps its name
    assert len({Path(w["png"]).name for w in written}) == 5
    for label, w in by_section.items():
        sidecar = json.loads(Path(w["sources"]).read_text())
        assert sidecar["section"] == label
    methods = {label: sorted(g["method"] for g in json.loads(Path(w["sources"]).read_text())["groups"])
               for label, w in by_section.items()}
    assert methods[FREE] == ["crad", "local"] and methods[ONE_ARCH] == ["fedavg"] and methods[LABELLED] == ["fedmd"]


def test_what_a_record_says_wins_over_the_registry(tmp_path):
    """A record's own transfer data and pool assignment win; an old record without them reads the
    registered card (transfer) and pool (architectures); a name nothing knows is "unknown"."""
    no_pool = record("fedavg", 50.0, pool="cpu-cnn", old=True, seed=1)
    del no_pool["arch_pool"]  # the registered cpu-cnn pool: one architecture
    folder = write(tmp_path / "runs",
                   record("local", 50.0, transfer="synthetic"),  # says synthetic: believed, whatever the card says
                   record("fedmd", 50.0, assignment=["cnn_small"] * 4, old=True),  # one architecture, as assigned
                   no_pool,
                   record("not-a-method", 50.0, old=True))
    board = json.loads(show(str(folder), "--format", "json"))
    sections = {g["method"]: g["section"] for g in board["groups"]}
    assert sections == {"local": "synthetic data, heterogeneous pool, protocol budget",
                        "fedmd": "labelled public set, single architecture, protocol budget",
                        "fedavg": ONE_ARCH,
                        "not-a-method": "unknown transfer, heterogeneous pool, protocol budget"}
    ranked = json.loads(show(str(folder), "--rank", "--format", "json"))["rank"]
    assert ranked == []  # four settings, one method each: nothing to rank


def test_a_new_record_states_its_setting():
    """The record writer copies the card's transfer data and single-architecture need (schema 1.6),
    its peer data and predictor (schema 1.7)."""
    from hfl_bench.method_api import get_method_class
    from hfl_bench.recording import build_failed_record, card_setting

    for method in ("fedavg", "fedmd", "fedcc", "crad"):
        card = get_method_class(method).card
        assert card_setting(card, card.predictor) == {
            "transfer": card.transfer, "single_architecture": card.single_architecture,
            "peer_data": card.peer_data, "predictor": card.predictor}
    failed = build_failed_record(RunConfig(method="fedmd", task="digits"), "boom")
    assert failed["schema_version"] == "1.11"
    assert (failed["method"]["transfer"], failed["method"]["single_architecture"]) == ("public-labelled", False)
    assert record_problems(failed) == []


@pytest.mark.slow  # reads every committed record (about 2,000)
def test_the_committed_records_still_show():
    out = show("--format", "json")
    board = json.loads(out)
    assert board["groups"] and all(g["section"] in board["sections"] for g in board["groups"])
    fedavg = {g["section"] for g in board["groups"] if g["method"] == "fedavg"}
    assert fedavg == {ONE_ARCH}
    assert show("--rank")


@pytest.fixture(scope="module")
def regimes(tmp_path_factory) -> Path:
    """One protocol, two regimes: crad and local (knowledge only) and dfml (models trained on peers'
    data), twice: a 1.7 record that states it (eval=current: the live model) and a 1.6 one that does
    not (its registered card says it, and its hyperparameters the predictor: the stored snapshot)."""
    return write(tmp_path_factory.mktemp("regimes") / "runs",
                 record("crad", 70.0, transfer="none", single=False, peer_data=False, predictor="live model"),
                 record("local", 60.0, transfer="none", single=False),
                 record("dfml", 95.0, transfer="none", single=False, peer_data=True, predictor="live model",
                        hparams={"eval": "current"}, method_params={"eval": "current"}),
                 record("dfml", 94.0, transfer="none", single=False, hparams={"eval": "peak"}))


def test_models_trained_on_peers_data_are_a_section_of_their_own(regimes):
    board = json.loads(show(str(regimes), "--format", "json"))
    assert board["sections"] == [FREE, PEERS]  # right after the same section without peer data
    sections = {(g["method"], g["predictor"]): (g["section"], g["peer_data"]) for g in board["groups"]}
    assert sections == {("crad", "live model"): (FREE, False), ("local", "live model"): (FREE, False),
                        ("dfml", "live model"): (PEERS, True), ("dfml", "stored snapshot"): (PEERS, True)}
    assert board["section_reasons"] == {PEERS: [PEER_DATA_REASON]}
    rank = json.loads(show(str(regimes), "--rank", "--format", "json"))
    assert [(r["section"], r["method"]) for r in rank["rank"]] == [(FREE, "crad"), (FREE, "local")]
    assert rank["unranked"] == [{"section": PEERS, "method": "dfml", "n_protocols": 1}]  # alone: no rival
    assert rank["section_reasons"] == {PEERS: [PEER_DATA_REASON]}


def test_every_view_shows_the_predictor_and_why_a_peer_data_section_stands_apart(regimes, tmp_path):
    markdown = show(str(regimes), "--format", "markdown")
    assert re.findall(r"^\*\*Setting: (.*)\*\*$", markdown, re.M) == [FREE, PEERS]
    assert markdown.count("Why apart: ") == 1 and f"Why apart: {PEER_DATA_REASON}" in markdown.split(PEERS)[1]
    # what every row of a section shares is said once above its table; the predictor differs between dfml's groups
    assert "Same in every row: version 1.0, predictor live model, task digits," in markdown.split(PEERS)[0]
    assert re.search(r"^\| dfml \| stored snapshot \|", markdown.split(PEERS)[1], re.M)
    rows = list(csv.DictReader(io.StringIO(show(str(regimes), "--format", "csv"))))
    assert {(r["method"], r["predictor"], r["peer_data"]) for r in rows} == {
        ("crad", "live model", "False"), ("local", "live model", "False"), ("dfml", "live model", "True"),
        ("dfml", "stored snapshot", "True")}
    table = " ".join(show(str(regimes)).split())
    assert "predictor" in table and "stored snapshot" in table
    assert f"setting: {PEERS}; each client's model travels" in table
    rank = " ".join(show(str(regimes), "--rank").split())
    assert f"not ranked: dfml, alone in setting: {PEERS}; {PEER_DATA_REASON}" in rank
    result, _, _ = invoke_cli("leaderboard", "html", str(tmp_path / "site"), str(regimes))
    assert result.exit_code == 0, result.output
    index = (tmp_path / "site" / "index.html").read_text()
    assert re.findall(r'<h2 class="setting">Setting: (.*)</h2>', index) == [FREE, PEERS.replace("'", "&#39;")]
    assert index.count('<p class="note reason">') == 1 and "<td>stored snapshot</td>" in index
    assert '<p class="note">not ranked: dfml, alone in setting: data-free' in index


def test_compare_keeps_peer_data_out_of_the_knowledge_only_family(regimes):
    """``compare`` pairs only within a section: dfml is not in local's Holm family."""
    result, stdout, _ = invoke_cli("leaderboard", "compare", str(regimes), "--against", "local", "--format", "json")
    assert result.exit_code == 0, result.output
    compared = {(t["section"], c["a_method"]) for t in json.loads(stdout)["tables"] for c in t["comparisons"]}
    assert compared == {(FREE, "crad")}
    result, _, stderr = invoke_cli("leaderboard", "compare", str(regimes), "-m", "dfml", "--against", "crad")
    refusal = " ".join((stderr or result.output).split())
    assert result.exit_code != 0 and "different setting sections" in refusal and PEER_DATA_REASON in refusal


QUICK_RUN = ("--task", "digits", "--clients", "4", "--rounds", "2", "--local-epochs", "1", "--batch-size", "64",
             "--lr", "0.01", "--set", "period=2")


def test_a_run_record_states_peer_data_and_its_predictor(run_record, tmp_path):
    """A real run's record (schema 1.7) copies the card's peer data and asks the method which
    predictor it evaluated: DFML's peak snapshot by default, its live model with eval=current."""
    peak = run_record("--method", "dfml", *QUICK_RUN, out=tmp_path / "peak")
    current = run_record("--method", "dfml", *QUICK_RUN, "--set", "eval=current", out=tmp_path / "current")
    for r, predictor in ((peak, "stored snapshot"), (current, "live model")):
        assert r["schema_version"] == "1.11" and record_problems(r) == []
        assert (r["method"]["peer_data"], r["method"]["predictor"]) == (True, predictor)
    board = json.loads(show(str(tmp_path / "peak"), str(tmp_path / "current"), "--format", "json"))
    assert {(g["section"], g["predictor"]) for g in board["groups"]} == {(PEERS, "stored snapshot"),
                                                                         (PEERS, "live model")}


def test_committed_records_before_1_7_read_their_regime_from_the_card():
    """The committed digits records (schema 1.6) state neither peer data nor predictor: the upgrade
    fills them from the frozen table of built-in cards, DFML's predictor at the record's own
    hyperparameters, and the readers read them from the upgraded record."""
    from hfl_bench.record.upgrade import upgrade
    from hfl_bench.results.setting import peer_data_setting, predictor_setting

    folder = Path(__file__).resolve().parent.parent / "leaderboards" / "reproduced" / "digits"
    for method, peers, predictor in (("dfml", True, "stored snapshot"), ("crad", False, "live model"),
                                     ("fedproto", False, "prototype classifier")):
        r = json.loads(next(folder.glob(f"digits__{method}__*__seed0.json")).read_text())
        assert r["schema_version"] == "1.6" and not {"peer_data", "predictor"} & set(r["method"])
        assert (peer_data_setting(upgrade(r)), predictor_setting(upgrade(r))) == (peers, predictor)
    current = json.loads(next(folder.glob("digits__dfml__*__seed0.json")).read_text())
    current["method"]["hparams"]["eval"] = "current"  # what a 1.6 record of the control holds
    assert predictor_setting(upgrade(current)) == "live model"
