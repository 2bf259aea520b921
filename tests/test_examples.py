"""The example scripts under examples/ run as documented (CI runs them small)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # runs the example script as a process

REPO = Path(__file__).resolve().parent.parent
ENV = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", MPLBACKEND="Agg")


def test_compare_methods_runs_compares_and_plots(tmp_path):
    out = tmp_path / "example"
    proc = subprocess.run([sys.executable, str(REPO / "examples" / "compare_methods.py"), "--out", str(out),
                           "--rounds", "2", "--seeds", "2", "--clients", "3"],
                          capture_output=True, text=True, env=ENV, cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert len(list((out / "records").glob("*.json"))) == 4
    assert "crad - local: " in proc.stdout and "over 2 seeds" in proc.stdout
    figures = [Path(line.split("figure: ", 1)[1]) for line in proc.stdout.splitlines() if line.startswith("figure: ")]
    assert len(figures) == 2 and all(f.is_file() and f.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for f in figures)
