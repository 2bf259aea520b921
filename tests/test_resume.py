"""Resumable runs: a run resumed from a checkpoint ends with the same record as an uninterrupted one."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn
from typer.testing import CliRunner

from hfl_bench import checkpoint, engine, paths
from hfl_bench import recording as records
from hfl_bench.cli import app
from hfl_bench.config import EVAL_EVERY, RunConfig
from hfl_bench.method_api import Method, MethodCard
from hfl_bench.testing import builtin_methods, smoke_config


def config(method: str, out: Path, **overrides) -> RunConfig:
    """A resolved 4-client, 3-round digits config with a checkpoint every 2 rounds, with the card's
    smoke settings (they make a method's state show up within a few rounds, e.g. dfml's period 2:
    alpha peaks at rounds 2 and 4, so peak models are in the checkpoint)."""
    values = dict(method=method, task="digits", clients=4, rounds=3, seed=0, checkpoint_every=2, out=str(out),
                  **smoke_config(method))
    values.update(overrides)
    return engine.load_task(RunConfig(**values))[1]


def timeless(history: list[dict]) -> list[dict]:
    return [{k: v for k, v in entry.items() if k not in ("seconds", "phases")} for entry in history]


# Where a feature bank's encoder came from (trained by this run, or loaded from the cache a run
# before it filled) and what training it took: provenance, like timing, not what the run computes.
CACHE_PROVENANCE = ("trained", "pretrain_steps", "pretrain_seconds")


def without_cache_provenance(method: dict) -> dict:
    bank = (method.get("run_details") or {}).get("feature_bank")
    if not bank:
        return method
    modalities = {m: {k: v for k, v in entry.items() if k not in CACHE_PROVENANCE}
                  for m, entry in bank["modalities"].items()}
    return {**method, "run_details": {**method["run_details"], "feature_bank": {**bank, "modalities": modalities}}}


def assert_same_run(a: dict, b: dict) -> None:
    """Everything a run computes is equal; only timing, dates, the resume note and where a feature
    bank's encoders came from (``CACHE_PROVENANCE``) may differ."""
    for key in ("status", "metrics", "selection", "partition", "arch_pool", "config_hash"):
        assert a[key] == b[key], key
    assert without_cache_provenance(a["method"]) == without_cache_provenance(b["method"])
    assert timeless(a["history"]) == timeless(b["history"])
    for key in ("bytes_total", "bytes_sent_per_client_per_round", "budget"):  # the work meter resumes too
        assert a["cost"][key] == b["cost"][key], key
    # and so do its forward-only counts (a checkpoint holds them): the same inference FLOPs
    assert (a["cost"].get("flops") or {}).get("inference") == (b["cost"].get("flops") or {}).get("inference")
    strip = lambda f: {k: v for k, v in f.items() if k != "resumed_from_rounds"}  # noqa: E731
    assert strip(a["federation"]) == strip(b["federation"])


# ----------------------------------------------------------------------------- every method


@pytest.mark.slow  # every method through real training
@pytest.mark.parametrize("method", builtin_methods())  # an installed plugin is its own concern
def test_resumed_run_equals_uninterrupted_run(method, tmp_path):
    cfg = config(method, tmp_path, local_epochs=2)  # two epochs: a multi-epoch plan, at less than digits' five
    full = records.build_record(cfg, engine.run(cfg))
    # The run checkpointed after round 2 (not after round 3, its last): the file is what a crash
    # in round 3 would have left behind. A fresh simulation resumes from it.
    path = paths.checkpoint_path(cfg)
    assert checkpoint.read(path)["round"] == 2
    rounds_run = []
    resumed = engine.run(cfg, progress=lambda rnd, total, entry: rounds_run.append(rnd), resume=True)
    assert rounds_run == [3]  # it continued from the checkpoint, not from the start
    record = records.build_record(cfg, resumed)
    assert record["federation"]["resumed_from_rounds"] == [2]
    assert "resumed_from_rounds" not in full["federation"]
    assert_same_run(full, record)


