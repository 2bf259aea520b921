"""The run record as typed models (pydantic v2): schema 1.11: the shape of schema 1.7 written from this model,
``cost.flops`` (1.9), ``clock`` with each round's ``history[].clock`` (1.10; ``cost.flops.inference``
too) and what re-clocking reads: each clock entry's per-client ``flops``, ``up_bytes``,
``down_bytes`` and ``clock.reclocked`` (1.11, optional).

One ``Record`` holds a reproduced run (ok, diverged or failed) or a published figure
(``source.kind``): the sections a published record lacks are optional, as in the 1.7 schema, and a
record-level validator applies the schema's if / then / else (a published record's citation,
setting and single figure; a reproduced record's headline figure and client groups). Every model
refuses fields it does not name; the open mappings (``config``, ``method.hparams``,
``method.run_details``, ``partition.params``) stay open, and a history row takes a method's own
per-round numbers beside its named fields. Beyond the schema the validators check what
``hfl_bench.results.validation.record_problems`` checks: every number finite, every accuracy null
or within [0, 100], an ok reproduced record's selected round and headline figures, the config's
seed and method_params, and a consistent ``modalities`` section.

``record_problems`` lists every problem as ``<json/path>: <message>``, ``parse`` returns the model
(``RecordInvalid`` otherwise), ``dump`` gives back exactly the dict parsed (the same keys in the
same order), and ``json_schema`` is the JSON Schema the current version's schema file is generated from.
Shared types: imports only pydantic and the standard library (reading records needs no torch).

Modules: ``values`` (numbers, accuracies, open mappings, the base model), ``sections`` (source to
environment), ``metrics`` (the figures and the history) and ``record`` (the record and its
cross-section checks); everything public is importable from here.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError
from pydantic.json_schema import GenerateJsonSchema

from hfl_bench.record.model.metrics import (
    GROUPS,
    AllSeenUnseen,
    ArchSeenUnseen,
    ClientFigures,
    ClientGroup,
    ClientSeenUnseen,
    ClockRound,
    EndpointFigures,
    Figures,
    Final,
    FinalClient,
    GroupRound,
    Headline,
    HistoryEntry,
    Metrics,
    SeenUnseen,
    SeenUnseenFinal,
    Selected,
    Window,
)
from hfl_bench.record.model.record import Record
from hfl_bench.record.model.sections import (
    ArchPool,
    Budget,
    BudgetCount,
    BudgetMean,
    BudgetTotals,
    Citation,
    ClientCounts,
    Clock,
    ClockDevice,
    Code,
    Cost,
    Environment,
    Faults,
    Federation,
    Flops,
    FlopsInference,
    FlopsMean,
    FlopsPerClient,
    FlopsPerSample,
    FlopsTotals,
    FlopsTraining,
    InferenceMean,
    InferencePerClient,
    InferenceTotals,
    Method,
    Modalities,
    Partition,
    PeakMemory,
    PerClientBudget,
    PerClientRound,
    Plugin,
    Reclocked,
    Seeds,
    Selection,
    Setting,
    SettingPartition,
    SettingPool,
    Source,
    Task,
    TaskModality,
)
from hfl_bench.record.model.values import CURRENT_VERSION, SEED_LIMIT, RecordInvalid, _Found, _short

__all__ = [
    "CURRENT_VERSION", "SEED_LIMIT", "GROUPS", "Record", "RecordInvalid", "record_problems", "parse", "dump",
    "json_schema",
    # the sections
    "Source", "Citation", "Method", "Task", "TaskModality", "ArchPool", "Partition", "Federation", "Seeds",
    "Selection", "Faults", "Modalities", "Metrics", "ClientGroup", "Headline", "Selected", "Window", "ClientFigures",
    "Figures", "EndpointFigures", "Final", "FinalClient", "SeenUnseen", "SeenUnseenFinal", "AllSeenUnseen",
    "ArchSeenUnseen", "ClientSeenUnseen", "Cost", "PeakMemory", "Budget", "BudgetMean", "BudgetCount",
    "BudgetTotals", "PerClientRound", "PerClientBudget", "ClientCounts", "Flops", "FlopsPerSample",
    "FlopsTraining", "FlopsInference", "InferenceMean", "InferenceTotals", "InferencePerClient", "FlopsMean",
    "FlopsTotals", "FlopsPerClient", "Clock", "ClockDevice", "ClockRound", "Reclocked",
    "HistoryEntry", "GroupRound", "Setting",
    "SettingPartition", "SettingPool", "Plugin", "Code", "Environment",
]

# ----------------------------------------------------------------------------- the functions


def _path(loc: tuple) -> str:
    return "/".join(map(str, loc)) or "(record)"


def _messages(error: ValidationError) -> list[str]:
    out = []
    for e in error.errors():
        found = (e.get("ctx") or {}).get("error")
        if isinstance(found, _Found):
            out += [f"{_path((*e['loc'], *sub))}: {msg}" for sub, msg in found.problems]
        elif e["type"] == "missing":
            out.append(f"{_path(e['loc'])}: required, but missing")
        elif e["type"] == "extra_forbidden":
            out.append(f"{_path(e['loc'])}: not a field of this section")
        else:
            out.append(f"{_path(e['loc'])}: {e['msg']}")
    return out


def record_problems(raw: dict) -> list[str]:
    """Every problem of a current-version record as ``<json/path>: <message>`` ("(record)" for the top
    level); [] for a valid record."""
    if not isinstance(raw, dict):
        return [f"(record): must be an object, got {_short(raw)}"]
    context: dict[str, Any] = {"record_checks": []}
    try:
        Record.model_validate(raw, context=context)
    except ValidationError as e:
        problems = _messages(e)
    else:
        return []
    problems += [f"{_path(loc)}: {msg}" for loc, msg in context["record_checks"]]
    return list(dict.fromkeys(problems))


def parse(raw: dict) -> Record:
    """The record as a ``Record``; ``RecordInvalid`` (a ValueError, ``.problems``) when it is not valid."""
    try:
        return Record.model_validate(raw)
    except ValidationError:
        raise RecordInvalid(record_problems(raw)) from None


def dump(record: Record) -> dict:
    """The record as JSON data: exactly the mapping it was parsed from (same keys, same order)."""
    return record.model_dump(mode="json", exclude_unset=True)


class _Schema(GenerateJsonSchema):
    """Pydantic's JSON Schema without the ``default: null`` of optional fields (absent, not null)."""

    def default_schema(self, schema):
        return self.generate_inner(schema["schema"])


