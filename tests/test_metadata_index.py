"""The metadata index (issue 14): ``list`` and ``describe`` answer from a file under the user cache
without importing the plugins, print exactly what the imported plugins would, and never show what
is stale. Every test uses its own cache folder (``$XDG_CACHE_HOME``), never the real one.

The end-to-end checks run the real CLI in fresh processes (an index is only read by a process
whose registries are untouched); a third-party plugin is a package on ``PYTHONPATH`` beside a
``.dist-info`` folder naming its entry point, as ``pip install`` leaves it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hfl_bench import metadata_index
from hfl_bench.cli import catalog
from hfl_bench.testing import builtin_methods

PLUGIN = '''
"""An index-demo plugin."""

import dataclasses

from hfl_bench.method_api import Method, MethodCard, param, register_method


@register_method
class IndexDemo(Method):
    card = MethodCard(name="index-demo", version="1.0", fidelity="reconstructed", topology="none",
                      citation="demo", summary="{doc}")

    @dataclasses.dataclass
    class Params:
        lam: float = param(0.5, "A weight.")

    def run_round(self, fed, rnd, active):
        return {{}}
'''

# Run CLI commands in one process and report what each printed and which heavy modules it imported.
RUNNER = """
import json, sys
from typer.testing import CliRunner
from hfl_bench.cli import app
from hfl_bench.registry import REGISTRIES
runner = CliRunner()
results = []
for args in json.loads(sys.argv[1]):
    r = runner.invoke(app, args)
    results.append([r.exit_code, r.stdout, r.stderr])
heavy = sorted(m for m in ("torch", "timm", "torchvision", "hfl_bench.methods", "hfl_bench.tasks", "hfl_bench.pools")
               if m in sys.modules)
