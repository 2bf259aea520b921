"""Offline re-clocking (``hfl-bench reclock``, ``hfl_bench.reclock``): a run under one device preset
re-clocked to another equals, clock section and every round's clock entry to the float, a real run
under the other preset with the same seed, for both assignments and both ways; everything else is
the source record's; refusals are one line and exit 2 with nothing written; the write is atomic;
the re-clocked record validates and the views name where it came from. All through the real CLI on
records it wrote (digits, 4 clients, 2 rounds)."""

from __future__ import annotations

import copy
import errno
import hashlib
import json
from pathlib import Path

import pytest

from hfl_bench import clock
from hfl_bench.record.check import problems
from hfl_bench.record.model import record_problems
from hfl_bench.record.upgrade import upgrade

from helpers import REAL_RECORD, invoke_cli

PROTOCOL = ("--task", "digits", "--rounds", "2", "--eval-every", "1", "--clients", "4", "-q")
CLOCK_KEYS = ("devices", "device_assignment")


def _run(out: Path, method: str, *args: str) -> Path:
    result, stdout, _ = invoke_cli("run", *PROTOCOL, "--method", method, "--out", str(out), *args)
    assert result.exit_code == 0, stdout
    (path,) = out.glob("*.json")
    return path


def _read(path: Path) -> dict:
    return json.loads(path.read_text())


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("reclock")
    return {
        "uniform": _run(base / "uniform", "crad", "--devices", "uniform"),
        "mixed": _run(base / "mixed", "crad", "--devices", "mixed-phones"),
        "mixed-by-size": _run(base / "mixed-by-size", "crad", "--devices", "mixed-phones",
                              "--device-assignment", "by-size"),
        "local-uniform": _run(base / "local-uniform", "local", "--devices", "uniform"),
    }


def _reclock(*args: str):
    result, stdout, stderr = invoke_cli("reclock", *args)
    return result, (stderr or stdout).strip()


def _without_clock(record: dict) -> dict:
    out = copy.deepcopy(record)
    out.pop("clock")
    for h in out["history"]:
        h.pop("clock", None)
    for key in CLOCK_KEYS:
        out["config"].pop(key)
    return out


# ----------------------------------------------------------------------------- exact


@pytest.mark.parametrize("source, preset, assignment, real", [
    ("uniform", "mixed-phones", "random", "mixed"),
    ("uniform", "mixed-phones", "by-size", "mixed-by-size"),
    ("mixed", "uniform", "random", "uniform"),  # and back
])
def test_a_reclocked_run_equals_a_real_run_on_those_devices(runs, tmp_path, source, preset, assignment, real):
    result, message = _reclock(str(runs[source]), "--devices", preset, "--device-assignment", assignment,
                               "--out", str(tmp_path))
    assert result.exit_code == 0, message
    (path,) = tmp_path.glob("*.json")
    assert path.name == runs[real].name  # the record file name a run on those devices writes
    new, want, old = _read(path), _read(runs[real]), _read(runs[source])
    assert old["clock"] != want["clock"]  # the two device settings time the rounds differently
    section = dict(new["clock"])
    provenance = section.pop("reclocked")
    assert section == want["clock"]  # every device, per-round time and the total, to the float
    assert [h.get("clock") for h in new["history"]] == [h.get("clock") for h in want["history"]]
    assert all(h["clock"]["flops"] for h in new["history"][1:])  # each round's inputs recorded
    assert {k: new["config"][k] for k in CLOCK_KEYS} == {k: want["config"][k] for k in CLOCK_KEYS}
    assert (new["config_hash"], new["record_id"]) == (want["config_hash"], want["record_id"])
    assert _without_clock(new) == _without_clock(old)  # everything else is the source record's
    assert provenance["record_id"] == old["record_id"] and provenance["file"] == runs[source].name
    assert provenance["sha256"] == hashlib.sha256(runs[source].read_bytes()).hexdigest()
    assert (provenance["profile"], provenance["assignment"]) == (old["clock"]["profile"], old["clock"]["assignment"])
    assert len(provenance["git_sha"] or "0" * 40) == 40 and record_problems(new) == []


def test_replay_without_inputs_or_with_drops_is_refused():
    dev = clock.Device("toy", 1e9, 1e5, 1e5)
    c = clock.Clock(clock.Profile("toy", (dev,)), [dev, dev], "random", 0, None, [0.0, 0.0])
    entry = c.round_entry([0], [], [1e9, 0.0], [1e5, 0.0], [0.0, 0.0], [])
    assert entry["clients"] == [2.0, None] and entry["flops"] == [1e9, None] and entry["up_bytes"] == [1e5, None]
    assert c.replay([entry, entry]) == [entry, {**entry, "start_s": 2.0}]
    with pytest.raises(ValueError, match="does not hold each client's FLOPs"):
        c.replay([{k: v for k, v in entry.items() if k != "flops"}])
    with pytest.raises(ValueError, match="dropped clients"):
        c.replay([{**entry, "dropped": [1]}])


# ----------------------------------------------------------------------------- validated, shown


