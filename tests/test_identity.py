"""One identity per run (issue 28): however a run's settings and hyperparameters were typed, it has
one config hash, one record file, one checkpoint and one leaderboard group; records written before
the canonical form are mapped at read time; a checkpoint of another method or task version is
refused in one line."""

from __future__ import annotations

import copy
import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from hfl_bench import checkpoint, engine, paths
from hfl_bench import recording as records
from hfl_bench.cli.run import build_config
from hfl_bench.config import (
    LEGACY_FIELDS,
    ConfigError,
    RunConfig,
    canonical_params,
    config_hash,
    recorded_config,
    type_hints,
)
from hfl_bench.record import legacy_params
from hfl_bench.record.identity import canonical_config_dict, canonical_hash
from hfl_bench.record.legacy_params import LEGACY_PARAMS
from hfl_bench.results.board import build_board
from hfl_bench.results.loading import load_records

from helpers import invoke_cli

REPO = Path(__file__).resolve().parent.parent
REAL = REPO / "leaderboards" / "archive" / "first-wave" / "digits" / "digits__crad__da48ac8fb4f0dad1__seed0.json"


def _record_name(tmp_path: Path, yaml_values: dict | None, sets: list[str], **flags) -> str:
    config_file = None
    if yaml_values is not None:
        config_file = tmp_path / "config.yaml"
        config_file.write_text(yaml.safe_dump(yaml_values))
    cfg = build_config(config_file, dict(method="crad", out=str(tmp_path), **flags), sets)
    return paths.record_path(engine.load_task(cfg)[1]).name


# (YAML settings, --set items, flags): each the default run of crad on digits (lam 0.7, lr 0.05)
SPELLINGS = {
    "nothing": (None, [], {}),
    "set 0.7": (None, ["lam=0.7"], {}),
    "set 0.70": (None, ["lam=0.70"], {}),
    "set 7e-1": (None, ["lam=7e-1"], {}),
    "yaml 0.7": ({"method_params": {"lam": 0.7}}, [], {}),
    "yaml lr 0.05": ({"lr": 0.05}, [], {}),
    "yaml lr 5e-2": ({"lr": 5e-2}, [], {}),
    "flag lr": (None, [], {"lr": 0.050}),
    "yaml temperature 2": ({"method_params": {"temperature": 2}}, [], {}),
}


@pytest.mark.parametrize("spelling", list(SPELLINGS)[1:])
def test_one_run_has_one_record_file_however_it_was_typed(tmp_path, spelling):
    yaml_values, sets, flags = SPELLINGS[spelling]
    assert _record_name(tmp_path, yaml_values, sets, **flags) == _record_name(tmp_path, None, [])


def test_other_values_still_have_other_hashes_and_are_recorded_typed(tmp_path):
    default = _record_name(tmp_path, None, [])
    typed = {_record_name(tmp_path, None, ["lam=0.5"]), _record_name(tmp_path, None, ["lam=5e-1"]),
             _record_name(tmp_path, {"method_params": {"lam": 0.5}}, [])}
    assert len(typed) == 1 and default not in typed
    cfg = engine.load_task(build_config(None, dict(method="crad"), ["lam=5e-1", "temperature=2.0"]))[1]
    assert cfg.method_params == {"lam": 0.5}  # typed; temperature 2.0 is crad's default, so left out
    assert _record_name(tmp_path, {"lr": 1}, []) == _record_name(tmp_path, None, [], lr=1.0)  # floats by value


def test_a_whole_number_for_a_float_hyperparameter_hashes_as_its_float(tmp_path):
    """YAML (a suite's or --config's) ``lam: 1`` is ``--set lam=1.0``: one run, one record file,
    recorded as the float (a dict compares 1 and 1.0 equal, which once kept the int and its hash)."""
    assert _record_name(tmp_path, {"method_params": {"lam": 1}}, []) == _record_name(tmp_path, None, ["lam=1.0"])
    cfg = engine.load_task(RunConfig(method="crad", task="digits", method_params={"lam": 1}))[1]
    assert cfg.method_params == {"lam": 1.0} and isinstance(cfg.method_params["lam"], float)


