"""Which records may be read at all: the record JSON Schema plus the checks it cannot express.

A record is **valid** when it matches the schema of its ``schema_version`` (``records.load_schema``)
and every number in it is finite (JSON has no NaN or infinity; Python's parser accepts them,
``records.loads_strict`` does not) and every accuracy (a ``*_acc`` field, or a per-class /
per-architecture accuracy, under ``metrics`` or ``history``) is null or a number within [0, 100], a
reproduced record with status ``ok`` reports its selected round and headline figures, and a
multimodal record's ``modalities`` section (schema 1.4) agrees with itself: the missing modality is
one of its names, every client is a recipient or a donor (not both), recipients do not observe the
missing modality and donors observe every one, and ``metrics.recipients`` / ``metrics.donors`` count
those clients. The leaderboard and the
plots read only valid records; every other one is listed with its first problem, never averaged
in or drawn. ``leaderboard validate`` lists every problem of every file.

``leaderboard validate`` checks the schema with ``jsonschema`` when it is installed; the
leaderboard and the plots (and ``validate`` without jsonschema) with ``SubsetValidator``, which
implements exactly the keywords the record schema uses (and refuses a schema that uses others),
gives the same verdicts and is several times faster, so a missing optional package never lets an
invalid record through.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any, Iterable, Iterator

from hfl_bench.record.io import SCHEMA_VERSIONS, load_schema, loads_strict, non_finite_fields
from hfl_bench.recording import SCHEMA_VERSION
from hfl_bench.results.loading import Loaded, Skipped

ACCURACY_LISTS = ("per_class_global_acc", "per_arch_global_acc")


# ----------------------------------------------------------------------------- a validator without jsonschema


class SchemaError:
    """One problem: where (the JSON path as a list) and what."""

    def __init__(self, path: list, message: str):
        self.absolute_path, self.message = path, message


class SubsetValidator:
    """A JSON Schema (draft 2020-12) validator for the keywords the record schema uses: type, const,
    enum, required, properties, additionalProperties, items, minimum, maximum, pattern, $ref (to
    ``#/$defs/...``), allOf, oneOf, if / then / else; annotations are ignored. The same
    ``iter_errors`` as ``jsonschema``'s validators (path and message of each error)."""

    KEYWORDS = {"type", "const", "enum", "required", "properties", "additionalProperties", "items", "minimum",
                "maximum", "pattern", "$ref", "allOf", "oneOf", "if", "then", "else"}
    ANNOTATIONS = {"$schema", "$id", "$defs", "title", "description"}

    def __init__(self, schema: dict[str, Any]):
        self.schema = schema
        unknown = sorted(self._keywords(schema) - self.KEYWORDS - self.ANNOTATIONS)
        if unknown:
            raise ValueError(f"the record schema uses keywords SubsetValidator does not implement: {unknown}")

    def _keywords(self, schema: Any) -> set[str]:
        if not isinstance(schema, dict):
            return set()
        found = set(schema)
        for key, value in schema.items():
            if key in ("properties", "$defs"):
                for sub in value.values():
                    found |= self._keywords(sub)
            elif key in ("allOf", "oneOf"):
                for sub in value:
                    found |= self._keywords(sub)
            elif key in ("additionalProperties", "items", "if", "then", "else"):
                found |= self._keywords(value)
        return found

    def iter_errors(self, instance: Any) -> Iterator[SchemaError]:
        yield from self._errors(self.schema, instance, [])

    def is_valid(self, instance: Any) -> bool:
        return next(self.iter_errors(instance), None) is None

    @staticmethod
    def _is_type(value: Any, name: str) -> bool:
        if name == "null":
            return value is None
        if name == "boolean":
            return isinstance(value, bool)
        if name == "object":
            return isinstance(value, dict)
        if name == "array":
            return isinstance(value, list)
        if name == "string":
            return isinstance(value, str)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return False
        return name == "number" or isinstance(value, int) or float(value).is_integer()

    @staticmethod
    def _equal(a: Any, b: Any) -> bool:
        if isinstance(a, bool) or isinstance(b, bool):
            return type(a) is type(b) and a == b
        return a == b

    def _errors(self, schema: dict[str, Any], value: Any, path: list) -> Iterator[SchemaError]:
        if "$ref" in schema:
            target: Any = self.schema
            for part in schema["$ref"].removeprefix("#/").split("/"):
                target = target[part]
            yield from self._errors(target, value, path)
        if "type" in schema:
            types = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
            if not any(self._is_type(value, t) for t in types):
                yield SchemaError(path, f"{value!r} is not of type {', '.join(map(repr, types))}")
                return
        if "const" in schema and not self._equal(value, schema["const"]):
            yield SchemaError(path, f"{schema['const']!r} was expected")
        if "enum" in schema and not any(self._equal(value, e) for e in schema["enum"]):
            yield SchemaError(path, f"{value!r} is not one of {schema['enum']!r}")
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if number and "minimum" in schema and value < schema["minimum"]:
            yield SchemaError(path, f"{value!r} is less than the minimum of {schema['minimum']!r}")
        if number and "maximum" in schema and value > schema["maximum"]:
            yield SchemaError(path, f"{value!r} is greater than the maximum of {schema['maximum']!r}")
        if isinstance(value, str) and "pattern" in schema and not re.search(schema["pattern"], value):
            yield SchemaError(path, f"{value!r} does not match {schema['pattern']!r}")
        if isinstance(value, dict):
            for key in schema.get("required", ()):
                if key not in value:
                    yield SchemaError(path, f"{key!r} is a required property")
            properties = schema.get("properties", {})
            for key, item in value.items():
                if key in properties:
                    yield from self._errors(properties[key], item, [*path, key])
                elif isinstance(schema.get("additionalProperties"), dict):
                    yield from self._errors(schema["additionalProperties"], item, [*path, key])
        if isinstance(value, list) and isinstance(schema.get("items"), dict):
            for i, item in enumerate(value):
                yield from self._errors(schema["items"], item, [*path, i])
        for sub in schema.get("allOf", ()):
            yield from self._errors(sub, value, path)
        if "oneOf" in schema:
            matching = sum(next(self._errors(sub, value, path), None) is None for sub in schema["oneOf"])
            if matching != 1:
                yield SchemaError(path, f"{value!r} is valid under {matching} of the oneOf schemas, not exactly one")
        if "if" in schema:
            branch = "then" if next(self._errors(schema["if"], value, path), None) is None else "else"
            if branch in schema:
                yield from self._errors(schema[branch], value, path)


class VersionedValidator:
    """Validates each record against the schema of its own ``schema_version`` (``SCHEMA_VERSIONS``;
    a record with another or no version against the current schema, which then says what is
    wrong). The same ``iter_errors`` / ``is_valid`` as the validators it holds."""

    def __init__(self, make):
        self.validators = {version: make(load_schema(version)) for version in SCHEMA_VERSIONS}

    def for_record(self, record: Any):
        version = record.get("schema_version") if isinstance(record, dict) else None
        return self.validators.get(version if isinstance(version, str) else "", self.validators[SCHEMA_VERSION])

    def iter_errors(self, instance: Any):
        return self.for_record(instance).iter_errors(instance)

    def is_valid(self, instance: Any) -> bool:
        return next(iter(self.iter_errors(instance)), None) is None


def schema_validator(reference: bool = True) -> VersionedValidator:
    """A Draft 2020-12 validator of the record schemas, each record checked against its own
    version's. With ``reference``, ``jsonschema``'s when it is installed (``leaderboard
    validate``); else, or without it, ``SubsetValidator``: the same verdicts on the record schema
    (tests/test_leaderboard checks it on every shipped record and on mutations of one), about six
    times faster, so the leaderboard and the plots use it."""
    if reference:
        try:
            import jsonschema
        except ImportError:
            pass
        else:
            return VersionedValidator(jsonschema.Draft202012Validator)
    return VersionedValidator(SubsetValidator)


# ----------------------------------------------------------------------------- the checks


def _accuracy_problems(node: Any, path: str, accuracy: bool = False) -> Iterator[str]:
    """Each accuracy under ``node`` that is not null or a number in [0, 100]."""
    if isinstance(node, dict):
        for key, value in node.items():
            is_acc = isinstance(key, str) and (key.endswith("_acc") or key in ACCURACY_LISTS)
            yield from _accuracy_problems(value, f"{path}/{key}", accuracy or is_acc)
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _accuracy_problems(value, f"{path}/{i}", accuracy)
    elif accuracy and node is not None:
        number = isinstance(node, (int, float)) and not isinstance(node, bool)
        if not number:
            yield f"{path}: accuracy {node!r} is not a number"
        elif not (math.isfinite(node) and 0 <= node <= 100):
            yield f"{path}: accuracy {node!r} is not within [0, 100]"


def record_problems(record: Any, validator=None) -> list[str]:
    """Every reason ``record`` is not valid (module docstring), as ``<json path>: <message>``;
    [] for a valid record."""
    validator = validator or schema_validator()
    errors = sorted(validator.iter_errors(record), key=lambda e: [str(p) for p in e.absolute_path])
    problems = [f"{'/'.join(map(str, e.absolute_path)) or '(record)'}: {e.message}" for e in errors]
    flagged = {p.split(": ", 1)[0] for p in problems}
    problems += [f"{p}: not a finite number" for p in non_finite_fields(record)]
    if isinstance(record, dict):
        for block in ("metrics", "history"):
            problems += [p.lstrip("/") for p in _accuracy_problems(record.get(block), block)
                         if p.lstrip("/").split(": ", 1)[0] not in flagged]
        problems += _ok_without_figures(record)
        problems += _config_problems(record)
        problems += _modality_problems(record)
    return problems


def _ok_without_figures(record: dict[str, Any]) -> list[str]:
    """A reproduced run that says ``ok`` must report its selected round and headline figures
    (a run whose clients had no validation data once did not, and looked fine)."""
    source = record.get("source")
    if record.get("status") != "ok" or not isinstance(source, dict) or source.get("kind") != "reproduced":
        return []
    metrics = record.get("metrics")
    if not isinstance(metrics, dict):
        return ["metrics: status ok, but the record has no metrics"]
    selection = record.get("selection")
    missing = [f"metrics/{k}" for k in ("global_acc", "local_acc", "mean_val_acc") if metrics.get(k) is None]
    if not isinstance(selection, dict) or selection.get("round") is None:
        missing.append("selection/round")
    return [f"{m}: status ok, but it is null" for m in missing]


SEED_LIMIT = 2**63


def _config_problems(record: dict[str, Any]) -> list[str]:
    """The config fields the views group and count by, of the types a run writes (the schema
    leaves ``config`` open): the seed an integer in [0, 2^63) (null only in a failed record whose
    cell failed before its seed was known), so a list cannot crash a view and ``"0"`` or null
    cannot count a copy of seed 0 as another seed; ``method_params`` a mapping."""
    source = record.get("source")
    config = record.get("config")
    if not isinstance(source, dict) or source.get("kind") != "reproduced" or not isinstance(config, dict):
        return []
    problems = []
    seed = config.get("seed")
    integer = isinstance(seed, int) and not isinstance(seed, bool) and 0 <= seed < SEED_LIMIT
    if not integer and not (seed is None and record.get("status") == "failed"):
        problems.append(f"config/seed: must be an integer in [0, 2^63), got {_short(seed)}")
    if "method_params" in config and not isinstance(config["method_params"], (dict, type(None))):
        problems.append(f"config/method_params: must be a mapping, got {_short(config['method_params'])}")
    return problems


def _short(value: Any, limit: int = 40) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _modality_problems(record: dict[str, Any]) -> list[str]:
    """What the schema cannot say about a ``modalities`` section (module doc); nothing for a
    section the schema already rejects (wrong types), so each problem is reported once."""
    section = record.get("modalities")
    if not _well_typed(section):
        return []
    names, missing = section["names"], section["missing"]
    recipients, donors, observed = section["recipients"], section["donors"], section["observed"]
    problems = []
    if missing not in names:
        problems.append(f"modalities/missing: {missing!r} is not one of the modalities {names!r}")
    if both := sorted(set(recipients) & set(donors)):
        problems.append(f"modalities: clients {both} are both recipients and donors")
    if sorted(recipients + donors) != list(range(len(observed))):
        problems.append(f"modalities: recipients and donors are not each of the {len(observed)} clients "
                        f"(one list per client in observed) once")
    for cid, seen in enumerate(observed):
        if unknown := [m for m in seen if m not in names]:
            problems.append(f"modalities/observed/{cid}: {unknown!r} not among the modalities {names!r}")
        if cid in recipients and missing in seen:
            problems.append(f"modalities/observed/{cid}: recipient {cid} observes the missing modality {missing!r}")
        if cid in donors and set(seen) != set(names):
            problems.append(f"modalities/observed/{cid}: donor {cid} does not observe every modality")
    metrics = record.get("metrics") if isinstance(record.get("metrics"), dict) else {}
    for who, ids in (("recipients", recipients), ("donors", donors)):
        n = (metrics.get(who) or {}).get("n_clients") if isinstance(metrics.get(who), dict) else None
        if isinstance(n, int) and n != len(ids):
            problems.append(f"metrics/{who}/n_clients: {n}, but modalities lists {len(ids)} {who}")
    return problems


def _well_typed(section: Any) -> bool:
    """A modalities section whose lists hold what the schema says (its own checks come first)."""
    if not isinstance(section, dict) or not isinstance(section.get("missing"), str):
        return False
    lists = [section.get(k) for k in ("names", "recipients", "donors", "observed")]
    if not all(isinstance(v, list) for v in lists):
        return False
    names, recipients, donors, observed = lists
    ints = all(isinstance(c, int) and not isinstance(c, bool) for c in recipients + donors)
    return (ints and all(isinstance(n, str) for n in names)
            and all(isinstance(o, list) and all(isinstance(m, str) for m in o) for o in observed))


def file_errors(path: Path, validator=None) -> list[str]:
    """Each problem of one file (``record_problems``); [] for a valid record."""
    try:
        record = loads_strict(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:  # JSONDecodeError and NaN / Infinity are ValueErrors
        return [f"not readable JSON: {e}"]
    return record_problems(record, validator)


def invalid_files(files: Iterable[Path], validator=None) -> dict[str, list[str]]:
    """The files with problems, each with its problems."""
    validator = validator or schema_validator()
    problems = {str(f): file_errors(f, validator) for f in files}
    return {f: errs for f, errs in problems.items() if errs}


def valid_records(loaded: Iterable[Loaded]) -> tuple[list[Loaded], list[Skipped]]:
    """The records that are valid, and one Skipped (with the first problem) per other one."""
    validator = schema_validator(reference=False)
    keep, skipped = [], []
    for r in loaded:
        problems = record_problems(r.record, validator)
        if not problems:
            keep.append(r)
            continue
        more = f" (and {len(problems) - 1} more problem{'s' if len(problems) > 2 else ''})" if len(problems) > 1 else ""
        task = r.task if isinstance((r.record.get("task") or {}), dict) else None
        skipped.append(Skipped(str(r.path), f"invalid record: {problems[0]}{more}", task=task))
    return keep, skipped