def test_a_reclocked_record_validates_and_the_views_name_its_source(runs, tmp_path):
    out = tmp_path / "mixed-phones"
    result, message = _reclock(str(runs["uniform"]), str(runs["local-uniform"]), "--devices", "mixed-phones",
                               "--out", str(out))
    assert result.exit_code == 0, message
    assert len(list(out.glob("*.json"))) == 2
    result, stdout, _ = invoke_cli("leaderboard", "validate", str(out))
    assert result.exit_code == 0, stdout
    crad = out / runs["uniform"].name
    result, stdout, _ = invoke_cli("show", str(crad))
    assert result.exit_code == 0 and "re-clocked from" in stdout and runs["uniform"].name in stdout, stdout
    result, stdout, _ = invoke_cli("show", str(runs["mixed"]))
    assert result.exit_code == 0 and "mixed-phones, random" in stdout and "re-clocked" not in stdout
    result, stdout, _ = invoke_cli("show", str(crad), "--json")
    assert json.loads(stdout)["clock"]["reclocked"]["file"] == runs["uniform"].name
    result, stdout, _ = invoke_cli("leaderboard", "show", str(out), "--clock", "--format", "json")
    assert result.exit_code == 0, stdout
    groups = {g["method"]: g for g in json.loads(stdout)["groups"]}
    (seed,) = groups["crad"]["clock"]["per_seed"]
    assert seed["sim_time"] == _read(runs["mixed"])["clock"]["total_s"]  # read as any clocked record
    assert seed["reclocked_from"]["record_id"] == _read(runs["uniform"])["record_id"]
    result, stdout, _ = invoke_cli("leaderboard", "rankings", str(out), "--format", "json")
    assert result.exit_code == 0, stdout
    (table,) = json.loads(stdout)["tables"]
    assert table["devices"] == "mixed-phones, random"
    assert [m["reclocked_seeds"] for m in table["methods"]] == [1, 1]
    assert any(n.startswith("re-clocked: 2 of 2") for n in table["notes"])
    result, stdout, _ = invoke_cli("leaderboard", "html", str(out), "--out", str(tmp_path / "site"))
    assert result.exit_code == 0, stdout
    pages = [p.read_text() for p in (tmp_path / "site" / "groups").glob("*.html")]
    sha = hashlib.sha256(runs["uniform"].read_bytes()).hexdigest()
    assert len(pages) == 2 and all("<th>re-clocked from</th>" in p for p in pages)  # records and provenance
    assert any(f"{runs['uniform'].name} (record {_read(runs['uniform'])['record_id']}, sha256 {sha}" in p
               for p in pages)


# ----------------------------------------------------------------------------- refused


def _edited(runs, tmp_path, edit) -> Path:
    record = _read(runs["uniform"])
    edit(record)
    path = tmp_path / "in" / runs["uniform"].name
    path.parent.mkdir()
    path.write_text(json.dumps(record, indent=1))
    return path


def _deadline(r):
    r["clock"].update(deadline_s=1000.0, rule=clock.RULE)


def _no_inputs(r):  # a 1.10 record: its clock entries predate each client's FLOPs and bytes (1.11)
    r["schema_version"] = "1.10"
    for h in r["history"][1:]:
        del h["clock"]["flops"], h["clock"]["up_bytes"], h["clock"]["down_bytes"]


def test_the_1_11_fields_are_refused_by_the_frozen_1_10_schema(runs):
    """A record's clock entry inputs and ``clock.reclocked`` are 1.11's: a record stamped 1.10 that
    has them fails its own (frozen) schema, and without them it is valid and upgrades unchanged."""
    record = _read(runs["uniform"])
    assert record["schema_version"] == "1.11" and problems(record, frozen=True) == []
    stamped = {**record, "schema_version": "1.10"}
    assert any("flops" in p and "history" in p for p in problems(stamped, frozen=True))
    older = copy.deepcopy(stamped)
    _no_inputs(older)
    assert problems(older, frozen=True) == []
    assert upgrade(older) == {**older, "schema_version": "1.11"}  # nothing to fill


def _invalid(r):
    r["metrics"]["global_acc"] = 150.0


@pytest.mark.parametrize("edit, args, said", [
    (None, (), "has no clock"),
    (_deadline, (), "ran with --deadline 1000"),
    (_no_inputs, (), "do not record each client's FLOPs and bytes"),
    (_invalid, (), "not a valid record: metrics"),
    (lambda r: None, ("--deadline", "5"), "--deadline 5: a deadline drops late clients"),
    (lambda r: None, ("--device-assignment", "fastest"), "--device-assignment must be random or by-size"),
])
def test_refusals_are_one_line_exit_2_and_write_nothing(runs, tmp_path, edit, args, said):
    path = REAL_RECORD if edit is None else _edited(runs, tmp_path, edit)
    if edit is _deadline:  # a record that validates: refused for its deadline, not as broken
        assert record_problems(_read(path)) == []
    out = tmp_path / "out"
    result, message = _reclock(str(runs["mixed"]), str(path), "--devices", "mixed-phones", *args, "--out", str(out))
    assert result.exit_code == 2 and said in message and len(message.splitlines()) == 1, message
    assert not out.exists() or not list(out.iterdir())  # the good record before it was not written either


def test_a_bad_target_preset_and_writing_over_the_source_are_refused(runs, tmp_path):
    result, message = _reclock(str(runs["uniform"]), "--devices", "no-such-preset", "--out", str(tmp_path))
    assert result.exit_code == 2 and "neither a preset" in message and len(message.splitlines()) == 1, message
    before = runs["uniform"].read_bytes()
    result, message = _reclock(str(runs["uniform"]), "--devices", "mixed-phones", "--out", str(runs["uniform"].parent))
    assert result.exit_code == 2 and "would overwrite the record being re-clocked" in message, message
    assert runs["uniform"].read_bytes() == before


def test_the_write_is_atomic(runs, tmp_path, monkeypatch):
    out = tmp_path / "out"
    target = out / runs["uniform"].name
    out.mkdir()
    target.write_text("an earlier file\n")

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr("hfl_bench.paths.os.fsync", full)
    result, message = _reclock(str(runs["uniform"]), "--devices", "mixed-phones", "--out", str(out))
    assert result.exit_code == 2 and "No space left on device" in message and len(message.splitlines()) == 1, message
    assert target.read_text() == "an earlier file\n" and [p.name for p in out.iterdir()] == [target.name]