def test_a_bad_hyperparameter_is_still_reported_by_the_run(tmp_path):
    result, _, _ = invoke_cli("run", "--method", "crad", "--set", "lam=abc", "--out", str(tmp_path), "-q")
    assert result.exit_code == 2 and "lam='abc' is not a valid float" in result.output
    assert "Traceback" not in result.output


def _old_style(record: dict, params: dict, seed: int) -> dict:
    """A record as the code before canonical hyperparameters wrote it for ``--set`` ``params``."""
    r = copy.deepcopy(record)
    r["config"]["method_params"] = params
    r["config"]["seed"] = seed
    r["seeds"] = {k: seed for k in r["seeds"]}
    r["config_hash"] = config_hash(r["config"])
    r["record_id"] = f"{seed:016x}"
    return r


def test_old_records_typed_otherwise_are_mapped_into_one_group(tmp_path):
    base = json.loads(REAL.read_text())
    spellings = [{}, {"lam": "0.7"}, {"lam": "7e-1"}, {"lam": 0.7}]
    for seed, params in enumerate(spellings):
        (tmp_path / f"r{seed}.json").write_text(json.dumps(_old_style(base, params, seed)))
    stored = {json.loads(p.read_text())["config_hash"] for p in tmp_path.glob("*.json")}
    assert len(stored) == 4  # each spelling hashed differently in the files ...
    board = build_board(load_records([tmp_path])[0])
    assert [g.seeds for g in board.groups] == [[0, 1, 2, 3]]  # ... and are one run when read
    assert board.groups[0].config_hash == base["config_hash"]  # the hash without --set: unchanged
    result, stdout, _ = invoke_cli("leaderboard", "show", str(tmp_path), "--format", "json")
    assert result.exit_code == 0 and [g["n_seeds"] for g in json.loads(stdout)["groups"]] == [4]


@pytest.mark.slow  # reads every committed record (about 2,000)
def test_committed_records_keep_their_hashes():
    loaded, _ = load_records([REPO / "leaderboards"])
    changed = [r.path for r in loaded if r.kind == "reproduced" and r.config_hash != r.record.get("config_hash")]
    assert loaded and not changed


def test_committed_records_with_removed_settings_keep_their_hash_and_file_name():
    """The committed records carry ``config.vmap`` / ``config.lockstep`` (``config.LEGACY_FIELDS``,
    settings since removed, never hashed): read back into a RunConfig, each config still hashes to
    the record's config_hash, so its record file name is the one it has."""
    checked = legacy = 0
    for path in sorted((REPO / "leaderboards").rglob("*.json")):
        record = json.loads(path.read_text())
        cfg = record.get("config") if isinstance(record, dict) else None
        if not isinstance(cfg, dict):
            continue
        if set(LEGACY_FIELDS) & set(cfg):
            legacy += 1
            with pytest.raises(TypeError):  # no longer settings: read back through recorded_config
                RunConfig(**cfg)
        back = recorded_config(cfg)
        chash = config_hash(dataclasses.asdict(back))
        assert chash == record["config_hash"], path
        assert f"{paths.record_stem(back.task, back.method, chash, back.seed)}.json" == path.name
        checked += 1
    assert checked >= 100 and legacy >= 100


def test_a_checkpoint_with_removed_settings_resumes_and_new_records_omit_them(tmp_path):
    cfg = engine.load_task(RunConfig(method="local", task="digits", clients=4, rounds=3, seed=0,
                                     checkpoint_every=2, out=str(tmp_path)))[1]
    record = records.build_record(cfg, engine.run(cfg))  # leaves its round-2 checkpoint
    assert not set(LEGACY_FIELDS) & (set(record["config"]) | set(record["federation"]))
    assert record["federation"]["cuda_graphs"] is False  # a CPU run
    path = paths.checkpoint_path(cfg)
    state = checkpoint.read(path)
    state["config"].update(vmap="on", lockstep="auto")  # as written before the settings were removed
    checkpoint.write(path, state)
    assert engine.Simulation(cfg).load_checkpoint(path) == 2


