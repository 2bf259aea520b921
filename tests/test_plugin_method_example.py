"""The tutorial's plugin package (``examples/plugin-method``, "A plugin method from scratch"):
found through its entry point, run through the real CLI, and its own tests pass, as a user who
followed the tutorial would see it. CI also installs it and runs its tests (``.ci/run``).

Nothing is installed into the venv (an installed plugin would change the generated pages): the
package's folder goes on ``PYTHONPATH`` beside a ``.dist-info`` written from its
``pyproject.toml``, which is what ``pip install -e`` leaves behind as far as
``importlib.metadata`` can tell."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # runs the CLI and the plugin's tests as processes

try:
    import tomllib
except ImportError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "examples" / "plugin-method"
PROJECT = tomllib.loads((PACKAGE / "pyproject.toml").read_text())["project"]
DIST, VERSION = PROJECT["name"], PROJECT["version"]


@pytest.fixture(scope="module")
def env(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("site")
    info = root / f"{DIST.replace('-', '_')}-{VERSION}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {DIST}\nVersion: {VERSION}\n")
    (info / "entry_points.txt").write_text("".join(
        f"[{group}]\n" + "".join(f"{name} = {value}\n" for name, value in eps.items()) + "\n"
        for group, eps in PROJECT["entry-points"].items()))
    (info / "top_level.txt").write_text("hfl_bench_prior\n")
    (info / "direct_url.json").write_text(json.dumps({"url": PACKAGE.as_uri(), "dir_info": {"editable": True}}))
    out = dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1", HFL_BENCH_NO_INDEX="1")
    out["PYTHONPATH"] = os.pathsep.join(p for p in (str(PACKAGE), str(root), out.get("PYTHONPATH", "")) if p)
    return out


def test_listed_and_described_through_its_entry_point(env, tmp_path):
    proc = subprocess.run([sys.executable, "-m", "hfl_bench.cli", "describe", "example-prior", "--json"], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    info = json.loads(proc.stdout)
    assert info["fidelity"] == "original" and info["origin"] == "hfl_bench_prior.method"
    assert [h["name"] for h in info["hyperparameters"]] == ["lam"]


def test_its_own_tests_pass(env):
    # the tutorial's command (pytest -o addopts="" ...), with pytest-xdist switched off: it needs pytest
    # alone, which the page once did not (the repository's addopts carry -n 2)
    page = (REPO / "docs" / "contributing" / "plugin-method.md").read_text()
    assert '\npytest -o addopts="" examples/plugin-method/tests\n' in page
    proc = subprocess.run([sys.executable, "-m", "pytest", "-o", "addopts=", "-p", "no:xdist", "-q", "-p",
                           "no:cacheprovider", str(PACKAGE / "tests")], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "3 passed" in proc.stdout


def test_the_tutorial_shows_the_file_ci_runs():
    """The page holds each file as it is (docs/regenerate.py copies it; --check in CI), so it reads on
    GitHub too, where snippet markers (--8<--) showed instead of the code."""
    from test_docs_tables import regenerate  # docs/regenerate.py, loaded once

    page = (REPO / "docs" / "contributing" / "plugin-method.md").read_text()
    assert "--8<--" not in page
    for path in ("pyproject.toml", "hfl_bench_prior/method.py", "tests/test_prior.py"):
        name = f"examples/plugin-method/{path}"
        block = f"<!-- included from: {name} -->\n{regenerate.included(name)}<!-- end included -->"
        assert block in page, f"{name}: the page's copy differs from the file (python docs/regenerate.py)"