def test_loading_restores_the_engine_state_and_the_rngs(tmp_path):
    """State a short run cannot show in its record (the evaluator's best validation figure, which
    only matters with --eval-every > 1; the global RNGs, which no built-in method draws from in a
    round) is restored exactly all the same."""
    cfg = config("local", tmp_path, rounds=4, eval_every=3)
    a = engine.Simulation(cfg)
    for rnd in (1, 2):
        a.step(rnd)
    a.save_checkpoint(tmp_path / "c.pt")
    expected_rng = (random.random(), np.random.rand(), torch.rand(1))
    b = engine.Simulation(cfg)
    assert b.load_checkpoint(tmp_path / "c.pt") == 2
    assert (random.random(), np.random.rand(), torch.rand(1)) == expected_rng
    ea, eb = a.evaluator, b.evaluator
    assert eb.best_val == ea.best_val > 0 and eb.global_stale == ea.global_stale
    assert np.array_equal(eb.local_correct, ea.local_correct) and np.array_equal(eb.global_correct, ea.global_correct)
    assert torch.equal(b.fed.val_correct, a.fed.val_correct)
    assert b.history == a.history and b.best.round == a.best.round
    assert np.array_equal(b.best.global_class_acc, a.best.global_class_acc)
    assert np.array_equal(np.stack(b.sent), np.stack(a.sent)) and b.fed.channel.total == a.fed.channel.total
    assert [e["global_acc"] is None for e in b.history] == [e["global_acc"] is None for e in a.history]
    assert timeless([b.step(3), b.step(4)]) == timeless([a.step(3), a.step(4)])


def test_interrupted_then_resumed_through_the_cli(tmp_path, run_record):
    """A crash in round 3 (after the round-2 checkpoint), then `hfl-bench run --resume`: the same
    record as an uninterrupted CLI run, and the checkpoint is gone once the record is written."""
    args = ["--method", "local", "--task", "digits", "--clients", "4", "--rounds", "4", "--seed", "0",
            "--checkpoint-every", "2"]
    full = run_record(*args, out=tmp_path / "full")
    cfg = config("local", tmp_path / "resumed", rounds=4)

    def crash(rnd, total, entry):
        if rnd == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        engine.run(cfg, progress=crash)
    path = paths.checkpoint_path(cfg)
    state = checkpoint.read(path)  # plain data: no code runs when it is opened
    assert state["round"] == 2 and state["config_hash"] == full["config_hash"]
    assert not paths.record_path(cfg).exists()
    resumed = run_record(*args, "--resume", out=tmp_path / "resumed")
    assert paths.record_path(cfg).is_file()
    assert resumed["federation"]["resumed_from_rounds"] == [2]
    assert_same_run(full, resumed)
    assert not path.exists()
    assert not list(path.parent.iterdir())  # no temporary files left either


def test_resume_without_a_checkpoint_starts_fresh_and_says_so(tmp_path):
    result = CliRunner().invoke(app, ["run", "--method", "local", "--clients", "3", "--rounds", "2", "--seed", "0",
                                      "--out", str(tmp_path), "--resume", "-q"])
    assert result.exit_code == 0, result.output
    assert "no checkpoint for this configuration" in result.output
    assert "starting from round 0" in result.output


# ----------------------------------------------------------------------------- a real kill