def _checkpointed(tmp_path: Path) -> tuple[RunConfig, Path]:
    cfg = engine.load_task(RunConfig(method="local", task="digits", clients=4, rounds=3, seed=0,
                                     checkpoint_every=2, out=str(tmp_path)))[1]
    engine.run(cfg)  # leaves its round-2 checkpoint (no record is written by engine.run)
    return cfg, paths.checkpoint_path(cfg)


RESUME = ["run", "--method", "local", "--clients", "4", "--rounds", "3", "--seed", "0", "--checkpoint-every", "2",
          "--resume", "-q"]


@pytest.mark.parametrize("change, needle", [
    ({"method": "0.0-other"}, "method version '0.0-other'"),
    ({"task": "0.0-other"}, "task version '0.0-other'"),
    (None, "does not record the method and task versions"),
])
def test_a_checkpoint_of_another_method_or_task_version_is_refused(tmp_path, change, needle):
    cfg, path = _checkpointed(tmp_path)
    state = checkpoint.read(path)
    # the card's version (a method class declares none of its own: reading it there gave None)
    assert state["versions"]["method"] == "1.0" and set(state["versions"]) == {"method", "task"}
    if change is None:
        del state["versions"]  # as an older hfl-bench wrote it
    else:
        state["versions"].update(change)
    state["code"]["git_sha"] = None  # as a non-editable install writes it: no commit to compare
    checkpoint.write(path, state)
    result, _, _ = invoke_cli(*RESUME, "--out", str(tmp_path))
    text = " ".join(result.output.split())
    assert result.exit_code == 2 and needle in text, result.output
    assert "Traceback" not in result.output and not list(tmp_path.glob("*.json"))


# ----------------------------------------------------------------------------- mapping without the registry
def test_old_records_typed_otherwise_map_to_the_hash_without_set():
    """The records of ``test_old_records_typed_otherwise_are_mapped_into_one_group``, read by
    ``canonical_hash`` alone (no board, no validation): four stored hashes, one canonical one."""
    base = json.loads(REAL.read_text())
    assert "version" not in base["method"]  # a schema 1.0 record: unversioned, read against the table
    records = [_old_style(base, params, seed) for seed, params in enumerate([{}, {"lam": "0.7"}, {"lam": "7e-1"},
                                                                          {"lam": 0.7}, {"lam": "0.70"}])]
    assert len({r["config_hash"] for r in records}) == 5
    assert {canonical_hash(r, r["config_hash"]) for r in records} == {base["config_hash"]}
    other = _old_style(base, {"lam": "0.5"}, 9)  # another value stays another run, typed
    typed = config_hash({**other["config"], "method_params": {"lam": 0.5}})
    assert canonical_hash(other, other["config_hash"]) == typed


def _field_spellings(tag: str, default):
    """A few ways an old ``--set`` or YAML spelled a field of type ``tag``: the default as typed and
    as its value, another value, one the type refuses."""
    if tag == "float":
        return [str(default), f"{default:e}", default, int(default) if default == int(default) else default * 10,
                str(default * 2 + 1), "abc"]
    if tag == "int":
        return [str(default), default, str(default + 1), "1.5"]
    if tag == "bool":
        return ["true" if default else "false", default, not default, "maybe"]
    if tag in ("float | None", "int | None"):
        return ["none", None, "3", 3, "abc"]
    return [default, default + "-other"]


def _canonical_or_refused(params_cls, raw: dict, method: str):
    try:
        return canonical_params(params_cls, raw, method)
    except ConfigError:
        return "refused"


