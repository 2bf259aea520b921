"""Record upgrades (``hfl_bench.record.upgrade``): every committed record reaches the current shape,
valid as 1.7; each step fills what its version added as the readers read its absence; the frozen
card table agrees with today's cards; and an upgraded record reads, in every fallback the results
layer has for old records, exactly as the raw record does today (so wiring the upgrade into the
loader changes no view)."""

from __future__ import annotations

import copy
import gzip
import json
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest

from hfl_bench.record import upgrade as ru
from hfl_bench.record.io import load_schema
from hfl_bench.record.upgrade import STEPS, UpgradeError, upgrade

REPO = Path(__file__).resolve().parent.parent
COMMITTED = ("leaderboards", "tests/pins")


def _committed() -> list[tuple[Path, dict]]:
    out = []
    for folder in COMMITTED:
        for path in sorted((REPO / folder).rglob("*.json")):
            record = json.loads(path.read_text(encoding="utf-8"))
            if isinstance(record, dict) and "schema_version" in record:  # plot sidecars, pins: not records
                out.append((path, record))
    return out


@pytest.fixture(scope="module")
def committed() -> list[tuple[Path, dict]]:
    records = _committed()
    assert len(records) > 1900 and {r["schema_version"] for _, r in records} >= {"1.0", "1.2", "1.6", "1.7"}
    return records


@pytest.fixture(scope="module")
def older(committed) -> list[tuple[Path, dict]]:
    """The committed records written before 1.7: the ones the steps fill (records written since,
    at 1.8 and later, carry what 1.7 asked for and are not in the golden file)."""
    return [(p, r) for p, r in committed if _version(r) < (1, 7)]


def _version(record: dict) -> tuple[int, ...]:
    return tuple(int(part) for part in record["schema_version"].split("."))


def _as_1_7(record: dict) -> dict:
    return {**record, "schema_version": "1.7"}


# --------------------------------------------------------------------------- committed records
def test_every_committed_record_upgrades_to_the_current_shape_valid_as_1_7(committed, older):
    validator = jsonschema.Draft202012Validator(load_schema("1.7"))
    problems = []
    for path, record in committed:
        before = copy.deepcopy(record)
        up = upgrade(record)
        assert up["schema_version"] == ru.CURRENT == "1.11"
        assert record == before, f"{path}: upgrade changed its input"
    for path, record in older:  # the 1.7 ones are themselves (next test), validated as 1.7 elsewhere
        problems += [f"{path.relative_to(REPO)}: {'/'.join(map(str, e.absolute_path))}: {e.message}"
                     for e in validator.iter_errors(_as_1_7(upgrade(record)))]
    assert not problems, "\n".join(problems[:20])


def test_a_1_7_record_upgrades_to_itself_but_for_the_version(committed):
    current = [r for _, r in committed if r["schema_version"] == "1.7"]
    assert len(current) > 700
    for record in current:
        assert upgrade(record) == {**record, "schema_version": "1.11"}
    assert upgrade(upgrade(current[0])) == upgrade(current[0])  # a 1.11 record is read as it is


def test_the_headline_a_1_7_run_wrote_is_the_one_the_step_computes(committed):
    """``headline_block`` is the writer's rule (``records.headline_block``): on every committed 1.7
    record with metrics, recomputing it from the record gives the block the run wrote."""
    checked = 0
    for path, record in committed:
        metrics = record.get("metrics")
        if record["schema_version"] == "1.7" and isinstance(metrics, dict):
            assert ru.headline_block(record) == metrics["headline"], path
            checked += 1
    assert checked > 700


# --------------------------------------------------------------------------- views unchanged
def _single_architecture(record: dict) -> object:
    """``results.setting.single_architecture`` as a reader of upgraded records can say it, with no
    registry: the assignment, else the method's need, else the frozen pool table."""
    pool = record.get("arch_pool") if isinstance(record.get("arch_pool"), dict) else {}
    assignment = pool.get("assignment")
    if isinstance(assignment, list) and assignment and all(isinstance(a, str) for a in assignment):
        return len(set(assignment)) == 1
    if record["method"].get("single_architecture") is True:
        return True
    return ru.pool_homogeneous(pool.get("name") or (record.get("config") or {}).get("pool"))


