"""Whether a record of any known version may be read: the one check behind ``leaderboard validate``,
the leaderboard, the plots and the tests.

A record is **valid** when every number in it is finite, it upgrades to the current version
(``upgrade``: one step per version) and the upgraded record satisfies the model (``model``: the
fields, their types and ranges, and the cross-field rules: accuracies within [0, 100], an ``ok``
reproduced run reports its selected round and headline figures, the config's seed, a consistent
``modalities`` section). With ``frozen``, an older record is first checked against the JSON Schema
its own version shipped with (``io.load_schema``; the files are frozen), where ``jsonschema`` is
installed: what ``leaderboard validate`` runs.
"""

from __future__ import annotations

import functools
from typing import Any

from hfl_bench.record import model
from hfl_bench.record.io import SCHEMA_VERSIONS, load_schema, non_finite_fields
from hfl_bench.record.upgrade import UpgradeError, upgrade


def problems(raw: Any, frozen: bool = False) -> list[str]:
    """Every reason ``raw`` is not a valid record, as ``<json path>: <message>``; [] when it is."""
    if not isinstance(raw, dict):
        return ["(record): not a JSON object"]
    found = [f"{p}: not a finite number" for p in non_finite_fields(raw)]
    version = raw.get("schema_version")
    if frozen and isinstance(version, str) and version in SCHEMA_VERSIONS and version != model.CURRENT_VERSION:
        found += _frozen_problems(raw, version)
    try:  # a record read through ``io.load_record`` is current already: no second upgrade (a deep copy)
        current = raw if version == model.CURRENT_VERSION else upgrade(raw)
    except UpgradeError as e:
        return found + [f"schema_version: {e}"]
    except Exception as e:  # noqa: BLE001 - a record too broken for its version's upgrade step
        return found + [f"(record): cannot be read as a {version} record ({type(e).__name__}: {e})"]
    seen = set(found)
    return found + [p for p in model.record_problems(current) if p not in seen]


def _frozen_problems(raw: dict[str, Any], version: str) -> list[str]:
    """``raw`` against its own version's frozen schema, with jsonschema where it is installed."""
    try:
        import jsonschema  # noqa: F401 - asked each time: a run without it checks the model alone
    except ImportError:
        return []
    validator = _frozen_validator(version)
    errors = sorted(validator.iter_errors(raw), key=lambda e: [str(p) for p in e.absolute_path])
    return [f"{'/'.join(map(str, e.absolute_path)) or '(record)'}: {e.message}" for e in errors]


@functools.lru_cache(maxsize=None)
def _frozen_validator(version: str) -> Any:
    """The jsonschema validator of ``version``'s frozen schema, built once per version (``leaderboard
    validate`` checks every older record of a folder)."""
    import jsonschema

    return jsonschema.Draft202012Validator(load_schema(version))
