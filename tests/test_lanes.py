"""The two lanes of the suite: `pytest -m "not slow"` (the edit loop) and `pytest -m slow` together
collect every test the plain `pytest` collects (what CI runs), none twice, and every Ray test is in
the slow lane. One process collects the suite once (collect-only, no test runs); that process puts
the check itself in the slow lane, which CI runs."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# Collects the suite once with `-m "not slow"`, as the edit loop does, and prints every test it
# collected (before the marker expression), the fast lane it kept, what it deselected, and the tests
# that carry each marker.
COLLECT = """
import json
import pytest

class Lanes:
    @pytest.hookimpl(tryfirst=True)
    def pytest_collection_modifyitems(self, items):
        self.all = [item.nodeid for item in items]
        self.ray = [item.nodeid for item in items if item.get_closest_marker("ray")]
        self.slow = [item.nodeid for item in items if item.get_closest_marker("slow")]
        self.deselected = []

    def pytest_deselected(self, items):
        self.deselected += [item.nodeid for item in items]

    def pytest_collection_finish(self, session):
        self.fast = [item.nodeid for item in session.items]

lanes = Lanes()
code = pytest.main(["--collect-only", "-q", "-n", "0", "-p", "no:cacheprovider", "-m", "not slow", "tests"],
                   plugins=[lanes])
assert code == 0, int(code)
print("LANES " + json.dumps({k: getattr(lanes, k) for k in ("all", "fast", "deselected", "slow", "ray")}))
"""


def test_the_slow_marker_and_the_timeout_are_declared():
    try:
        import tomllib
    except ImportError:  # Python 3.10
        tomllib = pytest.importorskip("tomli")
    options = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    assert any(m.startswith("slow:") for m in options["markers"])
    assert int(options["timeout"]) > 0  # pytest-timeout: a hung test fails instead of holding CI


def test_ci_runs_the_slow_lane_too():
    runs = [shlex.split(line) for line in (REPO / ".ci" / "run").read_text().splitlines()
            if "pytest" in line and not line.lstrip().startswith("#")]
    runs = [words for words in runs if "pytest" in words]  # `python -m pytest ...`, not the install line
    assert runs
    for words in runs:  # no marker expression after `python -m pytest`
        options = words[words.index("pytest") + 1:]
        assert "-m" not in options and not any("slow" in w for w in options), words


@pytest.mark.slow  # a process that collects the whole suite (a minute on a busy machine)
def test_the_two_lanes_together_collect_every_test():
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")
    proc = subprocess.run([sys.executable, "-c", COLLECT], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    [line] = [x for x in proc.stdout.splitlines() if x.startswith("LANES ")]
    lanes = json.loads(line.removeprefix("LANES "))
    everything, fast, slow = lanes["all"], set(lanes["fast"]), set(lanes["slow"])
    assert len(set(everything)) == len(everything) and fast and slow
    assert fast | slow == set(everything) and not fast & slow
    assert set(lanes["deselected"]) == slow  # `-m "not slow"` leaves out exactly the tests `-m slow` selects
    assert set(lanes["ray"]) <= slow  # Ray starts a cluster: never in the edit loop
    assert "tests/test_lanes.py::test_the_slow_marker_and_the_timeout_are_declared" in fast
    assert "tests/test_lanes.py::test_the_two_lanes_together_collect_every_test" in slow
    assert any(i.startswith("tests/test_method_pins.py::") for i in slow)  # a module's pytestmark
