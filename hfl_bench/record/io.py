"""Reading one record file: strict JSON (no NaN or infinity, bounded nesting), one clear error per
kind of bad file (``NotARecord``), and the record JSON Schema files shipped with the package (one
per version, read with importlib.resources so an installed wheel finds them as a checkout does).
No torch, no numpy: the results layer reads records through here."""

from __future__ import annotations

import importlib.resources
import json
import math
from pathlib import Path
from typing import Any

# Every version a record may carry; each keeps its own schema file, frozen once its version is no
# longer written, and a record is validated against the schema of its own ``schema_version``
# (docs/reference/older-records.md says what each version added).
# The current version's file is generated from the record model (``model.json_schema``, by
# docs/regenerate.py, which ``--check`` keeps in step); the older ones are frozen.
SCHEMA_VERSIONS = ("1.0", "1.1", "1.2", "1.3", "1.4", "1.5", "1.6", "1.7", "1.8", "1.9", "1.10", "1.11")
CURRENT_VERSION = SCHEMA_VERSIONS[-1]


def schema_file(version: str = CURRENT_VERSION):
    """The record JSON Schema of ``version`` as a package resource (a Traversable: a file in a
    checkout or in an installed wheel). ValueError for a version that has none."""
    if version not in SCHEMA_VERSIONS:
        raise ValueError(f"no record schema {version!r}; known: {', '.join(SCHEMA_VERSIONS)}")
    return importlib.resources.files(__package__) / "schema" / f"record-{version}.schema.json"


def load_schema(version: str = CURRENT_VERSION) -> dict[str, Any]:
    """The record JSON Schema (draft 2020-12) of ``version`` (default: the current one) as a mapping."""
    return json.loads(schema_file(version).read_text(encoding="utf-8"))


def non_finite_fields(obj: Any, where: str = "") -> list[str]:
    """The JSON paths (``a/b/0``) of every number in ``obj`` that is NaN or infinite."""
    if isinstance(obj, float):
        return [] if math.isfinite(obj) else [where or "(record)"]
    if isinstance(obj, dict):
        return [p for k, v in obj.items() for p in non_finite_fields(v, f"{where}/{k}" if where else str(k))]
    if isinstance(obj, (list, tuple)):
        return [p for i, v in enumerate(obj) for p in non_finite_fields(v, f"{where}/{i}" if where else str(i))]
    return []



class NotARecord(ValueError):
    """A file that is not a readable hfl-bench record. ``str()`` is the full message (with the
    path); ``reason`` is the short form for tables that show the path in a column of its own."""

    def __init__(self, message: str, reason: str):
        super().__init__(message)
        self.reason = reason


def _no_constant(name: str):
    raise ValueError(f"{name} is not a JSON number")


# How deep a record may nest: real records nest about 6 levels (history entries, per-client
# figures); a file nested deeper is not a record, and is refused before any recursive walk.
MAX_DEPTH = 64


def nesting_depth(value: Any) -> int:
    """How many levels of lists and mappings ``value`` nests (0 for a number or a string);
    without recursion, so any depth is measured."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, (dict, list)):
            depth += 1
            deepest = max(deepest, depth)
            stack.extend((v, depth) for v in (node.values() if isinstance(node, dict) else node))
    return deepest


def loads_strict(text: str) -> Any:
    """``json.loads`` that refuses NaN, Infinity and -Infinity (Python's parser accepts them) and
    numbers too large for a float (``1e999``); ValueError names the culprit."""
    try:
        value = json.loads(text, parse_constant=_no_constant)
    except RecursionError:
        raise ValueError(f"nested more than Python can parse (records nest at most {MAX_DEPTH} levels)") from None
    if nesting_depth(value) > MAX_DEPTH:  # before anything walks it recursively (here, the schema, the views)
        raise ValueError(f"nested deeper than {MAX_DEPTH} levels (a record nests about 6)")
    bad = non_finite_fields(value)
    if bad:
        raise ValueError(f"non-finite number at {bad[0]}")
    return value


def load_record(path: str | Path) -> dict[str, Any]:
    """The record in ``path``, upgraded to the current version (``current_shape``); NotARecord (a
    ValueError) for a missing, unreadable or foreign file, or one holding NaN or infinity (not JSON)."""
    try:
        record = loads_strict(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise NotARecord(f"record not found: {path}", "not found") from None
    except json.JSONDecodeError as e:
        raise NotARecord(f"{path} is not valid JSON: {e}", f"not readable JSON ({type(e).__name__})") from None
    except (OSError, UnicodeDecodeError) as e:
        raise NotARecord(f"{path} is not readable: {e}", f"not readable ({type(e).__name__})") from None
    except ValueError as e:
        raise NotARecord(f"{path} is not valid JSON: {e}", f"not valid JSON: {e}") from None
    if not isinstance(record, dict) or "schema_version" not in record:
        raise NotARecord(f"{path} is not an hfl-bench record (no schema_version)", "not an hfl-bench record")
    return current_shape(record)


def current_shape(record: dict[str, Any]) -> dict[str, Any]:
    """``record`` upgraded to the current version (``upgrade``), so a reader sees one shape; a
    record its version's steps cannot read stays as it is (``check.problems`` then says why, and
    the views list it as invalid, never averaged in)."""
    from hfl_bench.record.upgrade import upgrade

    try:
        return upgrade(record)
    except Exception:  # noqa: BLE001 - an unknown version or a broken record: reported by the check
        return record