GOLDEN = REPO / "tests" / "golden" / "older-records-read-at-38a633c.json.gz"
# records moved to the archive after the golden file was made (their cells rerun): the golden file
# knows them by the path they had then
MOVED = {"leaderboards/archive/fedsocket-1.1/digits/": "leaderboards/reproduced/digits/",
         "leaderboards/archive/uncommitted-changes/digits/": "leaderboards/reproduced/digits/"}


def former(path: Path) -> str:
    """``path`` (absolute) as the golden file names it: relative to the repository, before any move."""
    where = str(path.relative_to(REPO))
    for now, then in MOVED.items():
        if where.startswith(now):
            return then + where[len(now):]
    return where


@pytest.fixture(scope="module")
def golden() -> dict:
    """How the code before the upgrade (38a633c, whose readers fell back on the registry) read every
    committed record older than 1.7 (tests/golden/make_older_records.py made it)."""
    return json.loads(gzip.decompress(GOLDEN.read_bytes()))


def test_upgraded_older_records_read_as_the_fallbacks_read_the_raw_ones(older, golden):
    """For each committed record written before 1.7, what the readers before the upgrade computed
    from the raw record through their fallbacks (the registry's cards and pools, the absent
    version, preset, headline ...) is what today's readers read of the upgraded record, and what
    it states."""
    from hfl_bench.results import figures as hl
    from hfl_bench.results import setting as st
    from hfl_bench.results.loading import Loaded

    assert ru.UNKNOWN == st.UNKNOWN and golden["n_records"] == len(older)
    runs = 0
    for path, raw in older:
        up = upgrade(raw)
        where = former(path)
        then = golden["per_record"][where]
        assert Loaded(path, up).method_version == (raw["method"].get("version") if isinstance(raw["method"].get(
            "version"), str) else None), where
        assert (hl.headline_value(up), hl.headline_basis(up), st.headline_of(up)) == (
            then["headline"], then["basis"], then["headline_of"]), where
        for metric in ("global_acc", "local_acc"):
            for clients in ("headline", "all", "honest", "faulty", "recipients", "donors"):
                assert (st.final_figure(up, metric, clients), st.figure(up, metric, clients)) == (
                    st.final_figure(raw, metric, clients), st.figure(raw, metric, clients)), (where, metric, clients)
        if raw["source"]["kind"] == "published":  # no run: its method section is left as it is
            assert up["method"] == raw["method"] and up["metrics"] == raw["metrics"], where
            continue
        assert (st.transfer_setting(up), st.peer_data_setting(up), st.predictor_setting(up),
                st.single_architecture(up)) == (then["transfer"], then["peer_data"], then["predictor"],
                                                 then["single_architecture"]), where
        runs += 1
        method = up["method"]
        assert (method["transfer"], method["peer_data"], method["predictor"]) == (
            then["transfer"], then["peer_data"], then["predictor"]), where
        assert _single_architecture(up) == then["single_architecture"], where
        assert st.budget_class(up) == st.budget_class(raw) and method["preset"] is None, where
        head = up["metrics"]["headline"]
        assert (head["value"], head["statistic"], head["clients"]) == (then["headline"], then["basis"],
                                                                        then["headline_of"]), where
        assert up["metrics"]["selected"] == {"round": raw["selection"]["round"],
                                             **{k: raw["metrics"].get(k) for k in
                                                ("global_acc", "local_acc", "mean_val_acc")}}, where
        assert "final" in up["metrics"] or "final" not in raw["metrics"], where  # never computed here
    assert runs > 1100