# The schema's if / then / else (of 1.7): a published record's citation, setting and one figure; a
# reproduced record's headline figure and client groups.
_CONDITIONS = [{
    "if": {"required": ["source"], "properties": {"source": {"required": ["kind"],
                                                             "properties": {"kind": {"const": "published"}}}}},
    "then": {
        "required": ["setting", "selection"],
        "properties": {
            "source": {"required": ["citation"], "properties": {"citation": {
                "type": "object", "required": ["key", "arxiv_or_doi", "locator", "setting_match", "deviations"]}}},
            "metrics": {"type": "object", "oneOf": [
                {"required": ["global_acc"], "properties": {"global_acc": {"type": "number"}}},
                {"required": ["local_acc"], "properties": {"local_acc": {"type": "number"}}}]},
        },
    },
    "else": {
        "properties": {"metrics": {"required": ["global_acc"]}},
        "allOf": [
            {"if": {"required": ["faults"]}, "then": {"properties": {"metrics": {"required": ["honest", "faulty"]}}}},
            {"if": {"required": ["modalities"]},
             "then": {"properties": {"metrics": {"required": ["recipients", "donors"]}}}},
        ],
    },
}]


def json_schema() -> dict:
    """The record's JSON Schema (draft 2020-12) of the current version, generated from the models; the same
    mapping, in the same key order, on every call."""
    body = Record.model_json_schema(schema_generator=_Schema)
    defs = body.pop("$defs", {})
    schema = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": f"hfl-bench/record-{CURRENT_VERSION}",
        "title": f"hfl-bench leaderboard record, schema {CURRENT_VERSION}",
        "description": (f"One run (reproduced) or one published figure, schema {CURRENT_VERSION}: the shape of 1.7 "
                        "and cost.flops (1.9), clock, cost.flops.inference and federation.eval_clients / client_state "
                        "(1.10), each clock entry's flops / up_bytes / down_bytes and clock.reclocked (1.11), "
                        "generated from "
                        "hfl_bench.record.model. Accuracies are "
                        "percentages (0-100)."),
        "type": body["type"],
        "required": body["required"],
        "properties": body["properties"],
        "additionalProperties": body["additionalProperties"],
        "allOf": _CONDITIONS,
        "$defs": dict(sorted(defs.items())),
    }
    return schema