touched = [k for k, r in REGISTRIES.items() if not r.untouched()]
print(json.dumps({"results": results, "imported": heavy, "touched": touched}))
"""

COMMANDS = [
    ["list", "methods"], ["list", "methods", "--json"], ["list", "tasks"], ["list", "tasks", "--json"],
    ["list", "pools"], ["list", "pools", "--json"], ["list", "aggregators"], ["list", "aggregators", "--json"],
    ["list", "partitioners", "--json"], ["list", "pools", "--task", "nosuch"],
    ["describe", "crad"], ["describe", "crad", "--json"], ["describe", "crad", "--kind", "aggregators", "--json"],
    ["describe", "digits"], ["describe", "digits", "--json"], ["describe", "cpu", "--json"],
    ["describe", "dirichlet"], ["describe", "index-demo"], ["describe", "index-demo", "--json"],
    ["describe", "nosuch"], ["describe", "cra", "--kind", "methods"],
]


def write_plugin(root: Path, doc: str = "Demo of the index.") -> Path:
    """A package ``hflb_index_demo`` and its installed metadata in ``root``; returns the module."""
    package = root / "hflb_index_demo"
    package.mkdir(parents=True, exist_ok=True)
    module = package / "__init__.py"
    module.write_text(PLUGIN.format(doc=doc))
    info = root / "hflb_index_demo-0.1.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: hflb-index-demo\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[hfl_bench.methods]\ndemo = hflb_index_demo\n")
    (info / "top_level.txt").write_text("hflb_index_demo\n")
    return module


def cli_env(cache: Path, plugins: Path | None = None, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != metadata_index.DISABLE_ENV}
    env.update(XDG_CACHE_HOME=str(cache), HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1", COLUMNS="120", **extra)
    if plugins is not None:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(plugins), env.get("PYTHONPATH", "")) if p)
    return env


def cli(env: dict[str, str], *args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hfl_bench.cli", *args], env=env, cwd=cwd,
                          capture_output=True, text=True, timeout=300)


def run_many(env: dict[str, str], commands: list[list[str]], cwd: Path) -> dict:
    proc = subprocess.run([sys.executable, "-c", RUNNER, json.dumps(commands)], env=env, cwd=cwd,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.splitlines()[-1])


def key_now(env: dict[str, str], cwd: Path) -> str:
    code = "from hfl_bench import metadata_index as m; print(m.current_key())"
    proc = subprocess.run([sys.executable, "-c", code], env=env, cwd=cwd, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def index_file(cache: Path) -> Path:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("XDG_CACHE_HOME", str(cache))
        return metadata_index.index_path()


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """A plugin installed, a corrupt index file in place, then one ``list methods``: the index it
    built (the first call imports the plugins and writes it)."""
    root = tmp_path_factory.mktemp("index")
    cache, plugins, cwd = root / "cache", root / "site", root / "cwd"
    cwd.mkdir()
    write_plugin(plugins)
    env = cli_env(cache, plugins)
    path = index_file(cache)
    path.parent.mkdir(parents=True)
    path.write_bytes(b"\x00{not json")
    proc = cli(env, "list", "methods", "--json", cwd=cwd)
    return {"env": env, "cwd": cwd, "cache": cache, "plugins": plugins, "path": path, "first": proc}


# --------------------------------------------------------------------------- end to end


@pytest.mark.slow  # its fixture runs the CLI as processes
def test_corrupt_index_is_rebuilt_and_plugins_still_found(built):
    proc = built["first"]
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    rows = {r["name"]: r for r in json.loads(proc.stdout)}
    assert set(builtin_methods()) <= set(rows)
    assert rows["index-demo"]["description"] == "Demo of the index."  # found through its entry point
    doc = json.loads(built["path"].read_text())
    assert doc["format"] == metadata_index.FORMAT and doc["key"] == key_now(built["env"], built["cwd"])
    assert "index-demo" in doc["data"]["names"]["methods"]


@pytest.mark.slow  # processes
def test_second_call_reads_the_index_without_importing_torch(built):
    code = ("import sys\n"
            "sys.argv = ['hfl-bench', 'list', 'methods', '--json']\n"
            "from hfl_bench.cli import main\n"
            "try:\n    main()\nexcept SystemExit as e:\n    assert not e.code, e.code\n"
            "print('torch' in sys.modules, 'timm' in sys.modules, 'hfl_bench.methods' in sys.modules,\n"
            "      'numpy' in sys.modules)\n")
    proc = subprocess.run([sys.executable, "-c", code], env=built["env"], cwd=built["cwd"], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    *rows, imported = proc.stdout.splitlines()
    assert imported == "False False False False"
    assert json.loads("\n".join(rows)) == json.loads(built["first"].stdout)


@pytest.mark.slow  # its fixture runs the CLI as processes
def test_output_identical_with_and_without_the_index(built):
    indexed = run_many(built["env"], COMMANDS, built["cwd"])
    assert indexed["imported"] == [] and indexed["touched"] == []  # every answer came from the index
    # A tampered description in the index: the bypass must not read it (nor write the file).
    path = built["path"]
    original = path.read_bytes()
    doc = json.loads(original)
    doc["data"]["describe"]["methods"]["crad"]["json"]["description"] = "TAMPERED"
    tampered = json.dumps(doc).encode()
    path.write_bytes(tampered)
    try:
        live = run_many(dict(built["env"], HFL_BENCH_NO_INDEX="1"), COMMANDS, built["cwd"])
        assert path.read_bytes() == tampered
    finally:
        path.write_bytes(original)
    assert "torch" in live["imported"]  # the bypass imported the plugins
    for args, a, b in zip(COMMANDS, indexed["results"], live["results"]):
        assert a == b, args
    by_args = {" ".join(args): r for args, r in zip(COMMANDS, indexed["results"])}
    assert by_args["describe nosuch"][0] == 2 and "is no method" in by_args["describe nosuch"][2]
    assert "Did you mean 'crad'?" in by_args["describe cra --kind methods"][2]
    assert by_args["list pools --task nosuch"][0] == 2
    assert "unknown task 'nosuch'" in by_args["list pools --task nosuch"][2]
    assert "is also in aggregators" in by_args["describe crad"][2]
    assert json.loads(by_args["describe index-demo --json"][1])["hyperparameters"][0]["name"] == "lam"
    pools = json.loads(by_args["list pools --json"][1])
    assert "params" in next(p for p in pools if p["name"] == "paper")["members"][0]  # counts stored


@pytest.mark.slow  # its fixture runs the CLI as processes
def test_index_text_is_printed_as_plain_text(built):
    path = built["path"]
    original = path.read_bytes()
    doc = json.loads(original)
    view = doc["data"]["describe"]["methods"]["crad"]["view"]
    view[0][1][1][1] = "[red]styled[/red] \x1b[2Jcleared"  # the description field
    path.write_text(json.dumps(doc))
    try:
        proc = cli(built["env"], "describe", "crad", cwd=built["cwd"])
    finally:
        path.write_bytes(original)
    assert proc.returncode == 0, proc.stderr
    assert "description: [red]styled[/red] cleared" in proc.stdout and "\x1b" not in proc.stdout


@pytest.mark.slow  # processes
def test_key_follows_plugins_and_their_sources(tmp_path):
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    site = tmp_path / "site"
    site.mkdir()
    env = cli_env(tmp_path / "cache", site)
    base = key_now(env, cwd)
    assert base == key_now(env, cwd)  # stable
    module = write_plugin(site)
    installed = key_now(env, cwd)
    assert installed != base
    st = module.stat()
    os.utime(module, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))  # touched, same content
    touched = key_now(env, cwd)
    assert touched != installed
    (site / "hflb_index_demo-0.1.dist-info" / "entry_points.txt").write_text(
        "[hfl_bench.methods]\ndemo = hflb_index_demo\nother = hflb_index_demo:IndexDemo\n")
    assert key_now(env, cwd) not in (base, installed, touched)  # a new entry point
    for f in (site / "hflb_index_demo-0.1.dist-info").iterdir():  # uninstalled: the package stays on the path
        f.unlink()
    (site / "hflb_index_demo-0.1.dist-info").rmdir()
    assert key_now(env, cwd) == base


@pytest.mark.slow  # processes
def test_a_stale_index_is_never_shown(tmp_path):
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    module = write_plugin(tmp_path / "site", doc="First text.")
    env = cli_env(tmp_path / "cache", tmp_path / "site")
    first = cli(env, "list", "methods", "--json", cwd=cwd)
    assert first.returncode == 0, first.stderr
    assert {r["name"]: r for r in json.loads(first.stdout)}["index-demo"]["description"] == "First text."
    module.write_text(PLUGIN.format(doc="Second text."))
    st = module.stat()
    os.utime(module, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    second = cli(env, "describe", "index-demo", "--json", cwd=cwd)
    assert second.returncode == 0, second.stderr
    assert json.loads(second.stdout)["description"] == "Second text."


# --------------------------------------------------------------------------- in process


def test_the_key_watches_built_in_sources():
    import hfl_bench.cli.catalog
    import hfl_bench.methods.crad
    import hfl_bench.pools
    import hfl_bench.tasks.digits

    files = {Path(f[0]).resolve() for f in metadata_index._key_parts()["files"]}
    for module in (hfl_bench.methods.crad, hfl_bench.tasks.digits, hfl_bench.pools, hfl_bench.cli.catalog):
        assert Path(module.__file__).resolve() in files, module
    ours = [d for d in metadata_index._key_parts()["distributions"] if len(d) > 4 and d[2] == "hfl-bench"]
    assert ours and ["hfl_bench.methods", "builtin", "hfl_bench.methods"] in ours[0][4]


def test_bypass_variable(monkeypatch):
    for value, on in (("", True), ("0", True), ("1", False), ("yes", False)):
        monkeypatch.setenv(metadata_index.DISABLE_ENV, value)
        assert metadata_index.enabled() is on
    monkeypatch.delenv(metadata_index.DISABLE_ENV)
    assert metadata_index.enabled()


def test_index_lives_under_the_cache_folder(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    path = metadata_index.index_path()
    assert path.parent == tmp_path / "hfl-bench" / "index" and path.suffix == ".json"


@pytest.mark.parametrize("content", [
    b"", b"\xff\xfe garbage", b"[1, 2]", b"null", b'{"format": 1}', b"[" * 100000,
    json.dumps({"format": True, "key": "k", "data": {}}).encode(),
    json.dumps({"format": metadata_index.FORMAT + 1, "key": "k", "data": {}}).encode(),
    json.dumps({"format": metadata_index.FORMAT, "key": "other", "data": {}}).encode(),
    json.dumps({"format": metadata_index.FORMAT, "key": "k", "data": []}).encode(),
])
def test_unusable_files_are_ignored(monkeypatch, tmp_path, content):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    path = metadata_index.index_path()
    path.parent.mkdir(parents=True)
    path.write_bytes(content)
    assert metadata_index.read("k") is None


def test_written_index_reads_back(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert metadata_index.read("k") is None  # no file
    assert metadata_index.write("k", {"a": [1, "b"]})
    assert metadata_index.read("k") == {"a": [1, "b"]}
    assert metadata_index.read("other") is None
    assert [p.name for p in metadata_index.index_path().parent.iterdir()] == [metadata_index.index_path().name]


def test_unwritable_cache_is_no_error(monkeypatch, tmp_path):
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "file"))  # a file where the folder would be
    assert metadata_index.write("k", {}) is False


@pytest.mark.parametrize("view", [
    None, {}, [["fields", [["a"]]]], [["fields", [["a", 1]]]], [["heading", 3]], [["script", "x"]],
    [["table", {"title": "t", "styled_title": True, "columns": [], "rows": [["x"]]}]],
    [["table", {"title": "t", "styled_title": "yes", "columns": [], "rows": []}]],
    [["table", {"title": "t", "styled_title": True, "rows": [],
                "columns": [{"header": "h", "no_wrap": True, "overflow": "crop", "one_line": True}]}]],
    [["line"]],
])
def test_malformed_views_are_refused(view):
    assert not catalog.valid_view(view)
    with pytest.raises(catalog.Stale):
        catalog._checked({"json": [], "view": view}, list)


def test_views_built_here_are_valid():
    view = catalog.params_view("m", [{"name": "lam", "type": "float", "default": 0.5, "help": "h"}])
    assert catalog.valid_view(view) and catalog.valid_view(catalog.params_view("m", []))
    assert catalog.valid_view(catalog.list_view("tasks", [{"name": "t", "input": [1, 8, 8], "origin": "o"}]))


def test_stored_user_error_is_raised_as_one():
    with pytest.raises(catalog.StoredError, match="bad task"):
        catalog._checked({"error": "bad task"}, list)


@pytest.mark.parametrize("data", [{}, {"names": []}, {"names": {k: [] for k in catalog.KINDS}},
                                  {"names": {"methods": [1]}, "list": {}, "pools": {}, "describe": {}}])
def test_malformed_index_data_is_stale(data):
    with pytest.raises(catalog.Stale):
        catalog.Indexed(data)
