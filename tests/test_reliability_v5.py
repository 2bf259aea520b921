"""Reliability v5 (issue 63), the cases fixed so far: each through the real CLI or API, each
failing on the code before its fix."""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path

import pytest
import torch
import yaml

import hfl_bench
from hfl_bench.config import ConfigError

from helpers import REAL_RECORD, invoke_cli

# ----------------------------------------------------------------------------- 7: numbers out of range


@pytest.mark.parametrize("digits, says", [(400, "lr: 1000"), (5000, "holds a number too long to read")])
def test_a_yaml_integer_too_large_is_one_line_exit_2(tmp_path, digits, says):
    config = tmp_path / "run.yaml"
    config.write_text("lr: 1" + "0" * digits + "\n")
    result, out, err = invoke_cli("run", "--method", "local", "--task", "digits", "--rounds", "1",
                                  "--config", str(config), "--out", str(tmp_path / "runs"))
    text = (err or out).strip()
    assert result.exit_code == 2, text
    assert says in text and len(text.splitlines()) == 1 and "Traceback" not in text
    assert not (tmp_path / "runs").exists() or not list((tmp_path / "runs").glob("*.json"))


def test_the_api_refuses_a_float_setting_too_large_with_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="too large"):
        hfl_bench.run(method="local", task="digits", rounds=1, lr=10**400, out=str(tmp_path / "runs"))


def test_a_hyperparameter_too_large_for_a_float_is_a_config_error():
    from hfl_bench.config import canonical_params
    from hfl_bench.registry import METHODS

    with pytest.raises(ConfigError, match="crad: lam: 1000"):
        canonical_params(METHODS.get("crad").Params, {"lam": 10**400}, "crad")


# ----------------------------------------------------------------------------- 8: a records folder that loops


def test_a_claims_records_folder_in_a_link_loop_is_one_line_exit_2(tmp_path):
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    path = tmp_path / "claims.yaml"
    side = {"records": "loop", "a": {"method": "crad"}, "b": {"method": "local"}}
    path.write_text(yaml.safe_dump({"claims": [{"id": "c1", "paper": "CRAD", "claim": "x", "figures": "y",
                                                "setting": "proxy", "differs": "d", "paper_figure": "final",
                                                "needs": "z", "test": "t", "comparisons": [side]}]}))
    result, out, err = invoke_cli("leaderboard", "claims", str(path))
    text = (err or out).strip()
    assert result.exit_code == 2, text
    assert "records folder 'loop' cannot be followed" in text and len(text.splitlines()) == 1


# ----------------------------------------------------------------------------- 9: a folder named trackers


def _record(seed: int) -> dict:
    r = json.loads(REAL_RECORD.read_text())
    r["config"]["seed"] = seed
    r["seeds"] = {k: seed for k in r["seeds"]}
    r["record_id"] = f"{r['config_hash']}-{seed}"
    return r


def test_records_in_a_folder_named_trackers_are_read_and_only_the_trackers_output_is_left_out(tmp_path):
    study = tmp_path / "study" / "trackers"  # --out study/trackers: a record folder like any
    study.mkdir(parents=True)
    for seed in (0, 1):
        (study / f"r{seed}.json").write_text(json.dumps(_record(seed)))
    copy = tmp_path / "study" / "trackers" / "trackers" / "tensorboard" / "run"  # a tracker's copy of a record
    copy.mkdir(parents=True)
    shutil.copy(study / "r0.json", copy / "record.json")
    result, out, _ = invoke_cli("leaderboard", "show", str(tmp_path / "study"), "--format", "json")
    assert result.exit_code == 0, out
    [group] = json.loads(out)["groups"]
    assert group["seeds"] == [0, 1]  # both records, and the tracker's copy not counted as a third file
    result, out, _ = invoke_cli("leaderboard", "validate", str(tmp_path / "study"), "--json")
    assert json.loads(out)["checked"] == 2
    assert Path(copy / "record.json").is_file()


# ----------------------------------------------------------------------------- 6: settings the optimizer ignores


