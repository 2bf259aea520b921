"""The typed record model (hfl_bench/record/model/, schema 1.11: the 1.7 shape, cost.flops and clock): every
committed 1.7 record (and every published one) validates at 1.11 and dumps back exactly, as do records
the CLI writes now; it
agrees with the results layer's validator on sampled records and on mutations of them, refuses what
it is stricter about (unknown fields, open sections it types); its JSON Schema is valid 2020-12 and
accepts the records; and it imports neither torch nor numpy."""

from __future__ import annotations

import copy
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from hfl_bench.record import model as rm
from hfl_bench.record.io import load_schema

REPO = Path(__file__).resolve().parents[1]
ROOTS = (REPO / "leaderboards", REPO / "tests" / "pins")
REPRODUCED = REPO / "leaderboards" / "reproduced"
BASE_OK = REPRODUCED / "robustness" / "digits__fml__13829d826b50ee71__seed0.json"  # faults
BASE_MODALITIES = REPRODUCED / "multimodal" / "digits-mnist1d__fml__69ecc000a22f548e__seed0.json"
BASE_FAILED = REPRODUCED / "label-skew" / "mnist1d__fedcc__b9b9e20baacaae51__seed4.json"
PUBLISHED = REPO / "leaderboards" / "published"


def _committed(version: str, kind: str | None = None) -> list[tuple[Path, str, dict]]:
    found = []
    for root in ROOTS:
        for path in sorted(root.rglob("*.json")):
            text = path.read_text(encoding="utf-8")
            try:
                record = json.loads(text)
            except ValueError:
                continue
            if isinstance(record, dict) and record.get("schema_version") == version and (
                    kind is None or (record.get("source") or {}).get("kind") == kind):
                found.append((path, text, record))
    return found


@pytest.fixture(scope="module")
def records_17():
    found = _committed("1.7")
    assert len(found) >= 700  # about 760: a glob that finds none must not pass
    return found


@pytest.fixture(scope="module")
def published():
    found = _committed("1.2", "published")
    assert len(found) >= 50
    return found


def at_current(record: dict) -> dict:
    return {**record, "schema_version": rm.CURRENT_VERSION}


def test_every_committed_17_record_validates_at_the_current_version_and_dumps_back_exactly(records_17, published):
    problems, changed = {}, []
    for path, text, record in [*records_17, *published]:
        raw = at_current(record)
        try:
            out = rm.Record.model_validate(raw).model_dump(mode="json", exclude_unset=True)
        except ValueError:
            problems[str(path.relative_to(REPO))] = rm.record_problems(raw)[:3]
            continue
        assert out == raw
        # the same keys in the same order, so the file a writer makes is byte for byte today's
        if json.dumps(out) != json.dumps(raw):
            changed.append(path)
        elif text == json.dumps(record, indent=1) + "\n":
            written = json.dumps({**out, "schema_version": record["schema_version"]}, indent=1, allow_nan=False)
            assert written + "\n" == text
    assert problems == {}
    assert changed == []


def test_parse_returns_the_typed_record_and_refuses_with_every_problem():
    raw = at_current(json.loads(BASE_MODALITIES.read_text()))
    record = rm.parse(raw)
    assert json.dumps(rm.dump(record)) == json.dumps(raw)
    assert isinstance(record.metrics, rm.Metrics) and isinstance(record.metrics.recipients, rm.ClientGroup)
    assert type(record.metrics.donors) is type(record.metrics.recipients) is rm.ClientGroup  # one group type
    assert record.metrics.recipients.n_clients == len(record.modalities.recipients)
    assert record.history[3].round == 3 and record.history[3].phases["evaluation"] >= 0
    bad = at_current(json.loads(BASE_OK.read_text()))
    bad["metrics"]["per_client"][3]["global_acc"] = 101.0
    bad["federation"]["n_clients"] = "10"
    bad["config"]["seed"] = "0"
    with pytest.raises(rm.RecordInvalid) as e:
        rm.parse(bad)
    assert isinstance(e.value, ValueError)
    assert e.value.problems == rm.record_problems(bad)
    assert "metrics/per_client/3/global_acc: accuracy 101.0 is not within [0, 100]" in e.value.problems
    assert any(p.startswith("federation/n_clients: ") for p in e.value.problems)
    # a record-level check is reported beside the field errors
    assert "config/seed: must be an integer in [0, 2^63), got '0'" in e.value.problems
    assert rm.record_problems([1]) == ["(record): must be an object, got [1]"]
    assert rm.record_problems({**bad, "schema_version": "1.7"})[0].startswith("schema_version: ")