def test_the_frozen_pools_stand_for_the_registry_on_every_committed_record(committed):
    """Whether a run was one architecture reads, on the upgraded record, the assignment, the
    method's stated need, then the frozen pool table: what today's reader, with the registry, says
    of the raw record, at every version (a failed 1.7 record has no assignment: the pool decides)."""
    from hfl_bench.results.setting import single_architecture

    runs = [(p, r) for p, r in committed if r["source"]["kind"] != "published"]
    assert any(r["schema_version"] == "1.7" and not (r.get("arch_pool") or {}).get("assignment") for _, r in runs)
    for path, raw in runs:
        assert _single_architecture(upgrade(raw)) == single_architecture(raw), path


def test_the_leaderboard_of_upgraded_records_is_the_one_before_the_upgrade(older, golden, monkeypatch):
    """The whole board (``leaderboard show --format json``'s content) built from the upgraded
    records equals the one the code before the upgrade built from the raw records (its registry
    fallbacks): groups, sections, predictors, headlines, finals, published matches.

    One rule changed on purpose since the golden file was made, and is put back here so that the
    comparison still isolates the upgrade: which copy of a seed recorded twice counts (then the
    newest, then the greatest path; now the earliest written, issue 62), and the line that names
    the copies (``copies_note``, new), left out."""
    from hfl_bench.results import grouping, robustness
    from hfl_bench.results.board import build_board
    from hfl_bench.results.loading import Loaded
    from hfl_bench.results.render import board_json

    earliest_first = grouping.precedence

    def newest_first(r):  # the rule at 38a633c, as a key whose smallest counts
        instant, path = earliest_first(r)
        instant = float("-inf") if instant == float("inf") else instant  # an unparsed date: the oldest then
        return (-instant, tuple(-ord(ch) for ch in path) + (1,))

    monkeypatch.setattr(grouping, "precedence", newest_first)
    monkeypatch.setattr(robustness, "precedence", newest_first)
    up = [Loaded(Path(former(p)), upgrade(r)) for p, r in older]
    board = json.loads(json.dumps(board_json(build_board(up)), sort_keys=True))
    for group in board["groups"]:
        assert group.pop("copies_note") == "" or group["n_duplicates"] > 0
    assert board == golden["board"]


# --------------------------------------------------------------------------- the frozen table
def test_the_frozen_cards_agree_with_todays_cards_at_their_current_version():
    """The one place this test reads the registry: each built-in method's card at its current
    version, and each built-in pool, as the table has them; the predictor rule as the method's
    ``predictor()`` gives it for each value the rule names and at the defaults."""
    import dataclasses

    from hfl_bench.pools import get_pool
    from hfl_bench.registry import METHODS, POOLS
    from hfl_bench.testing import builtin_methods, builtin_names

    assert set(builtin_methods()) == set(ru.BUILTIN_CARDS)
    for name in builtin_methods():
        cls = METHODS.get(name)
        card = cls.card
        frozen = ru.card_for(name, card.version)
        assert frozen is not None, f"{name} {card.version} is not in BUILTIN_CARDS"
        assert (frozen["transfer"], frozen["single_architecture"], frozen["peer_data"]) == (
            card.transfer, card.single_architecture, card.peer_data), name
        rule = frozen["predictor"]
        assert rule["default"] == card.predictor == cls(cls.Params()).predictor(), name
        fields = {f.name for f in dataclasses.fields(cls.Params)}
        for value, predictor in rule.get("values", {}).items():
            assert rule["param"] in fields, name
            assert cls(cls.Params(**{rule["param"]: value})).predictor() == predictor, (name, value)
            assert ru.predictor_of(frozen, {rule["param"]: value}) == predictor
    assert set(builtin_names(POOLS)) == set(ru.BUILTIN_POOLS)
    for name in builtin_names(POOLS):
        assert ru.pool_homogeneous(name) == get_pool(name).homogeneous, name


