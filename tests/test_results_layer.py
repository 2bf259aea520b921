"""The results layer: the leaderboard and the plots read one folder the same way (one loader, one
seed-grouping rule, the config's own non-semantic fields), and the record schema is package data,
and so are the HTML leaderboard's templates, style sheet and script: found through
importlib.resources, not through a path into the source checkout."""

from __future__ import annotations

import csv
import dataclasses
import fnmatch
import hashlib
import importlib.resources
import io
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from hfl_bench.cli import app
from hfl_bench.config import NON_SEMANTIC, RunConfig, config_hash
from hfl_bench.record.io import load_schema, schema_file
from hfl_bench.recording import SCHEMA_VERSION
from hfl_bench.results import plots
from hfl_bench.results.board import build_board, named_records
from hfl_bench.results.loading import load_records

REPO = Path(__file__).resolve().parent.parent
LEADERBOARDS = REPO / "leaderboards"


def record(seed: int, status: str = "ok", date: str = "2026-01-01T00:00:00+00:00", acc: float = 60.0,
           **config) -> dict:
    """A small hand-written (valid) record of crad on digits; ``config`` changes RunConfig fields."""
    cfg = dataclasses.asdict(RunConfig(method="crad", task="digits", pool="cpu", partition="dirichlet", alpha=0.3,
                                       clients=4, rounds=2, seed=seed, **config))
    chash = config_hash(cfg)
    return {
        "schema_version": SCHEMA_VERSION,
        "record_id": hashlib.sha256(f"{chash}|{seed}|reproduced".encode()).hexdigest()[:16],
        "source": {"kind": "reproduced", "citation": None},
        "status": status,
        "error": None if status == "ok" else "boom",
        "method": {"name": "crad", "fidelity": "paper", "version": "1.0", "hparams": {"lam": 0.7}, "transfer": "none",
                   "single_architecture": False, "peer_data": False, "predictor": "live model"},
        "task": {"name": "digits", "version": "1", "num_classes": 10, "n_train": 1000, "n_test": 200},
        "arch_pool": {"name": "cpu", "assignment": ["mlp_small"] * 4},
        "partition": {"scheme": "dirichlet", "params": {"alpha": 0.3}, "seed": seed, "hash": f"p{seed}",
                      "heldout_fraction": 0.2},
        "federation": {"n_clients": 4, "clients_per_round": 4, "rounds": 2, "local_epochs": 1, "topology": "p2p"},
        "selection": {"rule": "best_mean_local_val", "round": 2 if status == "ok" else None},
        "metrics": ({"unit": "percent", "global_acc": acc + seed, "local_acc": 80.0, "mean_val_acc": 85.0}
                    if status == "ok" else None),
        "cost": {"bytes_sent_per_client_per_round": 1000.0},
        "config": cfg,
        "config_hash": chash,
        "date": date,
    }


@pytest.fixture
def folder(tmp_path) -> Path:
    """Setting A: seeds 0 and 1, seed 2 with another checkpoint_every (not part of the setting),
    seed 1 run twice with another checkpoint_every (the earlier-written counts), a failed seed 3.
    Setting B: A with another learning rate (part of the setting)."""
    assert "checkpoint_every" in NON_SEMANTIC
    records = {
        "a0.json": record(0),
        # listed first, but written later: first-found-wins would keep it
        "a1-first.json": record(1, date="2026-02-01T00:00:00+00:00"),
        "a1-second.json": record(1, acc=70.0, checkpoint_every=0),
        "a2-checkpointed.json": record(2, checkpoint_every=1),
        "a3-failed.json": record(3, status="failed"),
        "b0.json": record(0, lr=0.05),
    }
    root = tmp_path / "records"
    root.mkdir()
    for name, r in records.items():
        (root / name).write_text(json.dumps(r))
    return root


def _names(paths) -> list[str]:
    return [Path(p).name for p in paths]


def leaderboard_groups(folder: Path) -> dict[str, list[str]]:
    loaded, _ = load_records([folder])
    records, _ = named_records(loaded)
    return {g.group_id: _names(r.path for r in g.ok) for g in build_board(records).groups}


def plot_groups(folder: Path) -> dict[str, list[str]]:
    loaded, _ = load_records([folder])
    groups, _ = plots.drawable_groups(loaded)
    return {g.group_id: _names(r.path for r in g.ok) for g in groups}


def test_leaderboard_and_plots_group_the_same_records_the_same_way(folder):
    board, drawn = leaderboard_groups(folder), plot_groups(folder)
    assert board == drawn
    a = config_hash(dataclasses.asdict(RunConfig(method="crad", task="digits", pool="cpu", partition="dirichlet",
                                                 alpha=0.3, clients=4, rounds=2)))
    assert board[f"{a}@1.0"] == ["a0.json", "a1-second.json", "a2-checkpointed.json"]  # seeds 0, 1 (earliest), 2
    assert [names for gid, names in board.items() if gid != f"{a}@1.0"] == [["b0.json"]]