def _change(base: dict, path: tuple, value) -> dict:
    r = copy.deepcopy(base)
    node = r
    for key in path[:-1]:
        node = node[key]
    if value is KeyError:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return r


def _cases(ok: dict, modal: dict, failed: dict, pub: dict) -> list[tuple[str, dict]]:
    """Records one change away from a valid one (tests/test_leaderboard.py's and
    tests/test_hostile_records.py's mutations and more), each with schema_version 1.7."""
    c = [
        # tests/test_leaderboard.py
        ("global_acc 150", ok, ("metrics", "global_acc"), 150.0),
        ("global_acc -1", ok, ("metrics", "global_acc"), -1),
        ("global_acc string", ok, ("metrics", "global_acc"), "85.0"),
        ("global_acc bool", ok, ("metrics", "global_acc"), True),
        ("global_acc null", ok, ("metrics", "global_acc"), None),
        ("global_acc missing", ok, ("metrics", "global_acc"), KeyError),
        ("metrics null", ok, ("metrics",), None),
        ("status", ok, ("status",), "finished"),
        ("fidelity missing", ok, ("method", "fidelity"), KeyError),
        ("fidelity other", ok, ("method", "fidelity"), "faithful"),
        ("record_id int", ok, ("record_id",), 5),
        ("num_classes 1", ok, ("task", "num_classes"), 1),
        ("num_classes 2.0", ok, ("task", "num_classes"), 2.0),
        ("fingerprint good", ok, ("task", "data_fingerprint"), "0123456789abcdef"),
        ("fingerprint bad", ok, ("task", "data_fingerprint"), "../etc"),
        ("history acc 101", ok, ("history", 1, "global_acc"), 101.0),
        ("endpoint acc 200", ok, ("metrics", "extra_endpoints"), {"q": {"global_acc": 200}}),
        ("per-arch acc", ok, ("metrics", "per_arch_global_acc", next(iter(ok["metrics"]["per_arch_global_acc"]))),
         100.5),
        ("topology", ok, ("federation", "topology"), "mesh"),
        ("source kind", ok, ("source", "kind"), "other"),
        ("published n_seeds", pub, ("metrics", "n_seeds"), 3),
        ("published two figures", pub, ("metrics", "global_acc"), 89.44),
        ("published no figure", pub, ("metrics", "local_acc"), KeyError),
        ("published no citation key", pub, ("source", "citation", "key"), KeyError),
        ("published no setting", pub, ("setting",), KeyError),
        ("published no selection", pub, ("selection",), KeyError),
        # tests/test_hostile_records.py: the seed
        ("seed list", ok, ("config", "seed"), [0, 1]),
        ("seed string", ok, ("config", "seed"), "0"),
        ("seed null", ok, ("config", "seed"), None),
        ("seed bool", ok, ("config", "seed"), True),
        ("seed negative", ok, ("config", "seed"), -1),
        ("seed 2^63", ok, ("config", "seed"), 2**63),
        ("seed 2^63 - 1", ok, ("config", "seed"), 2**63 - 1),
        ("failed seed null", failed, ("config", "seed"), None),
        ("method_params list", ok, ("config", "method_params"), [1]),
        ("method_params null", ok, ("config", "method_params"), None),
        # accuracies at several depths
        ("per_client acc 101", ok, ("metrics", "per_client", 3, "global_acc"), 101),
        ("honest acc -1", ok, ("metrics", "honest", "global_acc"), -1),
        ("final acc 101", ok, ("metrics", "final", "local_acc"), 101.0),
        ("client curve acc 101", ok, ("history", -1, "client_global_acc", 0), 101.0),
        ("group round acc -1", ok, ("history", -1, "honest", "local_acc"), -1.0),
        ("seen_unseen acc 101", ok, ("metrics", "seen_unseen", "per_client", 0, "seen_acc"), 101.0),
        ("per-class acc string", ok, ("metrics", "per_class_global_acc", 0), "high"),
        ("headline value 100", ok, ("metrics", "headline", "value"), 100),
        # an ok record without its figures
        ("ok selected round null", ok, ("selection", "round"), None),
        ("ok local_acc null", ok, ("metrics", "local_acc"), None),
        ("ok mean_val_acc missing", ok, ("metrics", "mean_val_acc"), KeyError),
        ("ok no metrics", ok, ("metrics",), None),
        # missing required fields at several depths
        ("task name missing", ok, ("task", "name"), KeyError),
        ("rounds missing", ok, ("federation", "rounds"), KeyError),
        ("unit missing", ok, ("metrics", "unit"), KeyError),
        ("plugin git_dirty missing", ok, ("plugins", 0, "git_dirty"), KeyError),
        ("budget server missing", ok, ("cost", "budget", "totals", "server"), KeyError),
        ("honest missing", ok, ("metrics", "honest"), KeyError),
        ("honest n_clients missing", ok, ("metrics", "honest", "n_clients"), KeyError),
        ("recipients missing", modal, ("metrics", "recipients"), KeyError),
        ("recipients endpoints missing", modal, ("metrics", "recipients", "endpoints"), KeyError),
        ("history mean_val_acc missing", ok, ("history", 0, "mean_val_acc"), KeyError),
        ("faults spec missing", ok, ("faults", "spec"), KeyError),
        # wrong types
        ("n_clients string", ok, ("federation", "n_clients"), "10"),
        ("history round 1.5", ok, ("history", 0, "round"), 1.5),
        ("assignment int", ok, ("arch_pool", "assignment", 0), 5),
        ("cuda_graphs int", ok, ("federation", "cuda_graphs"), 1),
        ("hparams list", ok, ("method", "hparams"), []),
        ("config list", ok, ("config",), []),
        ("n_params float", ok, ("arch_pool", "n_params", 0), 10.5),
        ("budget steps negative", ok, ("cost", "budget", "totals", "private", "steps"), -1),
        ("error int", failed, ("error",), 3),
        # enums and consts
        ("selection rule", ok, ("selection", "rule"), "best"),
        ("fault kind", ok, ("faults", "kind"), "crash"),
        ("predictor", ok, ("method", "predictor"), "oracle"),
        ("plugin kind", ok, ("plugins", 0, "kind"), "widget"),
        ("headline statistic", ok, ("metrics", "headline", "statistic"), "mean"),
        ("unit fraction", ok, ("metrics", "unit"), "fraction"),
        ("transfer", ok, ("method", "transfer"), "everything"),
        # the modalities section
        ("missing not a modality", modal, ("modalities", "missing"), "audio"),
        ("recipient is a donor", modal, ("modalities", "donors"), modal["modalities"]["donors"]
         + modal["modalities"]["recipients"][:1]),
        ("recipients n_clients", modal, ("metrics", "recipients", "n_clients"), 99),
        ("recipient observes all", modal, ("modalities", "observed", modal["modalities"]["recipients"][0]),
         list(modal["modalities"]["names"])),
        ("modality hash", modal, ("modalities", "hash"), "xyz"),
        ("recipient fraction 2", modal, ("modalities", "recipient_fraction"), 2),
        # not finite
        ("global_acc nan", ok, ("metrics", "global_acc"), math.nan),
        ("config inf", ok, ("config", "lr"), math.inf),
        ("wall time -inf", ok, ("cost", "wall_time_total_s"), -math.inf),
        ("history scalar nan", ok, ("history", 1, "train_loss"), math.nan),
    ]
    return [(name, _change(base, path, value)) for name, base, path, value in c]


