"""The whole record (``Record``) and the checks that read more than one section."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import StrictStr, ValidationInfo, model_validator

from hfl_bench.record.model.metrics import HistoryEntry, Metrics
from hfl_bench.record.model.sections import (
    ArchPool,
    Clock,
    Code,
    Cost,
    Environment,
    Faults,
    Federation,
    Method,
    Modalities,
    Partition,
    Plugin,
    Seeds,
    Selection,
    Setting,
    Source,
    Task,
)
from hfl_bench.record.model.values import SEED_LIMIT, OpenObject, _Found, _is_number, _Model, _short


class Record(_Model):
    """One run (reproduced) or one published figure, schema 1.11."""

    schema_version: Literal["1.11"]  # CURRENT_VERSION
    record_id: StrictStr
    source: Source
    status: Literal["ok", "diverged", "failed"]
    error: StrictStr | None = None
    method: Method
    task: Task
    arch_pool: ArchPool = None
    partition: Partition = None
    federation: Federation = None
    seeds: Seeds = None
    selection: Selection = None
    faults: Faults = None
    modalities: Modalities = None
    clock: Clock = None
    metrics: Metrics | None
    cost: Cost = None
    history: list[HistoryEntry] = None
    setting: Setting = None
    plugins: list[Plugin] = None
    config: OpenObject = None
    config_hash: StrictStr = None
    code: Code = None
    environment: Environment = None
    date: StrictStr = None

    @model_validator(mode="wrap")
    @classmethod
    def _cross_checks(cls, data: Any, handler, info: ValidationInfo):
        # On the raw mapping, so they are found also where a section is ill-typed (record_problems
        # collects them through the context then; the field errors are raised first).
        found = _record_checks(data) if isinstance(data, dict) else []
        if isinstance(info.context, dict) and isinstance(info.context.get("record_checks"), list):
            info.context["record_checks"].extend(found)
        record = handler(data)
        if found:
            raise _Found(found)
        return record


# ----------------------------------------------------------------------------- record-level checks


def _obj(value: Any) -> dict:
    return value if isinstance(value, dict) else {}


def _record_checks(record: dict[str, Any]) -> list[tuple[tuple, str]]:
    """The schema's if / then / else and what the schema cannot say across sections, each skipped
    where the sections it reads are of other types (their own errors say so)."""
    source, metrics, status = _obj(record.get("source")), record.get("metrics"), record.get("status")
    found: list[tuple[tuple, str]] = []
    if source.get("kind") == "published":
        found += [((key,), "required in a published record, but missing") for key in ("setting", "selection")
                  if key not in record]
        citation = source.get("citation")
        if "citation" not in source:
            found.append((("source", "citation"), "required in a published record, but missing"))
        elif not isinstance(citation, dict):
            found.append((("source", "citation"), "a published record's citation must be an object"))
        else:
            found += [(("source", "citation", key), "required in a published record, but missing")
                      for key in ("key", "arxiv_or_doi", "locator", "setting_match", "deviations")
                      if key not in citation]
        if not isinstance(metrics, dict):
            found.append((("metrics",), "a published record's metrics must be an object"))
        elif sum(_is_number(metrics.get(k)) for k in ("global_acc", "local_acc")) != 1:
            found.append((("metrics",), "a published record carries exactly one figure: global_acc or local_acc"))
        return found
    if isinstance(metrics, dict):
        required = ["global_acc"]
        required += ["honest", "faulty"] if "faults" in record else []
        required += ["recipients", "donors"] if "modalities" in record else []
        found += [(("metrics", key), "required, but missing") for key in required if key not in metrics]
    if source.get("kind") != "reproduced":
        return found
    if status == "ok":  # an ok run reports its selected round and headline figures
        if not isinstance(metrics, dict):
            found.append((("metrics",), "status ok, but the record has no metrics"))
        else:
            found += [(("metrics", k), "status ok, but it is null or missing")
                      for k in ("global_acc", "local_acc", "mean_val_acc") if metrics.get(k) is None]
            selection = record.get("selection")
            if not isinstance(selection, dict) or selection.get("round", None) is None:
                found.append((("selection", "round"), "status ok, but it is null"))
    config = record.get("config")
    if isinstance(config, dict):
        seed = config.get("seed")
        integer = _is_number(seed) and isinstance(seed, int) and 0 <= seed < SEED_LIMIT
        if not integer and not (seed is None and status == "failed"):
            found.append((("config", "seed"), f"must be an integer in [0, 2^63), got {_short(seed)}"))
        if "method_params" in config and not isinstance(config["method_params"], (dict, type(None))):
            found.append((("config", "method_params"), f"must be a mapping, got {_short(config['method_params'])}"))
    modalities = record.get("modalities")
    if isinstance(modalities, dict) and isinstance(metrics, dict):
        for who in ("recipients", "donors"):
            ids, n = modalities.get(who), _obj(metrics.get(who)).get("n_clients")
            if isinstance(ids, list) and isinstance(n, int) and not isinstance(n, bool) and n != len(ids):
                found.append((("metrics", who, "n_clients"), f"{n}, but modalities lists {len(ids)} {who}"))
    return found