def test_the_table_covers_every_method_version_of_a_committed_record_that_does_not_state_its_card(older):
    runs = [r["method"] for _, r in older if r["source"]["kind"] != "published"]
    missing = {(m["name"], m.get("version")) for m in runs if ru.card_for(m["name"], m.get("version")) is None}
    assert not missing


# --------------------------------------------------------------------------- each step
def _run(version: str, method: dict | None = None, **fields) -> dict:
    """A minimal run record of ``version``."""
    return {"schema_version": version, "record_id": "0" * 16, "source": {"kind": "reproduced", "citation": None},
            "status": "ok", "method": {"name": "local", "fidelity": "paper", **(method or {})},
            "task": {"name": "digits"}, "metrics": {"unit": "percent", "global_acc": 50.0, "local_acc": 60.0,
                                                     "mean_val_acc": 55.0},
            "selection": {"rule": "best_mean_local_val", "round": 7}, **fields}


def _step(version: str, record: dict) -> dict:
    """``STEPS[version]`` on ``record``, checked pure (its input unchanged) and to name the next version."""
    before = copy.deepcopy(record)
    out = STEPS[version](record)
    assert record == before, f"step {version} changed its input"
    order = [*STEPS, ru.CURRENT]
    assert out["schema_version"] == order[order.index(version) + 1]
    return out


def test_the_steps_are_one_per_version_in_order():
    assert list(STEPS) == ["1.0", "1.1", "1.2", "1.3", "1.4", "1.5", "1.6", "1.7", "1.8", "1.9", "1.10"]
    from hfl_bench.record.io import CURRENT_VERSION, SCHEMA_VERSIONS

    assert (*STEPS, CURRENT_VERSION) == SCHEMA_VERSIONS


def test_1_0_to_1_1_adds_no_plugins_it_cannot_know():
    out = _step("1.0", _run("1.0"))
    assert "plugins" not in out and out == {**_run("1.0"), "schema_version": "1.1"}


def test_1_1_to_1_2_reads_an_absent_method_version_as_unversioned():
    assert _step("1.1", _run("1.1"))["method"]["version"] is None
    assert _step("1.1", _run("1.1", {"version": "1.0"}))["method"]["version"] == "1.0"
    history = [{"round": r, "global_acc": 40.0 + r} for r in range(4)]
    assert "final" not in _step("1.1", _run("1.1", history=history))["metrics"]  # the readers compute none


@pytest.mark.parametrize("version", ["1.2", "1.3", "1.4"])
def test_the_steps_that_add_only_settings_no_old_run_had_change_only_the_version(version):
    record = _run(version, {"version": "1.0"}, faults={"spec": "label-noise:0.5", "selection": "honest"})
    assert _step(version, record) == {**record, "schema_version": ru.VERSIONS[ru.VERSIONS.index(version) + 1]}


def test_1_5_to_1_6_fills_the_card_and_the_protocol_budget():
    fedavg = _step("1.5", _run("1.5", {"name": "fedavg", "version": None}))["method"]
    assert (fedavg["transfer"], fedavg["single_architecture"], fedavg["preset"]) == ("none", True, None)
    fedmd = _step("1.5", _run("1.5", {"name": "fedmd", "version": "1.0"}))["method"]
    assert (fedmd["transfer"], fedmd["single_architecture"]) == ("public-labelled", False)
    crad = _step("1.5", _run("1.5", {"name": "crad", "version": "1.0+crad-accuracy-1.1"}))["method"]
    assert crad["transfer"] == "none"  # a run version reads its method's part
    # a method the table does not know (a plugin's, or a version it never had): the readers' unknown
    for method in ({"name": "my-plugin-method", "version": "1.0"}, {"name": "fedcc", "version": "9.9"}):
        out = _step("1.5", _run("1.5", method))["method"]
        assert (out["transfer"], out["single_architecture"], out["preset"]) == ("unknown", None, None)
    stated = _step("1.5", _run("1.5", {"name": "fedmd", "version": "1.0", "transfer": "public-unlabelled",
                                        "preset": "paper"}))["method"]
    assert (stated["transfer"], stated["preset"]) == ("public-unlabelled", "paper")  # what a record says wins
    published = _run("1.5", {"name": "fedmd", "version": None}, source={"kind": "published", "citation": {}})
    assert _step("1.5", published)["method"] == published["method"]
    assert _step("1.5", {**_run("1.5"), "method": None})["method"] is None