# Where the model is stricter than the 1.7 schema, on purpose: the schema names no
# additionalProperties anywhere and leaves code, environment, seeds and cost.peak_memory open; the
# model refuses any field it does not name (a history row takes a method's numbers) and types those.
def _tighter(ok: dict, pub: dict) -> list[tuple[str, dict]]:
    c = [
        ("extra top level", ok, ("notes",), "x"),
        ("extra in metrics", ok, ("metrics", "median_acc"), 50.0),
        ("extra in per_client", ok, ("metrics", "per_client", 0, "rank"), 1),
        ("extra in a group", ok, ("metrics", "honest", "share"), 0.5),
        ("extra in budget totals", ok, ("cost", "budget", "totals", "private", "epochs"), 3),
        ("extra in the source", pub, ("source", "url"), "https://example.org"),
        ("history scalar string", ok, ("history", 0, "note"), "warm-up"),
        ("environment typed", ok, ("environment", "torch_threads"), "four"),
        ("code typed", ok, ("code", "git_dirty"), "no"),
        ("seeds typed", ok, ("seeds", "torch"), "0"),
        ("peak memory typed", ok, ("cost", "peak_memory", "cpu_rss_bytes"), -5),
    ]
    return [(name, _change(base, path, value)) for name, base, path, value in c]


