"""Checkpoints trusted only as far as they should be (issue 47): a checkpoint of another method
version, a checkpoint write that fails for any reason, temporary files a killed write leaves, a
checkpoint path that is not a regular file, and a checkpoint that cannot be removed after the
record is written. Each through the real writer, reader and CLI."""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from hfl_bench import aggregation, checkpoint, engine, paths
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


def test_a_checkpoint_of_another_aggregation_rule_version_is_refused(tmp_path, monkeypatch):
    """A rule's version is part of the run's method version (``aggregation.run_version``): a
    checkpoint written before a rule's fix does not resume under the fixed rule either."""
    cfg = dataclasses.replace(crad_config(tmp_path), method_params={"aggregator": "crad-lcb"})
    path = interrupted_after_round_1(cfg)
    assert checkpoint.read(path)["versions"]["method"] == "1.0"  # crad-lcb is at its first version
    monkeypatch.setitem(aggregation._VERSIONS, "crad-lcb", "1.1")  # as a fix of the rule declares
    result, _, _ = invoke_cli("run", *crad_args(), "--set", "aggregator=crad-lcb", "--out", str(tmp_path),
                              "--resume", "-q")
    text = " ".join(result.output.split())
    assert result.exit_code == 2, result.output
    assert "method version '1.0'" in text and "'1.0+crad-lcb-1.1'" in text and "Traceback" not in result.output


# ----------------------------------------------------------------------------- #2 a write that fails


LOCAL_ARGS = ["--method", "local", "--task", "digits", "--clients", "3", "--rounds", "3", "--seed", "0",
              "--checkpoint-every", "1", *CLI_QUICK]


def test_a_checkpoint_write_that_raises_runtime_error_is_a_warning_and_the_run_goes_on(tmp_path, monkeypatch,
                                                                                       caplog):
    """torch's zip writer reports ENOSPC as a RuntimeError of its own, raised while handling the
    file's OSError (as the real-disk test below sees it): still a one-line warning naming ENOSPC."""
    def full_disk(obj, f, *args, **kwargs):
        f.write(b"PK\x03\x04 half a zip")  # what a real writer leaves before the disk fills
        try:
            raise OSError(28, "No space left on device")
        except OSError:
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598\n"
                               "frame #0: c10::ThrowEnforceNotMet")

    monkeypatch.setattr(checkpoint.torch, "save", full_disk)
    with caplog.at_level("WARNING", logger="hfl_bench.engine"):
        result, stdout, stderr = invoke_cli("run", *LOCAL_ARGS, "--out", str(tmp_path), "-q")
    output = result.output + stderr
    assert result.exit_code == 0, output
    assert "Traceback" not in output
    warnings = [r.getMessage() for r in caplog.records if "not written" in r.getMessage()]
    assert len(warnings) == 2, caplog.text  # rounds 1 and 2 (none after the last round)
    assert all("\n" not in w for w in warnings)
    assert "OSError: No space left on device" in warnings[0] and "the run goes on" in warnings[0], warnings
    record = json.loads(next(tmp_path.glob("*.json")).read_text())
    assert record["status"] == "ok" and len(record["history"]) == 4
    assert not list((tmp_path / ".checkpoints").glob("*"))  # nor any temporary file


def _can_mount_tmpfs(where: Path) -> str | None:
    """None if this process can mount a tmpfs in its own user and mount namespaces, else why not."""
    if not shutil.which("unshare"):
        return "no unshare(1) here"
    probe = subprocess.run(["unshare", "--user", "--map-root-user", "--mount", "sh", "-c",
                            f"mount -t tmpfs -o size=64k tmpfs {shlex.quote(str(where))}"],
                           capture_output=True, text=True, timeout=30)
    if probe.returncode:
        return f"cannot mount a tmpfs in a user namespace ({probe.stderr.strip()[:200] or probe.returncode})"
    return None


