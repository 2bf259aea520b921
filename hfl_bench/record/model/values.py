"""The record model's value types (JSON Schema numbers kept as given, accuracies, open mappings), its
errors and the base of every section model (unknown fields refused, fields dumped in the order given)."""

from __future__ import annotations

import math
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PlainValidator,
    PrivateAttr,
    StrictStr,
    WithJsonSchema,
    model_serializer,
    model_validator,
)

CURRENT_VERSION = "1.11"
SEED_LIMIT = 2**63


class RecordInvalid(ValueError):
    """A record that does not validate; ``problems``: each as ``<json/path>: <message>``."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        super().__init__(f"invalid record: {problems[0] if problems else '?'}{more}")


class _Found(ValueError):
    """Problems a validator found, each at a path below the value it checked (pydantic's error
    location gives the rest): ``record_problems`` reports each at its full path."""

    def __init__(self, problems: list[tuple[tuple, str]]):
        self.problems = problems
        super().__init__("; ".join(msg for _, msg in problems))


def _fail(message: str):
    raise _Found([((), message)])


def _short(value: Any, limit: int = 40) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


# ----------------------------------------------------------------------------- value types
# JSON Schema's number and integer, kept as given (an int stays an int, so a record dumps back byte
# for byte); 2.0 is an integer, as in JSON Schema; NaN and infinity are refused.


def _number_check(ge: float | None = None, le: float | None = None, integer: bool = False, pct: bool = False):
    """The check of a number (an integer, an accuracy), returning the value as given, and its JSON Schema."""
    what = "an integer" if integer else "a number"

    def check(v: Any) -> Any:
        if not _is_number(v):
            _fail(f"accuracy {_short(v)} is not a number" if pct else f"must be {what}, got {_short(v)}")
        if not math.isfinite(v):
            _fail("not a finite number")
        if integer and not float(v).is_integer():
            _fail(f"must be an integer, got {_short(v)}")
        if pct and not 0 <= v <= 100:
            _fail(f"accuracy {v!r} is not within [0, 100]")
        if ge is not None and v < ge:
            _fail(f"{v!r} is less than the minimum of {ge!r}")
        if le is not None and v > le:
            _fail(f"{v!r} is greater than the maximum of {le!r}")
        return v

    schema: dict[str, Any] = {"type": "integer" if integer else "number"}
    if pct:
        schema.update(minimum=0, maximum=100)
    if ge is not None:
        schema["minimum"] = ge
    if le is not None:
        schema["maximum"] = le
    return check, schema


def _number(ge: float | None = None, le: float | None = None, integer: bool = False):
    check, schema = _number_check(ge, le, integer)
    return Annotated[Any, PlainValidator(check), WithJsonSchema(schema)]


def _nullable(check, schema: dict[str, Any]):
    """``check``'s type, or null (one JSON Schema type list, as the 1.7 schema writes it)."""
    return Annotated[Any, PlainValidator(lambda v: v if v is None else check(v)),
                     WithJsonSchema({**schema, "type": [schema["type"], "null"]})]


Number = _number()
NonNegative = _number(ge=0)
Int = _number(integer=True)
Count = _number(ge=0, integer=True)  # an integer >= 0
Positive = _number(ge=1, integer=True)  # an integer >= 1
NonNegativeOrNull = _nullable(*_number_check(ge=0))  # a number >= 0, or null (not applicable)
Pct = _nullable(*_number_check(pct=True))  # an accuracy in percent: null (no figure) or a number in [0, 100]
Scalar = _nullable(*_number_check())  # a method's own per-round number (``Method.run_round``'s scalars)


def _non_finite(node: Any, where: tuple = ()) -> list[tuple[tuple, str]]:
    if isinstance(node, float):
        return [] if math.isfinite(node) else [(where, "not a finite number")]
    if isinstance(node, dict):
        return [p for k, v in node.items() for p in _non_finite(v, (*where, k))]
    if isinstance(node, list):
        return [p for i, v in enumerate(node) for p in _non_finite(v, (*where, i))]
    return []


def _open_object(v: Any) -> Any:
    if not isinstance(v, dict):
        _fail(f"must be an object, got {_short(v)}")
    if bad := _non_finite(v):
        raise _Found(bad)
    return v


# A mapping the record leaves open (a run's config, a method's hyperparameters): any JSON, finite numbers.
OpenObject = Annotated[Any, PlainValidator(_open_object), WithJsonSchema({"type": "object"})]
Hash16 = Annotated[StrictStr, Field(pattern=r"^[0-9a-f]{16}$")]


# ----------------------------------------------------------------------------- the base model


class _Model(BaseModel):
    """Refuses unknown fields; dumps its fields in the order they were given (``exclude_unset``
    then gives back exactly what was parsed)."""

    model_config = ConfigDict(extra="forbid")
    _keys: tuple = PrivateAttr(default=())

    @model_validator(mode="wrap")
    @classmethod
    def _remember_order(cls, data: Any, handler):
        model = handler(data)
        if isinstance(data, dict):
            model._keys = tuple(data)
        return model

    @model_serializer(mode="wrap")
    def _in_given_order(self, handler):
        out = handler(self)
        if not self._keys or not isinstance(out, dict):
            return out
        ordered = {k: out[k] for k in self._keys if k in out}
        ordered.update((k, v) for k, v in out.items() if k not in ordered)
        return ordered