@pytest.mark.slow  # the CLI as a process, killed
def test_killed_process_resumes_to_the_same_record(tmp_path, run_record):
    """SIGKILL the CLI as soon as its first checkpoint (round 1) exists, resume it in a new process.
    Seven more rounds are left by then, which take far longer than the 10 ms between polls."""
    args = ["--method", "local", "--task", "digits", "--clients", "2", "--rounds", "8", "--local-epochs", "1",
            "--seed", "0",
            "--checkpoint-every", "1", "--json", "-q"]
    full = run_record(*args[:-2], out=tmp_path / "full")
    out = tmp_path / "killed"
    cmd = [sys.executable, "-m", "hfl_bench.cli", "run", *args, "--out", str(out)]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    checkpoints = out / ".checkpoints"
    deadline = time.monotonic() + 120
    try:
        while not list(checkpoints.glob("*.pt")):
            if proc.poll() is not None:
                pytest.fail(f"the run ended (exit {proc.returncode}) before its first checkpoint appeared, so it "
                            f"could not be killed mid-way; stderr: {proc.stderr.read().decode()[-2000:]}")
            assert time.monotonic() < deadline, "no checkpoint within 120 s"
            time.sleep(0.01)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
        proc.stderr.close()
    assert proc.returncode == -signal.SIGKILL, "the run finished before it was killed: give it more rounds"
    assert not list(out.glob("*.json")), "the killed run wrote a record"
    resumed = subprocess.run([*cmd, "--resume"], env=env, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    assert "resuming from checkpoint" in resumed.stderr
    record = json.loads(Path(json.loads(resumed.stdout)["record"]).read_text())
    assert 1 <= record["federation"]["resumed_from_rounds"][0] < 8
    assert_same_run(full, record)
    assert not list(checkpoints.glob("*.pt"))


# ----------------------------------------------------------------------------- refusals


def test_resume_with_a_different_config_is_refused(tmp_path):
    cfg = config("local", tmp_path, rounds=3)
    engine.run(cfg)  # leaves its round-2 checkpoint (no record was written)
    path = paths.checkpoint_path(cfg)
    assert path.exists()
    # eval_every is outside the config hash, so the file is found, but the run would differ
    result = CliRunner().invoke(app, ["run", "--method", "local", "--clients", "4", "--rounds", "3", "--seed", "0",
                                      "--checkpoint-every", "2", "--eval-every", "2", "--out", str(tmp_path),
                                      "--resume", "-q"])
    assert result.exit_code == 2
    assert "different configuration" in result.output and f"eval_every: {EVAL_EVERY} -> 2" in result.output
    sim = engine.Simulation(config("local", tmp_path, rounds=5))
    with pytest.raises(checkpoint.CheckpointError, match=r"rounds: 3 -> 5"):
        sim.load_checkpoint(path)
    # the same config, but written by other code
    state = checkpoint.read(path)
    state["code"]["git_sha"] = "0" * 40
    checkpoint.write(path, state)
    sim = engine.Simulation(cfg)
    if sim.code["git_sha"]:  # only known in a git checkout
        with pytest.raises(checkpoint.CheckpointError, match="written by code at commit 000000000000"):
            sim.load_checkpoint(path)


def test_unreadable_checkpoint_is_a_clear_error(tmp_path):
    cfg = config("local", tmp_path, rounds=3)
    path = paths.checkpoint_path(cfg)
    path.parent.mkdir(parents=True)
    path.write_bytes(b"not a checkpoint")
    result = CliRunner().invoke(app, ["run", "--method", "local", "--clients", "4", "--rounds", "3", "--seed", "0",
                                      "--checkpoint-every", "2", "--out", str(tmp_path), "--resume", "-q"])
    assert result.exit_code == 2
    assert "has no digest line" in " ".join(result.output.split())


RESUME_ARGS = ["run", "--method", "local", "--clients", "4", "--rounds", "3", "--seed", "0", "--checkpoint-every", "2",
               "--resume", "-q"]


@pytest.mark.parametrize("damage", ["shape", "missing-key", "clients", "data"])
def test_a_checkpoint_that_does_not_fit_is_refused_with_one_line(tmp_path, damage):
    cfg = config("local", tmp_path, rounds=3)
    engine.run(cfg)  # leaves its round-2 checkpoint
    path = paths.checkpoint_path(cfg)
    state = checkpoint.read(path)
    model = state["clients"][0]["model"]["state"]
    key = next(iter(model))
    if damage == "shape":
        model[key] = torch.zeros(3, 3, 3)
    elif damage == "missing-key":
        del model[key]
    elif damage == "clients":
        state["clients"].pop()
    else:
        state["data_fingerprint"] = "0" * 16
    checkpoint.write(path, state)
    result = CliRunner().invoke(app, [*RESUME_ARGS, "--out", str(tmp_path)])
    assert result.exit_code == 2, result.output
    text = "".join(result.output.split())  # rich wraps long lines at the runner's width
    assert "Traceback" not in result.output and "error:" in result.output
    assert path.name in text and ("otherdata" if damage == "data" else "doesnot") in text, result.output


def test_a_checkpoint_that_cannot_be_written_does_not_stop_the_run(tmp_path, monkeypatch, caplog):
    def full_disk(path, state):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(checkpoint, "write", full_disk)
    cfg = config("local", tmp_path, rounds=3)
    with caplog.at_level("WARNING", logger="hfl_bench.engine"):
        result = engine.run(cfg)
    assert result.status == "ok" and len(result.history) == 4
    assert "checkpoint after round 2 not written" in caplog.text and "No space left" in caplog.text


def test_a_pickled_object_is_refused_by_weights_only(tmp_path):
    path = tmp_path / "evil.pt"
    # its digest is right (the writer pickles anything): torch's weights-only loader must refuse it
    checkpoint.write(path, {"format": checkpoint.FORMAT, "payload": Evil(tmp_path / "pwned")})
    with pytest.raises(checkpoint.CheckpointError, match="cannot read checkpoint"):
        checkpoint.read(path)
    assert not (tmp_path / "pwned").exists()


class Evil:
    """Unpickling it would create a file."""

    def __init__(self, target: Path):
        self.target = target

    def __reduce__(self):
        return (Path.touch, (self.target,))


# ----------------------------------------------------------------------------- the generic walk


class Holder:
    """Stands in for a method: attributes of every kind the generic walk handles."""

    def __init__(self, fed):
        self.model = nn.Linear(3, 2)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.1, momentum=0.9)
        self.wrapper = nn.Sequential(fed.clients[0].model, nn.Linear(10, 2))  # wraps a client model
        self.held_weight = self.model.weight  # a model tensor held by reference
        self.counts = np.zeros(3, dtype=np.int64)
        self.seen = set()
        self.pair = (1, "a")
        self.torch_gen = torch.Generator().manual_seed(1)
        self.numpy_gen = np.random.default_rng(1)
        self.python_gen = random.Random(1)
        self.items = {}
        self.fn = lambda x: x  # rebuilt by setup: not stored


