"""The example third-party package in ``examples/plugin`` works as CONTRIBUTING describes: found
through its entry points, run through the real CLI, named with its version (and, as an editable
install, its commit) in the record's ``plugins`` block; its own tests pass against
``hfl_bench.testing``, and so do the project's tests that enumerate a registry while it is
registered.

Nothing is installed into the venv: the package's folder goes on ``PYTHONPATH`` beside a
``.dist-info`` written from its ``pyproject.toml`` (entry points, name, version, and a PEP 610
``direct_url.json`` marking an editable install of that folder), which is what ``pip install -e``
leaves behind as far as ``importlib.metadata`` can tell."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hfl_bench.provenance import checkout_info, git_info
from hfl_bench.record.check import problems as record_problems
from hfl_bench.recording import SCHEMA_VERSION
from hfl_bench.testing import builtin_methods

pytestmark = pytest.mark.slow  # runs the CLI and the plugin's tests as processes

try:
    import tomllib
except ImportError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")

REPO = Path(__file__).resolve().parent.parent
PLUGIN = REPO / "examples" / "plugin"
PROJECT = tomllib.loads((PLUGIN / "pyproject.toml").read_text())["project"]
DIST, VERSION = PROJECT["name"], PROJECT["version"]


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """A folder holding the plugin's installed metadata, as ``pip install -e examples/plugin`` writes it."""
    root = tmp_path_factory.mktemp("site")
    info = root / f"{DIST.replace('-', '_')}-{VERSION}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {DIST}\nVersion: {VERSION}\n")
    groups = PROJECT["entry-points"]
    (info / "entry_points.txt").write_text("".join(
        f"[{group}]\n" + "".join(f"{name} = {value}\n" for name, value in eps.items()) + "\n"
        for group, eps in groups.items()))
    (info / "top_level.txt").write_text("hfl_bench_example\n")
    (info / "direct_url.json").write_text(json.dumps({"url": PLUGIN.as_uri(), "dir_info": {"editable": True}}))
    return root


def _env(site: Path) -> dict[str, str]:
    env = dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(PLUGIN), str(site), env.get("PYTHONPATH", "")) if p)
    return env


def _cli(site: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hfl_bench.cli", *args], cwd=cwd, env=_env(site),
                          capture_output=True, text=True, timeout=300)


def test_plugin_is_small():
    lines = sum(len(p.read_text().splitlines()) for p in PLUGIN.rglob("*.py") if "__pycache__" not in p.parts)
    assert lines < 120, lines


def test_listed_through_its_entry_points(site, tmp_path):
    found = {}
    for kind in ("methods", "aggregators", "tasks"):
        proc = _cli(site, tmp_path, "list", kind, "--json")
        assert proc.returncode == 0, proc.stderr
        found[kind] = {row["name"]: row for row in json.loads(proc.stdout)}
    assert found["methods"]["example-kd"]["fidelity"] == "original"
    assert found["methods"]["example-kd"]["origin"] == "hfl_bench_example.method"
    assert found["aggregators"]["example-median"]["origin"] == "hfl_bench_example.aggregator"
    assert found["tasks"]["example-blobs"]["input"] == [1, 8, 8]
    assert set(builtin_methods()) <= set(found["methods"])  # the built-ins are still there


def test_run_records_the_plugin_and_its_version(site, tmp_path):
    out = tmp_path / "runs"
    proc = _cli(site, tmp_path, "run", "--method", "example-kd", "--task", "example-blobs", "--rounds", "2",
                "--clients", "4", "--out", str(out), "--json", "-q")
    assert proc.returncode == 0, proc.stderr
    record = json.loads(Path(json.loads(proc.stdout)["record"]).read_text())
    assert record_problems(record) == []
    assert record["schema_version"] == SCHEMA_VERSION and record["status"] == "ok"
    assert record["method"]["version"] == "1.0"
    assert record["method"]["fidelity"] == "original"
    assert record["method"]["plugin_dist"] == DIST
    assert record["method"]["hparams"]["aggregator"] == "example-median"
    plugins = {p["kind"]: p for p in record["plugins"]}
    assert set(plugins) == {"method", "task", "pool", "partitioner", "aggregator"}
    for kind, name, module in (("method", "example-kd", "hfl_bench_example.method"),
                               ("task", "example-blobs", "hfl_bench_example.task"),
                               ("aggregator", "example-median", "hfl_bench_example.aggregator")):
        assert plugins[kind] == {"kind": kind, "name": name, "module": module, "dist": DIST, "version": VERSION,
                                 **checkout_info(PLUGIN)}
    assert plugins["pool"]["name"] == "cpu" and plugins["pool"]["dist"] == "hfl-bench"
    if git_info(REPO)["git_sha"] is not None:  # a source checkout: the editable plugin's commit is recorded
        assert plugins["method"]["git_sha"] == git_info(REPO)["git_sha"]
        assert isinstance(plugins["method"]["git_dirty"], bool)


def test_a_failed_record_still_names_the_plugin(site, tmp_path):
    code = ("import json; from hfl_bench.config import RunConfig; from hfl_bench.recording import "
            "build_failed_record; print(json.dumps(build_failed_record("
            "RunConfig(method='example-kd', task='example-blobs'), 'boom')))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=_env(site), capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    record = json.loads(proc.stdout)
    assert record_problems(record) == []
    assert record["method"]["fidelity"] == "original"
    assert [(p["kind"], p["dist"], p["version"]) for p in record["plugins"]] == [
        ("method", DIST, VERSION), ("task", DIST, VERSION), ("aggregator", DIST, VERSION)]  # pool: not resolved


def test_its_own_tests_and_the_registry_tests_pass_with_it_registered(site):
    """The plugin's tests (through hfl_bench.testing), and the project's tests that enumerate a
    registry, with the plugin registered (issue: they expected every registered name built in)."""
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(PLUGIN / "tests"),
         "tests/test_matrix.py::test_shipped_suites_parse", "tests/test_registry.py", "-k",
         "not end_to_end and not listed_through"],
        cwd=REPO, env=_env(site), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