def test_records_of_two_method_versions_never_share_a_group(folder):
    """Same config hash, another method version (or none: a record from before versions): its own
    group, its own leaderboard row, never averaged in; a group over two commits is marked."""
    a0 = json.loads((folder / "a0.json").read_text())
    newer = json.loads(json.dumps(a0)) | {"date": "2026-03-01T00:00:00+00:00"}
    newer["method"]["version"] = "1.1"
    older = json.loads(json.dumps(a0))
    del older["method"]["version"]
    older["schema_version"] = "1.1"
    (folder / "a0-v1.1.json").write_text(json.dumps(newer))
    (folder / "a0-unversioned.json").write_text(json.dumps(older))
    for name, sha in (("a0.json", "aaaa"), ("a2-checkpointed.json", "bbbb")):
        r = json.loads((folder / name).read_text())
        r["code"] = {"git_sha": sha, "git_dirty": False}
        (folder / name).write_text(json.dumps(r))
    board, drawn = leaderboard_groups(folder), plot_groups(folder)
    assert board == drawn
    a = config_hash(dataclasses.asdict(RunConfig(method="crad", task="digits", pool="cpu", partition="dirichlet",
                                                 alpha=0.3, clients=4, rounds=2)))
    assert board[f"{a}@1.1"] == ["a0-v1.1.json"] and board[a] == ["a0-unversioned.json"]
    assert board[f"{a}@1.0"] == ["a0.json", "a1-second.json", "a2-checkpointed.json"]
    result = CliRunner().invoke(app, ["leaderboard", "show", str(folder), "--format", "csv"])
    rows = {r["group_id"]: r for r in csv.DictReader(io.StringIO(result.stdout))}
    assert rows[f"{a}@1.1"]["method_version"] == "1.1" and rows[a]["method_version"] == ""
    result = CliRunner().invoke(app, ["leaderboard", "show", str(folder), "--format", "markdown"])
    lines = [line for line in result.stdout.splitlines() if line.startswith("| crad |")]
    versions = sorted(line.split(" | ")[1] for line in lines)
    assert versions[0] == "-" and "1.0 (3 commits)" in versions and "1.1" in versions
    ranked = CliRunner().invoke(app, ["leaderboard", "show", str(folder), "--rank", "--format", "json"])
    assert ranked.exit_code == 0, ranked.output


def test_a_group_over_two_kinds_of_processor_is_marked(folder):
    """Two CPUs round differently (README: Reproducibility across hosts): a group whose seeds name
    two kinds is marked like one over two commits; records that name none are not counted."""
    cpu = {"cpu": "Xeon", "cpu_isa": "avx2 fma", "torch_cpu_capability": "AVX2"}
    for name, env in (("a0.json", cpu), ("a1-second.json", {**cpu, "cpu_isa": "avx2 avx512f fma",
                                                            "torch_cpu_capability": "AVX512"})):
        r = json.loads((folder / name).read_text())
        r["environment"] = {**r.get("environment", {}), **env}
        (folder / name).write_text(json.dumps(r))
    a = config_hash(dataclasses.asdict(RunConfig(method="crad", task="digits", pool="cpu", partition="dirichlet",
                                                 alpha=0.3, clients=4, rounds=2)))
    shown = CliRunner().invoke(app, ["leaderboard", "show", str(folder), "--format", "json"])
    group = next(g for g in json.loads(shown.stdout)["groups"] if g["group_id"] == f"{a}@1.0")
    assert len(group["processors"]) == 2 and group["n_seeds"] == 3  # the third names none: not counted
    result = CliRunner().invoke(app, ["leaderboard", "show", str(folder), "--format", "markdown"])
    assert any(line.startswith("| crad | 1.0 (2 processors) |") for line in result.stdout.splitlines()), result.stdout
    r = json.loads((folder / "a1-second.json").read_text())
    r["environment"] = {**r.get("environment", {}), **cpu}  # the same kind as a0: no mark
    (folder / "a1-second.json").write_text(json.dumps(r))
    result = CliRunner().invoke(app, ["leaderboard", "show", str(folder), "--format", "markdown"])
    # one version in every row: said above the table, unmarked
    assert "Same in every row: version 1.0, " in result.stdout and "processors" not in result.stdout