def test_1_6_to_1_7_fills_peer_data_the_predictor_at_the_hyperparameters_and_the_headline():
    def method(**m):
        return _step("1.6", _run("1.6", {"version": "1.1", **m}))["method"]

    assert (method(name="dfml")["peer_data"], method(name="dfml")["predictor"]) == (True, "stored snapshot")
    assert method(name="dfml", hparams={"eval": "current"})["predictor"] == "live model"
    assert method(name="dfml", hparams={"eval": "peak"})["predictor"] == "stored snapshot"
    assert method(name="fedsocket", hparams={"endpoint": "joint"})["predictor"] == "joint"
    assert method(name="fedsocket", hparams={"endpoint": "private"})["predictor"] == "live model"
    assert method(name="fedproto", version="1.0")["predictor"] == "prototype classifier"
    assert (method(name="fedmd")["peer_data"], method(name="fedmd")["predictor"]) == (False, "live model")
    unknown = method(name="my-plugin-method")
    assert (unknown["peer_data"], unknown["predictor"]) == (False, "unknown")
    assert method(name="dfml", peer_data=False, predictor="live model")["predictor"] == "live model"

    metrics = _step("1.6", _run("1.6", {"version": "1.0"}))["metrics"]
    assert list(metrics)[:2] == ["headline", "selected"]
    assert metrics["headline"] == {"figure": "global_acc", "statistic": "selected", "clients": "all",
                                   "value": 50.0, "window": None}
    assert metrics["selected"] == {"round": 7, "global_acc": 50.0, "local_acc": 60.0, "mean_val_acc": 55.0}
    final = {"rounds": 10, "first_round": 21, "last_round": 30, "global_acc": 52.5, "local_acc": 61.0}
    record = _run("1.6", {"version": "1.0"})
    record["metrics"] = {**record["metrics"], "final": final}
    assert _step("1.6", record)["metrics"]["headline"] == {
        "figure": "global_acc", "statistic": "final", "clients": "all", "value": 52.5,
        "window": {"rounds": 10, "first_round": 21, "last_round": 30}}


def test_1_6_to_1_7_headline_is_the_honest_clients_or_the_recipients():
    honest = _run("1.6", {"version": "1.0"}, faults={"spec": "byzantine:0.25"})
    honest["metrics"] = {**honest["metrics"], "honest": {"n_clients": 3, "global_acc": 48.0}}
    assert ru.headline_block(_step("1.6", honest)) == {"figure": "global_acc", "statistic": "selected",
                                                       "clients": "honest", "value": 48.0, "window": None}
    multimodal = _run("1.6", {"version": "1.0"}, modalities={"recipients": [0, 1], "donors": [2]})
    multimodal["metrics"] = {**multimodal["metrics"], "recipients": {
        "global_acc": 30.0, "final": {"rounds": 3, "first_round": 1, "last_round": 3, "global_acc": 31.0}}}
    head = _step("1.6", multimodal)["metrics"]["headline"]
    assert (head["clients"], head["statistic"], head["value"]) == ("recipients", "final", 31.0)
    no_recipients = _run("1.6", {"version": "1.0"}, modalities={"recipients": [], "donors": [0, 1]})
    assert _step("1.6", no_recipients)["metrics"]["headline"]["clients"] == "all"