@pytest.fixture(scope="module")
def bases():
    ok, modal, failed = (json.loads(p.read_text()) for p in (BASE_OK, BASE_MODALITIES, BASE_FAILED))
    pub = json.loads(next(PUBLISHED.glob("fan2026crad__pathmnist__crad__local_acc__*.json")).read_text())
    pub["schema_version"] = "1.7"  # the 1.7 schema covers published records too
    for r in (ok, modal):
        r["history"] = r["history"][:3] + r["history"][-2:]  # smaller, still the final window's rows
    return ok, modal, failed, pub


def _old_problems(record: dict) -> list[str]:
    """What the 1.7 JSON Schema (frozen) says of ``record``."""
    import jsonschema

    return [e.message for e in jsonschema.Draft202012Validator(load_schema("1.7")).iter_errors(record)]


def test_the_model_gives_the_verdicts_of_the_validator_it_replaced(records_17, bases):
    """The mutations the hand validator (schema 1.7 and the checks beyond it) accepted are exactly
    those the model accepts (checked case by case against it before it was removed); every other
    one is refused, and so is every case the 1.7 schema itself refuses."""
    sample = [(str(p), r) for p, _, r in records_17[::25]]
    assert not [name for name, r in [*[(f"unchanged {i}", b) for i, b in enumerate(bases)], *sample]
                if rm.record_problems(at_current(r))]
    for name, record in _cases(*bases):
        if _old_problems(record):
            assert rm.record_problems(at_current(record)), name
    valid = {name for name, record in _cases(*bases) if not rm.record_problems(at_current(record))}
    assert valid == {"num_classes 2.0", "fingerprint good", "published n_seeds",
                     "seed 2^63 - 1", "failed seed null", "method_params null", "headline value 100"}


def test_the_model_is_stricter_where_meant(bases):
    ok, _, _, pub = bases
    for name, record in _tighter(ok, pub):
        assert _old_problems(record) == [], name
        assert rm.record_problems(at_current(record)), name
    problems = {name: rm.record_problems(at_current(r)) for name, r in _tighter(ok, pub)}
    assert problems["extra in per_client"] == ["metrics/per_client/0/rank: not a field of this section"]
    assert problems["extra in budget totals"] == ["cost/budget/totals/private/epochs: not a field of this section"]


