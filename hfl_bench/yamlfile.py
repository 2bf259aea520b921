"""Reading a YAML settings file (a run's ``--config``, a matrix suite) within bounds, so a hostile
or odd file costs a line of error, not minutes and gigabytes: a 1 kB file of nested aliases (a
"billion laughs") expands to billions of values, and every later step (type checks, error
messages, the config hash) would walk them all.

Refused, each with one line that never quotes the document: a missing or unreadable file, a folder,
a file over ``MAX_BYTES``, text that is not UTF-8, invalid YAML, a key given twice in one mapping
(YAML keeps the last silently), a document that expands (aliases followed) to more than
``MAX_VALUES`` values or nests deeper than ``MAX_DEPTH``, and a document that is not a mapping.
Anchors and merge keys of a sane size work as YAML says.
"""

from __future__ import annotations

import collections
import functools
from pathlib import Path
from typing import Any

MAX_BYTES = 1 << 20
MAX_VALUES = 10_000  # after alias expansion; the largest shipped suite holds about 100
MAX_DEPTH = 20  # a suite's deepest setting (an override's method_params value) is at depth 5


class YamlFileError(ValueError):
    """A settings file that cannot be used; the message (one line) is meant for the user."""


def read_mapping(path: str | Path, what: str, expected: str) -> dict[str, Any]:
    """The mapping a YAML file holds (an empty file is an empty one); YamlFileError otherwise.
    ``what`` names the file in messages ("config file"), ``expected`` says what it should hold."""
    import yaml  # here: commands that read no YAML (--help, list) do not pay for it

    text = _read_text(Path(path), what)
    try:
        data = yaml.load(text, Loader=_strict_loader()) or {}
    except _KeyTwice as e:
        where = f"on line {e.first}" if e.first == e.second else f"lines {e.first} and {e.second}"
        raise YamlFileError(f"{what} {path}: key {_short(e.key)} is given twice in one mapping ({where}); "
                            "give it once") from None
    except yaml.YAMLError as e:
        raise YamlFileError(f"{what} {path} is not valid YAML: {e}") from None
    except RecursionError:
        raise YamlFileError(f"{what} {path} is nested more than {MAX_DEPTH} levels deep") from None
    except ValueError as e:  # an integer longer than Python converts (4,300 digits by default)
        raise YamlFileError(f"{what} {path} holds a number too long to read: {_short(str(e))}") from None
    _check_extent(data, f"{what} {path}")
    if not isinstance(data, dict):
        raise YamlFileError(f"{what} {path} must hold a mapping {expected}")
    return data


def _read_text(path: Path, what: str) -> str:
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_BYTES + 1)  # never more: /dev/zero is a file name too
    except FileNotFoundError:
        raise YamlFileError(f"{what} not found: {path}") from None
    except IsADirectoryError:
        raise YamlFileError(f"{what} {path} is a folder, not a YAML file") from None
    except OSError as e:
        raise YamlFileError(f"{what} {path} cannot be read ({e.strerror or type(e).__name__})") from None
    if len(raw) > MAX_BYTES:
        raise YamlFileError(f"{what} {path} is larger than {MAX_BYTES >> 20} MB: not a settings file")
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = raw[: e.start].count(b"\n") + 1
        raise YamlFileError(f"{what} {path} is not UTF-8 text (byte 0x{raw[e.start]:02x} on line {line})") from None


class _KeyTwice(Exception):
    def __init__(self, key: Any, first: int, second: int):
        super().__init__(key)
        self.key, self.first, self.second = key, first, second


@functools.lru_cache(maxsize=None)
def _strict_loader() -> type:
    """yaml's safe loader (the C one where built) that refuses a key given twice in one mapping. A
    merge key's (``<<``) values may be overridden: that is what merging is for."""
    import yaml

    base = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

    class StrictLoader(base):  # type: ignore[misc, valid-type]
        def construct_mapping(self, node, deep=False):
            if isinstance(node, yaml.MappingNode):
                seen: dict[Any, int] = {}
                for key_node, _ in node.value:
                    if key_node.tag == "tag:yaml.org,2002:merge":
                        continue
                    key, line = self.construct_object(key_node, deep=True), key_node.start_mark.line + 1
                    try:
                        if key in seen:
                            raise _KeyTwice(key, seen[key], line)
                        seen[key] = line
                    except TypeError:  # an unhashable key: yaml's own error names it
                        continue
            return super().construct_mapping(node, deep)

    return StrictLoader


def _check_extent(data: Any, where: str) -> None:
    """Refuse a document that expands (aliases followed) to more than ``MAX_VALUES`` values or nests
    deeper than ``MAX_DEPTH``. Counted by walking it with an early stop, so a bomb costs at most
    that many steps; a value that holds itself (``&a [*a]``) never ends, so it is refused too."""
    queue, count = collections.deque([(data, 1)]), 0
    while queue:  # breadth first: a wide bomb hits the count before its depth
        value, depth = queue.popleft()
        count += 1
        if count > MAX_VALUES:
            raise YamlFileError(f"{where} expands to more than {MAX_VALUES:,} values (YAML aliases?); "
                                "write the settings out")
        if depth > MAX_DEPTH:
            raise YamlFileError(f"{where} is nested more than {MAX_DEPTH} levels deep (aliases followed)")
        if isinstance(value, dict):
            queue.extend((v, depth + 1) for item in value.items() for v in item)
        elif isinstance(value, (list, tuple, set, frozenset)):
            queue.extend((v, depth + 1) for v in value)


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