@pytest.mark.slow  # the CLI as a process
def test_a_checkpoint_write_on_a_real_full_disk_is_a_warning_and_the_run_goes_on(tmp_path):
    """The checkpoint folder is a 64 KiB tmpfs (a real ENOSPC from the kernel), the record's folder
    is not: the run warns at every checkpoint and writes its record."""
    out = tmp_path / "out"
    (out / ".checkpoints").mkdir(parents=True)
    why = _can_mount_tmpfs(out / ".checkpoints")
    if why:
        pytest.skip(why)
    run = shlex.join([sys.executable, "-m", "hfl_bench.cli", "run", *LOCAL_ARGS, "--out", str(out), "--json", "-q"])
    mount = f"mount -t tmpfs -o size=64k tmpfs {shlex.quote(str(out / '.checkpoints'))}"
    proc = subprocess.run(["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", f"{mount} && exec {run}"],
                          capture_output=True, text=True, timeout=300, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    warnings = [line for line in proc.stderr.splitlines() if "not written" in line]
    assert len(warnings) == 2 and "No space left on device" in warnings[0], proc.stderr[-3000:]
    record = json.loads(Path(json.loads(proc.stdout)["record"]).read_text())
    assert record["status"] == "ok" and len(record["history"]) == 4


# ----------------------------------------------------------------------------- #3 a write killed mid-way

KILLED_WRITE = """
import os, signal, sys
from hfl_bench import paths

def die(f):
    f.write(b"PK half a checkpoint")
    f.flush()
    os.kill(os.getpid(), signal.SIGKILL)  # a preemption in the middle of the write

paths.write_atomic(sys.argv[1], die)
"""


@pytest.mark.slow  # a process, killed
def test_a_checkpoint_write_killed_midway_leaves_no_temporary_file_after_the_next_start(tmp_path):
    cfg = engine.load_task(RunConfig(method="local", task="digits", clients=3, rounds=3, seed=0,
                                     checkpoint_every=1, out=str(tmp_path), **QUICK))[1]
    path = paths.checkpoint_path(cfg)
    for _ in range(2):  # every kill mid-write leaves one
        killed = subprocess.run([sys.executable, "-c", KILLED_WRITE, str(path)], capture_output=True, timeout=120)
        assert killed.returncode == -9, killed.stderr
    stale = sorted(p.name for p in path.parent.iterdir())
    assert len(stale) == 2 and all(n.startswith(f".{path.name}.") and n.endswith(".tmp") for n in stale), stale
    # what is not this run's temporary file stays: another run's, one of another name pattern, a user's file
    others = [f".{path.stem}x.pt.abcdefgh.tmp", f".{path.name}.tmp", f"{path.name}.abcdefgh.tmp", "notes.txt"]
    for name in others:
        (path.parent / name).write_text("keep")
    result, _, stderr = invoke_cli("run", *LOCAL_ARGS, "--out", str(tmp_path), "--resume", "-q")
    assert result.exit_code == 0, result.output + stderr
    assert sorted(p.name for p in path.parent.iterdir()) == sorted(others)


# ----------------------------------------------------------------------------- #11 not a regular file

CELL_ON_FIFO = """
import json, sys
from hfl_bench import engine
from hfl_bench.config import RunConfig
from hfl_bench.matrix.cells import run_cell
from hfl_bench.testing import QUICK
cfg = engine.load_task(RunConfig(method="local", task="digits", clients=3, rounds=3, seed=0, checkpoint_every=1,
                                 out=sys.argv[1], **QUICK))[1]
record = run_cell(cfg)
print(json.dumps({"status": record["status"], "error": record["error"],
                  "resumed": record.get("federation", {}).get("resumed_from_rounds")}))
"""


@pytest.mark.slow  # the CLI as a process
@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this platform")
@pytest.mark.parametrize("how", ["run --resume", "matrix cell"])
def test_a_fifo_at_the_checkpoint_path_is_refused_never_opened_blocking(tmp_path, how):
    cfg = engine.load_task(RunConfig(method="local", task="digits", clients=3, rounds=3, seed=0,
                                     checkpoint_every=1, out=str(tmp_path), **QUICK))[1]
    path = paths.checkpoint_path(cfg)
    path.parent.mkdir(parents=True)
    os.mkfifo(path)  # nobody ever writes into it: an open for reading blocks forever
    env = dict(os.environ, OMP_NUM_THREADS="1")
    if how == "run --resume":
        cmd = [sys.executable, "-m", "hfl_bench.cli", "run", *LOCAL_ARGS, "--out", str(tmp_path), "--resume", "-q"]
    else:
        cmd = [sys.executable, "-c", CELL_ON_FIFO, str(tmp_path)]
    try:  # a regression hangs: the timeout turns it into a failure
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{how} blocked on the FIFO at {path}")
    if how == "run --resume":
        assert proc.returncode == 2, proc.stderr[-2000:]
        errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
        assert len(errors) == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
        assert "not a regular file (a FIFO)" in " ".join(proc.stderr.split())
        assert not list(tmp_path.glob("*.json"))
    else:  # a matrix cell drops a checkpoint it cannot use and starts over, as for any other
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert json.loads(proc.stdout.splitlines()[-1]) == {"status": "ok", "error": None, "resumed": None}
        assert not path.exists()


def test_a_folder_at_the_checkpoint_path_is_refused_in_one_line(tmp_path):
    cfg = engine.load_task(RunConfig(method="local", task="digits", clients=3, rounds=3, seed=0,
                                     checkpoint_every=1, out=str(tmp_path), **QUICK))[1]
    paths.checkpoint_path(cfg).mkdir(parents=True)
    with pytest.raises(checkpoint.CheckpointError, match=r"not a regular file \(a folder\)"):
        checkpoint.read(paths.checkpoint_path(cfg))


# ----------------------------------------------------------------------------- #13 a checkpoint left behind


@pytest.mark.parametrize("why", ["a folder at its path", "permission denied"])
def test_a_checkpoint_that_cannot_be_removed_after_the_record_is_a_warning(tmp_path, monkeypatch, caplog, why):
    """The record is written: it is reported written (exit 0, no copy in the unsaved folder), and
    the checkpoint left behind is a one-line warning."""
    cfg = engine.load_task(RunConfig(method="local", task="digits", clients=3, rounds=3, seed=0,
                                     checkpoint_every=1, out=str(tmp_path), **QUICK))[1]
    path = paths.checkpoint_path(cfg)
    args = [*LOCAL_ARGS, "--out", str(tmp_path), "-q"]
    if why == "a folder at its path":
        (path / "x").mkdir(parents=True)  # unlink() fails: IsADirectoryError
        at = args.index("--checkpoint-every")
        args[at + 1] = "0"  # and no checkpoint write tries to replace it
    else:
        unlink = Path.unlink

        def read_only(self, missing_ok=False):
            if self == path:
                raise PermissionError(13, "Permission denied")
            return unlink(self, missing_ok=missing_ok)

        monkeypatch.setattr(Path, "unlink", read_only)
    with caplog.at_level("WARNING"):
        result, stdout, stderr = invoke_cli("run", *args)
    output = " ".join((result.output + stderr).split())
    assert result.exit_code == 0, output
    assert "unsaved" not in output and "instead" not in output and "record written to" in output
    record = paths.record_path(cfg)
    assert json.loads(record.read_text())["status"] == "ok"
    assert not list((Path(paths.unsaved_dirs()[0])).glob(f"*/{record.name}"))
    [warning] = [r.getMessage() for r in caplog.records if "could not be removed" in r.getMessage()]
    assert "the record is written" in warning and str(path) in warning and "\n" not in warning
    assert path.exists()


# ----------------------------------------------------------------------------- #1 a damaged checkpoint


def flip_one_byte(path: Path, where: float = 0.8) -> None:
    """Flip the bits of one byte well inside the archive (in a weight's data, for these models)."""
    data = bytearray(path.read_bytes())
    data[int(len(data) * where)] ^= 0xFF
    path.write_bytes(bytes(data))


def test_a_checkpoint_with_one_flipped_byte_is_refused_in_one_line(tmp_path):
    cfg = crad_config(tmp_path)
    path = interrupted_after_round_1(cfg)
    flip_one_byte(path)
    with pytest.raises(checkpoint.CheckpointError, match=r"is damaged \(its content does not match its SHA-256\)"):
        checkpoint.read(path)
    with pytest.raises(checkpoint.CheckpointError, match="is damaged"):
        engine.run(cfg, resume=True)


def test_a_checkpoint_without_its_digest_line_is_refused(tmp_path):
    cfg = crad_config(tmp_path)
    path = interrupted_after_round_1(cfg)
    data = path.read_bytes()
    path.write_bytes(data.partition(b"\n")[2])  # the bare torch archive an older hfl-bench wrote
    with pytest.raises(checkpoint.CheckpointError, match="has no digest line"):
        checkpoint.read(path)


def test_run_resume_refuses_a_damaged_checkpoint_in_one_line(tmp_path):
    out = tmp_path / "runs"
    cfg = crad_config(out)
    flip_one_byte(interrupted_after_round_1(cfg))
    result, stdout, stderr = invoke_cli("run", *crad_args(), "--out", str(out), "--resume")
    text = stderr or stdout
    assert result.exit_code == 2 and "is damaged" in text and "Traceback" not in text


def test_a_matrix_cell_starts_over_from_a_damaged_checkpoint_and_its_record_says_so(tmp_path):
    cfg = crad_config(tmp_path)
    path = interrupted_after_round_1(cfg)
    flip_one_byte(path)
    record = run_cell(cfg)
    assert record["status"] == "ok" and "resumed_from_rounds" not in record["federation"]
    refused = record["federation"]["checkpoint_refused"]
    assert "is damaged" in refused and str(tmp_path) not in refused  # no machine path in a record
    uninterrupted = run_cell(crad_config(tmp_path / "again"))
    assert record["metrics"]["final"] == uninterrupted["metrics"]["final"]  # it started over, not from the damage


def test_a_matrix_cell_with_a_folder_at_its_checkpoint_path_starts_over_and_finishes(tmp_path, caplog):
    """A non-empty folder where the cell's checkpoint would be: refused as no checkpoint, the cell
    runs from the start (its checkpoint writes warn), and its record says why it did not resume."""
    cfg = crad_config(tmp_path)
    folder = paths.checkpoint_path(cfg)
    (folder / "inside").mkdir(parents=True)
    with caplog.at_level("WARNING"):
        record = run_cell(cfg)
    assert record["status"] == "ok", record.get("error")
    assert "not a regular file (a folder)" in record["federation"]["checkpoint_refused"]
    assert "not written" in caplog.text and folder.is_dir()