def test_the_commands_agree_too(folder, tmp_path):
    """The same through the real CLI: ``leaderboard show --json`` and ``plot --json`` sidecars."""
    result = CliRunner().invoke(app, ["leaderboard", "show", str(folder), "--format", "json"])
    assert result.exit_code == 0, result.output
    board = {g["config_hash"]: sorted(_names(g["records"])) for g in json.loads(result.stdout)["groups"]}
    result = CliRunner().invoke(app, ["plot", "bytes", str(folder), "--out", str(tmp_path / "plots"), "--json"])
    assert result.exit_code == 0, result.output
    [written] = json.loads(result.stdout)["written"]
    sources = json.loads(Path(written["sources"]).read_text())
    drawn: dict[str, list[str]] = {}
    for r in sources["records"]:
        drawn.setdefault(r["config_hash"], []).append(Path(r["file"]).name)
    assert board == {h: sorted(files) for h, files in drawn.items()}
    reasons = {Path(s["file"]).name: s["reason"] for s in sources["skipped"]}
    assert reasons["a1-first.json"].startswith("duplicate record_id")  # the later run of seed 1
    assert "status 'failed'" in reasons["a3-failed.json"]


def test_plot_labels_leave_out_every_non_semantic_field(folder):
    assert plots.NOT_SETTING >= set(NON_SEMANTIC)


# ----------------------------------------------------------------------------- the schema


def test_schema_is_package_data_found_through_importlib_resources():
    resource = schema_file()
    assert resource == (importlib.resources.files("hfl_bench.record") / "schema"
                        / f"record-{SCHEMA_VERSION}.schema.json")
    assert resource.is_file()
    assert load_schema()["properties"]["schema_version"]["const"] == SCHEMA_VERSION
    assert not (LEADERBOARDS / "schema").exists()  # one copy, in the package


@pytest.mark.slow  # a process
def test_schema_is_found_outside_the_checkout(tmp_path):
    """A copy of the package alone (as an installed wheel lays it out) still finds its schema."""
    shutil.copytree(REPO / "hfl_bench", tmp_path / "site" / "hfl_bench",
                    ignore=shutil.ignore_patterns("__pycache__"))
    code = ("import hfl_bench.record.io as r, json; "
            "print(json.dumps([r.__file__, str(r.schema_file()), r.load_schema()['$id']]))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          env={"PYTHONPATH": str(tmp_path / "site"), "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr
    module, schema, schema_id = json.loads(proc.stdout)
    assert module.startswith(str(tmp_path)) and schema.startswith(str(tmp_path))
    assert schema_id == f"hfl-bench/record-{SCHEMA_VERSION}"


def package_data_globs(package: str) -> list[str]:
    """The [tool.setuptools.package-data] globs of ``package``, as pyproject.toml lists them."""
    line = next(x for x in (REPO / "pyproject.toml").read_text().splitlines() if x.startswith(f'"{package}" = '))
    return json.loads(line.split("=", 1)[1])


@pytest.mark.parametrize("package, folder", [("record", "schema"), ("results", "templates"), ("results", "static")])
def test_pyproject_ships_every_data_file(package, folder):
    """A wheel holds only the data files the globs name: every schema, template, style sheet and
    script of the package must match one (or an installed package could not build the site)."""
    root = REPO / "hfl_bench" / package
    files = sorted(p.relative_to(root).as_posix() for p in (root / folder).iterdir() if p.name != "__pycache__")
    assert files
    globs = package_data_globs(f"hfl_bench.{package}")
    unshipped = [f for f in files if not any(fnmatch.fnmatchcase(f, g) for g in globs)]
    assert not unshipped


@pytest.mark.slow  # a process
def test_the_site_is_built_outside_the_checkout(tmp_path):
    """A copy of the package alone (as an installed wheel lays it out) reads its templates, style
    sheet and script through importlib.resources and writes a site that uses them."""
    shutil.copytree(REPO / "hfl_bench", tmp_path / "site" / "hfl_bench", ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "records").mkdir()
    (tmp_path / "records" / "r.json").write_text(json.dumps(record(0)))
    code = ("import json; from pathlib import Path; import hfl_bench.results.html as h; "
            "h.build_site(Path('out'), [Path('records')]); "
            "print(json.dumps([str(h.RESOURCES), sorted(h.templates()), h.SCRIPT, h.STYLE]))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          env={"PYTHONPATH": str(tmp_path / "site"), "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr
    resources, names, script, style = json.loads(proc.stdout)
    assert resources.startswith(str(tmp_path))
    assert names == ["_row.html", "base.html", "group.html", "index.html"]
    index = (tmp_path / "out" / "index.html").read_text()
    assert f"<script>{script}</script>" in index and f"<style>\n{style}</style>" in index
    assert "sortBy" in script and "table.sortable" in style


@pytest.mark.slow  # validates every committed record (about 2,000)
def test_validate_the_shipped_records_through_the_cli():
    pytest.importorskip("jsonschema")
    folders = [LEADERBOARDS / "reproduced", LEADERBOARDS / "archive" / "first-wave", LEADERBOARDS / "published"]
    result = CliRunner().invoke(app, ["leaderboard", "validate", *map(str, folders)])
    n = sum(len(list(f.rglob("*.json"))) for f in folders)
    assert result.exit_code == 0, result.output
    assert f"{n} of {n} records valid" in result.stdout