@pytest.mark.parametrize("setting, value", [("momentum", 0.5), ("weight_decay", 0)])
def test_a_setting_adam_ignores_is_refused_in_one_line_exit_2(tmp_path, setting, value):
    config = tmp_path / "run.yaml"
    config.write_text(f"{setting}: {value}\n")
    result, out, err = invoke_cli("run", "--method", "local", "--task", "digits", "--rounds", "1", "--clients", "3",
                                  "--optimizer", "adam", "--lr", "0.001", "--config", str(config),
                                  "--out", str(tmp_path / "runs"))
    text = (err or out).strip()
    assert result.exit_code == 2, text
    assert f"{setting} {value} is set, but --optimizer adam does not use it" in text
    assert len(text.splitlines()) == 1 and "Traceback" not in text
    assert not list(tmp_path.rglob("*.json"))  # refused before any training: no record
    with pytest.raises(ConfigError, match=f"{setting} {value} is set"):
        hfl_bench.run(method="local", task="digits", rounds=1, optimizer="adam", lr=0.001, out=str(tmp_path / "api"),
                      **{setting: value})


def test_an_optimizers_ignored_setting_at_its_default_is_one_run_with_one_hash():
    from hfl_bench.resolved import resolve_run

    def chash(**settings):
        return resolve_run({"method": "local", "task": "digits", "rounds": 1, **settings}).config_hash

    adam = chash(optimizer="adam", lr=0.001)
    # the task's defaults (digits: the global 0.9 and 5e-4), written out: the same run, the same hash
    assert chash(optimizer="adam", lr=0.001, momentum=0.9, weight_decay=0.0005) == adam
    # SGD reads both: another value is another run, with another hash, as before
    assert chash(lr=0.001, momentum=0.5) != chash(lr=0.001)
    assert chash(lr=0.001, weight_decay=0.0) != chash(lr=0.001)
# ----------------------------------------------------------------------------- 4: caches and data read as regular files

# A regression would wait on the FIFO for ever (or read /dev/zero until memory runs out): the
# timeout makes it a failure instead.


def _replace_with(path: Path, what: str) -> None:
    """Put a FIFO, or a symbolic link to /dev/zero, where the file ``path`` was."""
    path.unlink()
    if what == "fifo":
        os.mkfifo(path)
    else:
        path.symlink_to("/dev/zero")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("what", ["fifo", "dev-zero"])
def test_the_encoder_cache_is_a_miss_with_one_warning_when_no_regular_file(tmp_path, monkeypatch, caplog, what):
    from hfl_bench.families import pretrained

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(60, 1, 1, 12, generator=g), torch.arange(60) % 3
    first = pretrained.pretrained_encoder(x, y, "toy", (1, 1, 12), 8, 3, 5)
    path = pretrained.cache_path(first.facts["cache_key"])
    _replace_with(path, what)
    with caplog.at_level(logging.WARNING):
        again = pretrained.pretrained_encoder(x, y, "toy", (1, 1, 12), 8, 3, 5)
    assert again.facts["trained"] and torch.equal(again.encoder(x), first.encoder(x))
    warned = [r.getMessage() for r in caplog.records if "encoder cache" in r.getMessage()]
    assert len(warned) == 1 and str(path) in warned[0] and "trained again" in warned[0], warned
    assert path.is_file() and not path.is_symlink()  # replaced by a regular cache file...
    assert not pretrained.pretrained_encoder(x, y, "toy", (1, 1, 12), 8, 3, 5).facts["trained"]  # ...that loads