def test_problems_name_their_json_path(bases):
    cases = dict(_cases(*bases))

    def first(name):
        return rm.record_problems(at_current(cases[name]))

    assert first("global_acc missing") == ["metrics/global_acc: required, but missing",
                                           "metrics/global_acc: status ok, but it is null or missing"]
    assert first("history acc 101") == ["history/1/global_acc: accuracy 101.0 is not within [0, 100]"]
    assert first("client curve acc 101") == ["history/4/client_global_acc/0: accuracy 101.0 is not within [0, 100]"]
    assert first("ok selected round null") == ["selection/round: status ok, but it is null"]
    assert first("recipients n_clients") == ["metrics/recipients/n_clients: 99, but modalities lists "
                                             f"{len(cases['recipients n_clients']['modalities']['recipients'])} "
                                             "recipients"]
    assert first("honest n_clients missing") == ["metrics/honest/n_clients: required, but missing"]
    assert first("config inf") == ["config/lr: not a finite number"]
    assert first("history scalar nan") == ["history/1/train_loss: not a finite number"]
    assert first("missing not a modality")[0].startswith("modalities/missing: 'audio' is not one of the modalities")
    assert first("seed bool") == ["config/seed: must be an integer in [0, 2^63), got True"]
    assert first("published two figures") == [
        "metrics: a published record carries exactly one figure: global_acc or local_acc"]


def test_json_schema_is_draft_2020_12_and_accepts_the_committed_records(records_17, published, bases):
    jsonschema = pytest.importorskip("jsonschema")
    schema = rm.json_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    assert json.dumps(schema) == json.dumps(rm.json_schema())  # deterministic, key order included
    assert schema["$id"] == "hfl-bench/record-1.11" and "1.11" in schema["title"]
    assert schema["properties"]["schema_version"]["const"] == rm.CURRENT_VERSION == "1.11"
    assert list(schema)[:4] == ["$schema", "$id", "title", "description"]
    validator = jsonschema.Draft202012Validator(schema)
    rejected = {}
    for path, _, record in [*records_17, *published]:
        if error := next(validator.iter_errors(at_current(record)), None):
            rejected[str(path.relative_to(REPO))] = error.message
    assert rejected == {}
    ok, modal, failed, pub = bases
    for name, record in _tighter(ok, pub)[:6]:  # what the schema can say, it says: unknown fields
        assert not validator.is_valid(at_current(record)), name
    for name in ("global_acc 150", "fidelity other", "published two figures", "recipients missing", "n_clients string"):
        assert not validator.is_valid(at_current(dict(_cases(*bases))[name])), name


def test_importing_the_model_imports_neither_torch_nor_numpy():
    code = ("import sys, hfl_bench.record.model; "
            "print([m for m in ('torch', 'numpy', 'hfl_bench.results', 'hfl_bench.engine', 'hfl_bench.registry') "
            "if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("args", [
    ("-m", "crad", "-t", "digits", "--faults", "byzantine:0.25"),
    ("-m", "fml", "-t", "digits-mnist1d", "--pool", "cpu-mm"),
], ids=["faults", "multimodal"])
def test_a_record_the_code_writes_today_is_parsed_and_dumped_byte_for_byte(tmp_path, args):
    from helpers import invoke_cli

    result, _, _ = invoke_cli("run", *args, "--clients", "4", "--rounds", "2", "--out", str(tmp_path))
    assert result.exit_code == 0, result.output
    [path] = tmp_path.glob("*.json")
    text = path.read_text()
    record = json.loads(text)
    assert record["status"] == "ok" and ("faults" in record or "modalities" in record)
    raw = at_current(record)
    assert rm.record_problems(raw) == []
    written = {**rm.dump(rm.parse(raw)), "schema_version": record["schema_version"]}
    assert json.dumps(written, indent=1, allow_nan=False) + "\n" == text