def test_generic_walk_round_trips_state_in_place(tmp_path):
    sim = engine.Simulation(config("local", tmp_path, rounds=1))
    fed = sim.fed
    a = Holder(fed)
    with torch.no_grad():
        a.model.weight.add_(1.0)
        a.wrapper[1].bias.fill_(3.0)
    a.model(torch.ones(4, 3)).sum().backward()
    a.opt.step()
    a.model.eval()
    a.counts += 7
    a.seen.update({2, 5})
    a.items["k"] = torch.arange(3)
    draws = (torch.rand(2, generator=a.torch_gen), a.numpy_gen.random(2), a.python_gen.random())
    state = checkpoint.pack_attrs(a, fed)
    assert "fn" not in state and not state["wrapper"]["state"].keys() & {"0.weight", "0.bias"}
    torch.save(state, tmp_path / "s.pt")
    loaded = torch.load(tmp_path / "s.pt", weights_only=True)

    b = Holder(fed)
    model, weight_alias = b.model, b.held_weight
    checkpoint.load_attrs(b, loaded, fed, "holder")
    assert b.model is model and b.held_weight is weight_alias  # loaded in place: references still hold
    assert torch.equal(b.model.weight, a.model.weight) and not b.model.training
    assert torch.equal(b.wrapper[1].bias, a.wrapper[1].bias)
    assert torch.equal(b.opt.state_dict()["state"][0]["momentum_buffer"],
                       a.opt.state_dict()["state"][0]["momentum_buffer"])
    assert b.counts.tolist() == [7, 7, 7] and b.counts.dtype == np.int64
    assert b.seen == {2, 5} and b.pair == (1, "a") and torch.equal(b.items["k"], torch.arange(3))
    after = (torch.rand(2, generator=a.torch_gen), a.numpy_gen.random(2), a.python_gen.random())
    assert torch.equal(torch.rand(2, generator=b.torch_gen), after[0]) and not torch.equal(after[0], draws[0])
    assert np.array_equal(b.numpy_gen.random(2), after[1])
    assert b.python_gen.random() == after[2]


class LazyMethod(Method):
    """Creates a model during a round that setup does not create."""

    card = MethodCard(name="lazy", version="1.0", fidelity="original", topology="none", citation="",
                      summary="Creates a model during a round that setup does not create.")

    def setup(self, fed):
        self.extra: dict[int, nn.Module] = {}

    def run_round(self, fed, rnd, active):
        return {}


def test_a_lazily_created_model_needs_an_override(tmp_path):
    sim = engine.Simulation(config("local", tmp_path, rounds=1))
    method = LazyMethod()
    method.setup(sim.fed)
    method.extra[0] = nn.Linear(2, 2)
    state = method.state_dict(sim.fed)
    fresh = LazyMethod()
    fresh.setup(sim.fed)
    with pytest.raises(checkpoint.CheckpointError, match="must override state_dict/load_state_dict"):
        fresh.load_state_dict(state, sim.fed)
