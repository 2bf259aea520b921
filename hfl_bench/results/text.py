"""Untrusted text made safe for where it is shown. Record fields, suite names, flag values and the
error messages that quote them are data, never instructions:

- ``terminal``: no control characters (C0 and C1, DEL, bidirectional overrides) and no escape
  sequences (CSI, OSC such as hyperlinks and window titles, DCS, ...): nothing can clear the
  screen, move the cursor, recolor, retitle or link. Rich markup is a separate matter: the CLI
  prints such text as ``rich.text.Text`` (``hfl_bench.cli.output.plain``), never as markup.
- ``markdown_cell``: one line, with the characters that would end a table cell, start code, a
  link or HTML escaped.
- ``csv_cell``: one line, and a leading ``= + - @`` (a spreadsheet formula) defused with ``'``;
  quoting is the csv module's.
- ``mpl_text``: for matplotlib, which reads ``$...$`` as math (a parse error aborts the figure).
- ``ascii_spelled``: text for an output that cannot encode it (an ASCII-only stdout): ``+/-`` for
  the plus-minus sign and the like (``ASCII_FALLBACK``), a backslash escape for anything else.

JSON output needs none of this: ``json.dumps`` escapes every control character.
"""

from __future__ import annotations

import re
from typing import Any

# ESC-introduced sequences: CSI (ESC [ ... final), OSC (ESC ] ... BEL or ST), DCS / SOS / PM /
# APC (ESC P|X|^|_ ... ST), and any other ESC + one character.
_ESCAPES = re.compile(
    r"\x1b\[[0-?]*[ -/]*[@-~]?"
    r"|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?"
    r"|\x1b[PX^_][^\x1b]*(?:\x1b\\)?"
    r"|\x1b.?",
    re.DOTALL,
)
# 8-bit forms: CSI (0x9b) and OSC (0x9d), DCS (0x90), SOS (0x98), PM (0x9e), APC (0x9f).
_C1_ESCAPES = re.compile(r"\x9b[0-?]*[ -/]*[@-~]?|[\x9d\x90\x98\x9e\x9f][^\x07\x9c\x1b]*(?:\x07|\x9c)?")
_NEWLINES = re.compile(r"\r\n|[\n\r\x0b\x0c\x85\u2028\u2029]")
# Every C0 control but tab and newline, DEL, every C1 control, and the bidirectional overrides
# and isolates (text that displays in another order than it reads).
_CONTROLS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")
_MARKDOWN = {"\\": "\\\\", "|": "\\|", "`": "\\`", "[": "\\[", "]": "\\]", "*": "\\*", "&": "&amp;",
             "<": "&lt;", ">": "&gt;"}
_MARKDOWN_RE = re.compile("|".join(re.escape(c) for c in _MARKDOWN))
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def terminal(value: Any, one_line: bool = True) -> str:
    """``value`` as text without escape sequences or control characters; with ``one_line``,
    newlines and tabs become spaces (a message stays one line, a table cell one row)."""
    text = value if isinstance(value, str) else str(value)
    if not text.isprintable():  # fast path: plain text has nothing to strip
        text = _C1_ESCAPES.sub("", _ESCAPES.sub("", text))
        text = _NEWLINES.sub(" " if one_line else "\n", text)
        if one_line:
            text = text.replace("\t", " ")
        text = _CONTROLS.sub("", text)
    return text


def markdown_cell(value: Any) -> str:
    """One markdown table cell: a single line whose ``|``, backticks, brackets, ``*``, ``\\`` and
    HTML (``< > &``) are shown as themselves."""
    return _MARKDOWN_RE.sub(lambda m: _MARKDOWN[m.group()], terminal(value))


def csv_cell(value: Any) -> Any:
    """A csv value: numbers and None unchanged; text on one line, with a leading formula
    character defused by a ``'``."""
    if not isinstance(value, str):
        return value
    text = terminal(value)
    return "'" + text if text.startswith(FORMULA_STARTS) else text


def mpl_text(value: Any, one_line: bool = True) -> str:
    """Text for a matplotlib label, title or caption: shown as itself (``$`` is not math)."""
    text = terminal(value, one_line).replace("$", r"\$")
    return " " + text if text.startswith("_") else text  # a label starting with _ is hidden


# What hfl-bench's output writes outside ASCII, spelled in ASCII: an ASCII-only stdout reads
# "94.29 +/- 2.43", not "94.29 ? 2.43".
ASCII_FALLBACK = {"\u00b1": "+/-", "\u2212": "-", "\u2013": "-", "\u2014": "--", "\u00d7": "x", "\u2026": "...",
                  "\u2264": "<=", "\u2265": ">=", "\u2260": "!=", "\u2192": "->", "\u2190": "<-", "\u00b7": "."}


def ascii_spelled(text: str, encoding: str = "ascii") -> str:
    """``text`` with each character ``encoding`` cannot encode spelled by ``ASCII_FALLBACK``, else
    as a backslash escape (``\\u4e2d``: recoverable, unlike "?")."""
    def spell(c: str) -> str:
        try:
            c.encode(encoding)
            return c
        except (UnicodeEncodeError, LookupError):
            return ASCII_FALLBACK.get(c) or c.encode("ascii", "backslashreplace").decode("ascii")

    try:
        text.encode(encoding)
        return text
    except (UnicodeEncodeError, LookupError):
        return "".join(spell(c) for c in text)
