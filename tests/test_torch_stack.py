"""A torch and a torchvision that do not work together: one line naming both versions and the
fix, exit 2, never a traceback, at the start of a command that trains.

What is simulated, and how: the real torch stays installed; a fake ``torchvision`` package and its
``dist-info`` (with the version under test) are put first on PYTHONPATH, so both the metadata
check and ``import torchvision`` find the fake. Its ``__init__`` raises the error a torchvision
built for another torch raises on import, with the real text (``RuntimeError: operator
torchvision::nms does not exist``). The real mismatch (a CUDA torchvision beside a CPU-only torch)
is not installed here."""

from __future__ import annotations

import os
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest

from hfl_bench import stack

pytestmark = pytest.mark.slow  # runs the CLI as processes

TORCH = version("torch")
REAL_ERROR = "operator torchvision::nms does not exist"


def _fake_torchvision(root: Path, vision_version: str) -> Path:
    """A folder holding a torchvision that fails on import as a mismatched build does."""
    pkg = root / "torchvision"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(f"raise RuntimeError({REAL_ERROR!r})\n")
    info = root / f"torchvision-{vision_version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: torchvision\nVersion: {vision_version}\n")
    return root


def _cli(args: list[str], fake: Path, cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(fake), OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")
    return subprocess.run([sys.executable, "-m", "hfl_bench.cli", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300)


def _matching() -> str:
    return stack.matching_torchvision(TORCH) + ".0"


@pytest.mark.parametrize("vision", ["0.17.0", "matching"], ids=["other-version", "same-version-other-build"])
def test_a_mismatched_torchvision_is_one_line_at_start_up(tmp_path, vision):
    vision = _matching() if vision == "matching" else vision
    fake = _fake_torchvision(tmp_path / "fake", vision)
    for args in (["run", "--method", "local", "--task", "digits", "--rounds", "1"],
                 ["matrix", str(tmp_path / "no-such-suite.yaml")]):
        proc = _cli(args, fake, tmp_path)
        assert proc.returncode == 2, proc.stderr
        assert proc.stdout == "" and proc.stderr.count("\n") == 1, proc.stderr  # one line, no traceback
        line = proc.stderr
        assert line.startswith(f"error: torch {TORCH} and torchvision {vision} do not work together")
        assert "fix: pip install --force-reinstall 'torch==" in line and "Traceback" not in line
        if vision == _matching():
            assert REAL_ERROR in line  # found by importing it
        else:
            assert f"needs torchvision {stack.matching_torchvision(TORCH)}" in line  # found from the versions
    assert not list(tmp_path.glob("runs*"))  # nothing ran


def test_commands_that_do_not_train_still_answer(tmp_path):
    fake = _fake_torchvision(tmp_path / "fake", "0.17.0")
    proc = _cli(["--version"], fake, tmp_path)
    assert proc.returncode == 0 and "torchvision 0.17.0" in proc.stdout


def test_the_fix_names_the_pair_and_the_cpu_index():
    assert stack.matching_torchvision("2.14.1") == "0.29" and stack.matching_torchvision("2.3.0+cpu") == "0.18"
    assert stack.fix("2.13.0+cpu") == (f"pip install --force-reinstall 'torch==2.13.0 torchvision==0.28.*' "
                                       f"--index-url {stack.CPU_INDEX}")
    assert stack.fix("2.13.0") == "pip install --force-reinstall 'torch==2.13.0 torchvision==0.28.*'"
    assert stack.import_problem(RuntimeError("CUDA out of memory")) is None
    assert stack.import_problem(RuntimeError(REAL_ERROR)).startswith("torch ")