@pytest.mark.slow  # two FedSocket runs
@pytest.mark.timeout(300)
def test_a_fifo_at_the_encoder_cache_path_does_not_hang_a_fedsocket_run(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    args = ("run", "--method", "fedsocket", "--task", "digits", "--clients", "4", "--rounds", "1",
            "--pretrain-size", "100", "--set", "pretrain_steps=20", "--set", "warmup_epochs=0", "-q", "--json")
    result, out, _ = invoke_cli(*args, "--out", str(tmp_path / "a"))
    assert result.exit_code == 0, out
    bank = json.loads(Path(json.loads(out)["record"]).read_text())["method"]["run_details"]["feature_bank"]
    [facts] = bank["modalities"].values()
    from hfl_bench.families import pretrained

    _replace_with(pretrained.cache_path(facts["cache_key"]), "fifo")
    result, out, _ = invoke_cli(*args, "--out", str(tmp_path / "b"))
    assert result.exit_code == 0, out
    record = json.loads(Path(json.loads(out)["record"]).read_text())
    [again] = record["method"]["run_details"]["feature_bank"]["modalities"].values()
    assert record["status"] == "ok" and again["trained"] and again["cache_key"] == facts["cache_key"]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("what", ["fifo", "dev-zero"])
def test_the_fingerprint_and_decode_caches_of_a_data_folder_are_misses_when_no_regular_file(
        tmp_path, caplog, what):
    from hfl_bench.data import FINGERPRINT_CACHE, get_task

    from test_imagefolder import write_folder

    write_folder(tmp_path)
    for image in tmp_path.rglob("*.png"):  # written long ago: their hashes are cached (not "racy")
        os.utime(image, ns=(10**18, 10**18))
    first = get_task("imagefolder").load(tmp_path)
    [decoded] = (tmp_path / ".hfl-bench-cache").iterdir()
    fingerprints = tmp_path / FINGERPRINT_CACHE
    assert fingerprints.is_file()
    _replace_with(decoded, what)
    _replace_with(fingerprints, what)
    with caplog.at_level(logging.WARNING):
        second = get_task("imagefolder").load(tmp_path)
    assert torch.equal(second.train_x, first.train_x) and second.fingerprint == first.fingerprint
    for cache in ("fingerprint cache", "decode cache"):
        assert len([r for r in caplog.records if cache in r.getMessage()]) == 1, cache
    for cache in (decoded, fingerprints):  # decoded or hashed again, and rewritten
        assert cache.is_file() and not cache.is_symlink()


@pytest.mark.timeout(60)
def test_a_fifo_at_the_mnist1d_cache_is_a_miss_with_one_warning(tmp_path, caplog):
    from hfl_bench.data import get_task

    cache = tmp_path / "mnist1d" / "mnist1d-42.npz"
    cache.parent.mkdir()
    os.mkfifo(cache)
    with caplog.at_level(logging.WARNING):
        data = get_task("mnist1d").load(tmp_path)
    assert len(data.train_x) == 4000
    assert len([r for r in caplog.records if "mnist1d cache" in r.getMessage()]) == 1
    assert cache.is_file()  # generated again and written in its place


@pytest.mark.timeout(60)
def test_a_fifo_as_a_data_file_is_one_line_exit_2(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    os.mkfifo(data / "pathmnist.npz")
    result, out, err = invoke_cli("run", "--method", "local", "--task", "pathmnist", "--data-dir", str(data),
                                  "--rounds", "1", "-q", "--out", str(tmp_path / "runs"))
    text = (err or out).strip()
    assert result.exit_code == 2 and len(text.splitlines()) == 1 and "Traceback" not in text, text
    assert "pathmnist.npz" in text


@pytest.mark.timeout(60)
def test_a_fifo_at_the_metadata_index_is_a_miss_and_is_replaced(tmp_path, monkeypatch):
    from hfl_bench import metadata_index

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    path = metadata_index.index_path()
    path.parent.mkdir(parents=True)
    os.mkfifo(path)
    assert metadata_index.read("some key") is None
    assert metadata_index.write("some key", {"x": 1}) and metadata_index.read("some key") == {"x": 1}


# ----------------------------------------------------------------------------- 5: an endpoint a suite adds


def test_a_suite_that_adds_ensemble_runs_its_finished_cells_again_for_the_endpoint(tmp_path):
    from hfl_bench.testing import QUICK

    out = tmp_path / "records"
    suite = {"methods": ["local"], "tasks": ["digits"], "seeds": [0], "out": str(out),
             "settings": {"rounds": 1, "clients": 4, **QUICK}}
    path = tmp_path / "suite.yaml"

    def matrix(*extra: str) -> dict:
        path.write_text(yaml.safe_dump(suite))
        result, stdout, _ = invoke_cli("matrix", str(path), "--json", *extra)
        assert result.exit_code == 0, stdout
        [cell] = json.loads(stdout)["cells"]
        return cell

    first = matrix()
    assert first["status"] == "ok"
    record_file = Path(first["record"])
    assert "ensemble" not in (json.loads(record_file.read_text())["metrics"].get("extra_endpoints") or {})
    suite["settings"]["ensemble"] = True  # outside the config hash: the same record file
    assert matrix("--dry-run")["status"] == "would run"
    second = matrix()
    assert second["status"] == "ok" and Path(second["record"]) == record_file
    record = json.loads(record_file.read_text())
    assert record["config"]["ensemble"] is True and "ensemble" in record["metrics"]["extra_endpoints"]
    assert sorted(p.name for p in out.glob("*.json")) == [record_file.name]  # replaced, not beside it
    assert matrix()["status"] == "skipped"  # now done