def test_the_frozen_table_canonicalizes_as_the_registry_wherever_a_method_is_unchanged():
    """For every method of the table and every spelling of each field, the table's stand-in Params
    give what the live ``Params`` give; where a field changed since 81932ac^ (type, default,
    removed), the method's live version is newer than the table's, so a record written against the
    change is never read against the table (``legacy_params.covers``)."""
    from hfl_bench.method_api import get_method_class  # the one place the registry is allowed

    compared = changed = 0
    for method, (version, fields) in LEGACY_PARAMS.items():
        live = get_method_class(method)
        live_fields = {f.name: f for f in dataclasses.fields(live.Params)}
        hints = type_hints(live.Params)
        table_cls = legacy_params.params_class(method)
        for name, tag, default in fields:
            f = live_fields.get(name)
            if f is None or hints[name] != legacy_params.TYPES[tag] or f.default != default:
                assert tuple(map(int, live.card.version.split("."))) > tuple(map(int, version.split("."))), \
                    f"{method}.{name} changed without a version bump: the table no longer says what it meant"
                assert not legacy_params.covers(method, live.card.version)
                changed += 1
                continue
            for value in _field_spellings(tag, default):
                raw = {name: value}
                by_table = _canonical_or_refused(table_cls, raw, method)
                assert by_table == _canonical_or_refused(live.Params, raw, method), (method, raw)
                compared += 1
        every_default = {name: str(default) for name, _, default in fields}
        assert canonical_params(table_cls, every_default, method) == {}  # each default as typed: left out
    assert len(LEGACY_PARAMS) == 14 and compared > 300 and changed == 10  # fedcc, fedmd: 1; fedsocket, naive-shared: 4


def test_a_record_of_a_version_after_the_table_keeps_its_hyperparameters():
    """FedSocket 1.2's committed ``extractor=random-conv`` runs: random-conv was the default at
    81932ac^, so the table would leave it out and merge them into the pretrained default's group;
    their version is newer than the table's, so they keep their hyperparameters and their hash."""
    fedsocket = [json.loads(p.read_text()) for p in sorted((REPO / "leaderboards").rglob("*__fedsocket__*.json"))]
    kept = [r for r in fedsocket if r.get("config", {}).get("method_params") == {"extractor": "random-conv"}]
    assert kept and {r["method"]["version"] for r in kept} == {"1.2"}
    for r in kept:
        assert canonical_hash(r, r["config_hash"]) == r["config_hash"]
        assert canonical_config_dict(r["config"], "1.2")["method_params"] == {"extractor": "random-conv"}
        assert canonical_config_dict(r["config"], "1.0")["method_params"] == {}  # the table's default


def test_a_method_the_table_does_not_know_keeps_its_hyperparameters_whatever_is_installed():
    """ds-fl was added after 81932ac (installed now, era_temperature 0.1 its default), a plugin's
    method may or may not be installed: neither is mapped, so the board groups the same way on any
    installation."""
    base = json.loads(REAL.read_text())
    for method, params in [("ds-fl", {"era_temperature": "0.1"}), ("some-plugin", {"lam": "0.7"})]:
        assert method not in LEGACY_PARAMS
        cfg = {**base["config"], "method": method, "method_params": params}
        assert canonical_config_dict(cfg)["method_params"] == params
        assert canonical_config_dict(cfg, "1.0")["method_params"] == params
        record = {**base, "config": cfg, "config_hash": config_hash(cfg)}
        assert canonical_hash(record, record["config_hash"]) == record["config_hash"]


def test_a_refused_or_unknown_hyperparameter_is_kept_as_recorded():
    cfg = json.loads(REAL.read_text())["config"]
    for params in ({"lam": "abc"}, {"lam": "0.7", "not_a_field": 1}):
        assert canonical_config_dict({**cfg, "method_params": params})["method_params"] == params


def test_importing_identity_imports_neither_torch_nor_the_method_registry():
    code = ("import sys, hfl_bench.record.identity\n"
            "print(sorted(m for m in ('torch', 'numpy', 'hfl_bench.method_api', 'hfl_bench.methods',\n"
            "                         'hfl_bench.registry') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    assert out.stdout.strip() == "[]"
