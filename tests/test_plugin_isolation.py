"""One faulty plugin disables nothing else (issue 47, row 9). Each plugin here is a real
distribution: a package beside a ``.dist-info`` (METADATA, entry_points.txt) in a temporary folder
on ``PYTHONPATH``, found by ``importlib.metadata`` in a subprocess running the real CLI.

- an entry point whose import raises is skipped with one warning line naming its distribution,
  the entry point and the error; commands that do not need it work; one that names it fails in
  one line that says why;
- a plugin that registers a taken name is refused with both names (its distribution, and the
  module and distribution that own the name), even when its entry point sorts before the
  built-ins', and what it registered before is taken back;
- a matrix resolves its plugins once, at start: a plugin installed while it runs is not loaded
  by its later cells' workers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from hfl_bench.testing import QUICK

from helpers import write_dist

pytestmark = pytest.mark.slow  # installs plugins and runs the CLI as processes


def _cli(site: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1", XDG_CACHE_HOME=str(cwd / "cache"))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(site), env.get("PYTHONPATH", "")) if p)
    return subprocess.run([sys.executable, "-m", "hfl_bench.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def _lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip()]


def test_a_plugin_that_fails_to_import_is_skipped(tmp_path):
    site = tmp_path / "site"
    write_dist(site, "hflb_broken", "hflb-broken", "import hflb_no_such_dependency\n",
                "[hfl_bench.methods]\nbroken = hflb_broken\n")
    warning = ("warning: plugin hflb-broken's entry point 'broken' (hfl_bench.methods: hflb_broken) failed to "
               "import: ModuleNotFoundError: No module named 'hflb_no_such_dependency'; skipped")

    proc = _cli(site, tmp_path, "run", "--method", "local", "--task", "digits", "--clients", "3", "--rounds", "1",
                "--out", str(tmp_path / "runs"), "--json", "-q")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["status"] == "ok"
    assert _lines(proc.stderr) == [warning]  # once, and no traceback

    for _ in range(2):  # every call says so: no index is written that would hide it
        proc = _cli(site, tmp_path, "list", "methods", "--json")
        assert proc.returncode == 0, proc.stderr
        assert "local" in {row["name"] for row in json.loads(proc.stdout)}
        assert _lines(proc.stderr) == [warning]

    proc = _cli(site, tmp_path, "run", "--method", "broken", "--task", "digits")
    assert proc.returncode == 2
    warned, error = _lines(proc.stderr)
    assert warned == warning
    assert error.startswith("error: unknown method 'broken' (the plugin hflb-broken's entry point 'broken' "
                            "(hfl_bench.methods: hflb_broken) failed to import: ModuleNotFoundError: No module "
                            "named 'hflb_no_such_dependency'). Available: ")


TAKER = '''
from hfl_bench.method_api import Method, MethodCard, register_method


def method(name):
    class Taker(Method):
        card = MethodCard(name=name, version="1.0", fidelity="reconstructed", topology="none",
                          citation="demo", summary="A plugin method.")

        def run_round(self, fed, rnd, active):
            return {}

    return Taker


register_method(method("taker-ok"))  # taken back when the next one is refused
register_method(method("crad"))
'''


def test_a_plugin_that_takes_a_builtin_name_is_refused_with_both_names(tmp_path):
    site = tmp_path / "site"
    # "a-taker" sorts before the built-ins' entry point ("builtin"): they still load first
    write_dist(site, "hflb_taker", "hflb-taker", TAKER, "[hfl_bench.methods]\na-taker = hflb_taker\n")
    proc = _cli(site, tmp_path, "list", "methods", "--json")
    assert proc.returncode == 0, proc.stderr
    rows = {row["name"]: row for row in json.loads(proc.stdout)}
    assert rows["crad"]["origin"] == "hfl_bench.methods.crad"
    assert "taker-ok" not in rows
    assert _lines(proc.stderr) == [
        "warning: plugin hflb-taker's entry point 'a-taker' (hfl_bench.methods: hflb_taker) was refused: "
        "hflb_taker (hflb-taker) registers method 'crad', already registered (by hfl_bench.methods.crad, "
        "hfl-bench); skipped"]


INSTALLER = '''
"""A method whose setup installs another plugin (hflb-late) into this very folder."""

import os
from pathlib import Path

from hfl_bench.method_api import Method, MethodCard, register_method

SITE = Path(__file__).resolve().parent.parent
LATE = """
import os
from pathlib import Path

(Path(__file__).resolve().parent.parent / f"late-imported-{os.getpid()}").touch()
from hfl_bench.method_api import Method, MethodCard, register_method


@register_method
class Late(Method):
    card = MethodCard(name="local", version="1.0", fidelity="reconstructed", topology="none",
                      citation="demo", summary="Takes a built-in's name.")

    def run_round(self, fed, rnd, active):
        return {}
"""


def install_late():
    package = SITE / "hflb_late"
    package.mkdir(exist_ok=True)
    (package / "__init__.py").write_text(LATE)
    info = SITE / "hflb_late-0.1.dist-info"
    if info.exists():
        return
    staging = SITE / f".staging-{os.getpid()}"
    staging.mkdir()
    (staging / "METADATA").write_text("Metadata-Version: 2.1\\nName: hflb-late\\nVersion: 0.1\\n")
    (staging / "entry_points.txt").write_text("[hfl_bench.methods]\\nlate = hflb_late\\n")
    try:
        os.rename(staging, info)  # at once: never half installed
    except OSError:  # the other cell installed it first
        pass


@register_method
class Installer(Method):
    card = MethodCard(name="demo-installer", version="1.0", fidelity="reconstructed", topology="none",
                      citation="demo", summary="Installs hflb-late when it sets up.")

    def setup(self, fed):
        install_late()

    def run_round(self, fed, rnd, active):
        return {}
'''


def test_a_matrix_resolves_its_plugins_once_at_start(tmp_path):
    """Two installer cells run first (``--jobs 2``); each installs hflb-late as it sets up, so the
    ``local`` cells start after it is installed. Their workers load only the plugins the driver
    resolved: hflb-late is never imported, and no line is about it."""
    site = tmp_path / "site"
    write_dist(site, "hflb_installer", "hflb-installer", INSTALLER,
                "[hfl_bench.methods]\ninstaller = hflb_installer\n")
    suite = tmp_path / "suite.yaml"
    suite.write_text(yaml.safe_dump({
        "methods": ["demo-installer", "local"], "tasks": ["digits"], "seeds": [0, 1],
        "out": str(tmp_path / "records"), "settings": {"rounds": 1, "clients": 3, **QUICK}}))
    proc = _cli(site, tmp_path, "matrix", str(suite), "--jobs", "2", "--json")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    cells = json.loads(proc.stdout)["cells"]
    assert [(c["method"], c["status"]) for c in cells] == [("demo-installer", "ok")] * 2 + [("local", "ok")] * 2
    assert (site / "hflb_late-0.1.dist-info").is_dir()  # installed while the matrix ran
    assert not list(site.glob("late-imported-*"))
    assert "hflb-late" not in proc.stderr
    # A command started now loads it, and refuses its taken name with both names.
    proc = _cli(site, tmp_path, "list", "methods", "--json")
    assert proc.returncode == 0, proc.stderr
    assert list(site.glob("late-imported-*"))
    assert "plugin hflb-late's entry point 'late'" in proc.stderr
    assert "already registered (by hfl_bench.methods.local, hfl-bench)" in proc.stderr
