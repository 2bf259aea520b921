"""Reliability v5 (issue 63), the cases fixed so far: each through the real CLI or API, each
failing on the code before its fix."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
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
