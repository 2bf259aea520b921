"""Checkpoints trusted only as far as they should be (issue 47): a checkpoint of another method
version, a checkpoint write that fails for any reason, temporary files a killed write leaves, a
checkpoint path that is not a regular file, and a checkpoint that cannot be removed after the
record is written. Each through the real writer, reader and CLI."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from hfl_bench import checkpoint, engine, paths
from hfl_bench.config import RunConfig
from hfl_bench.matrix.cells import run_cell
from hfl_bench.methods import crad as crad_module
from hfl_bench.testing import QUICK

from helpers import invoke_cli

CLI_QUICK = ["--local-epochs", "1", "--batch-size", "64", "--lr", "0.01", "--heldout-fraction", "0.2"]


def crad_args(rounds: int = 3) -> list[str]:
    return ["--method", "crad", "--task", "digits", "--clients", "3", "--rounds", str(rounds), "--seed", "0",
            "--checkpoint-every", "1", *CLI_QUICK]


def crad_config(out: Path, rounds: int = 3) -> RunConfig:
    return engine.load_task(RunConfig(method="crad", task="digits", clients=3, rounds=rounds, seed=0,
                                      checkpoint_every=1, out=str(out), **QUICK))[1]


def interrupted_after_round_1(cfg: RunConfig) -> Path:
    """Run ``cfg`` through the real engine and interrupt it (Ctrl-C) once round 1 is reported:
    its round-1 checkpoint is written by then."""
    def stop(rnd, total, entry):
        if rnd == 1:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        engine.run(cfg, progress=stop)
    path = paths.checkpoint_path(cfg)
    assert checkpoint.read(path)["round"] == 1
    return path


def bump_crad_version(monkeypatch, version: str = "9.9") -> None:
    """What editing the version in the peer-KD family's shared card function (``peer_kd_card``)
    does to crad: a new card, with the new version, on the class."""
    card = crad_module.peer_kd_card("crad", "paper", crad_module.CRAD.card.summary,
                                    crad_module.CRAD.card.notes[len(crad_module.COMMON_NOTES):])
    assert card == crad_module.CRAD.card  # the shared function builds crad's card as registered
    monkeypatch.setattr(crad_module.CRAD, "card", dataclasses.replace(card, version=version))


# ----------------------------------------------------------------------------- #15 another method version


def test_a_checkpoint_of_another_method_version_is_refused_by_run_resume(tmp_path, monkeypatch):
    cfg = crad_config(tmp_path)
    path = interrupted_after_round_1(cfg)
    assert checkpoint.read(path)["versions"]["method"] == "1.0"  # the card's version, not None
    bump_crad_version(monkeypatch)
    result, _, _ = invoke_cli("run", *crad_args(), "--out", str(tmp_path), "--resume", "-q")
    text = " ".join(result.output.split())
    assert result.exit_code == 2, result.output
    assert "method version '1.0'" in text and "'9.9'" in text and "Traceback" not in result.output
    assert not list(tmp_path.glob("*.json"))  # nothing computed by the old code under the new version


def test_a_matrix_cell_starts_over_from_a_checkpoint_of_another_method_version(tmp_path, monkeypatch):
    cfg = crad_config(tmp_path)
    path = interrupted_after_round_1(cfg)
    bump_crad_version(monkeypatch)
    record = run_cell(cfg)
    assert record["status"] == "ok", record.get("error")
    assert record["method"]["version"] == "9.9"
    assert "resumed_from_rounds" not in record["federation"]  # started over, not continued
    assert not path.exists()