def test_1_6_to_1_7_leaves_what_has_no_selected_round_or_no_run():
    unselected = _run("1.6", {"version": "1.0"}, selection={"rule": "best_mean_local_val", "round": None})
    assert "selected" not in _step("1.6", unselected)["metrics"]
    failed = {**_run("1.6", {"version": "1.0"}), "status": "failed", "metrics": None}
    assert _step("1.6", failed)["metrics"] is None
    published = _run("1.6", {"version": None}, source={"kind": "published", "citation": {}},
                     selection={"rule": "as_published", "round": None})
    out = _step("1.6", published)
    assert out["method"] == published["method"] and out["metrics"] == published["metrics"]


def test_1_7_to_1_8_changes_only_the_version():
    record = _run("1.7", {"version": "1.0", "peer_data": False, "predictor": "live model"})
    assert _step("1.7", record) == {**record, "schema_version": "1.8"}


def test_1_8_to_1_9_changes_only_the_version_and_fills_no_flops():
    # FLOPs an old run never counted stay absent (not recorded), never zero
    record = _run("1.8", {"version": "1.0", "peer_data": False, "predictor": "live model"}, cost={"bytes_total": 8})
    out = _step("1.8", record)
    assert out == {**record, "schema_version": "1.9"} and "flops" not in out.get("cost", {})


def test_1_10_to_1_11_changes_only_the_version_and_fills_no_clock_inputs():
    # a 1.10 clock entry never recorded each client's FLOPs and bytes: they stay absent (reclock refuses it)
    entry = {"start_s": 0.0, "seconds": 2.0, "clients": [2.0, None], "dropped": []}
    record = _run("1.10", {"version": "1.0", "peer_data": False, "predictor": "live model"},
                  history=[{"round": 1, "clock": entry}])
    out = _step("1.10", record)
    assert out == {**record, "schema_version": "1.11"} and set(out["history"][0]["clock"]) == set(entry)


def test_the_unknowns_of_a_plugin_method_are_what_1_7_cannot_hold():
    """A method the table does not know gets the readers' unknowns; the 1.7 schema holds none of
    transfer "unknown", single_architecture null, predictor "unknown" (1.8's schema is to widen
    them): the fields the report lists."""
    up = upgrade(_run("1.5", {"name": "my-plugin-method", "version": "1.0"}))
    validator = jsonschema.Draft202012Validator(load_schema("1.7"))
    bad = sorted(path for e in validator.iter_errors(_as_1_7(up))
                 if (path := "/".join(map(str, e.absolute_path))).startswith("method"))  # the minimal task is not
    assert bad == ["method/predictor", "method/single_architecture", "method/transfer"]
    # ... and the 1.8 model does: the upgraded method section is valid as it is
    from hfl_bench.record.model import record_problems

    assert not [p for p in record_problems(up) if p.startswith("method")]


# --------------------------------------------------------------------------- the entry point
@pytest.mark.parametrize("raw, said", [
    ({"record_id": "x"}, "has no schema_version"),
    ({"schema_version": "2.0"}, "has schema_version '2.0'"),
    ({"schema_version": 1.7}, "has schema_version 1.7"),
    (["not", "a", "record"], "not list"),
])
def test_a_record_of_no_known_version_is_refused_in_one_sentence(raw, said):
    with pytest.raises(UpgradeError) as e:
        upgrade(raw)
    assert said in str(e.value) and "\n" not in str(e.value) and isinstance(e.value, ValueError)


def test_upgrade_runs_every_step_from_the_records_own_version():
    up = upgrade(_run("1.0", {"name": "dfml"}))
    assert up["schema_version"] == "1.11"
    assert {k: up["method"][k] for k in ("version", "transfer", "single_architecture", "preset", "peer_data",
                                         "predictor")} == {
        "version": None, "transfer": "none", "single_architecture": False, "preset": None, "peer_data": True,
        "predictor": "stored snapshot"}


def test_importing_the_module_imports_neither_torch_nor_numpy():
    code = ("import sys, hfl_bench.record.upgrade\n"
            "print(sorted(m for m in ('torch', 'numpy', 'hfl_bench.results', 'hfl_bench.registry')\n"
            "             if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    assert out.stdout.strip() == "[]"
