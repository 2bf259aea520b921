"""Hostile text is data, never instructions: records whose names hold rich markup, terminal escape
sequences, control characters, markdown / HTML, spreadsheet formulas and matplotlib math are shown
as themselves in every output (leaderboard table, markdown, csv, json, rank, ``show``, plots and
their sidecars, ``validate``), and flag values and suite names are too."""

from __future__ import annotations

import copy
import csv
import hashlib
import io
import json
import re
from pathlib import Path

import pytest
import yaml

from hfl_bench.cli.output import command_line, shell_quote
from hfl_bench.results.board import board_records, build_board
from hfl_bench.results.loading import load_records
from hfl_bench.results.render import UNMATCHED_COLUMNS, chosen_columns, csv_columns, display_rows, text_columns
from hfl_bench.results.text import csv_cell, markdown_cell, mpl_text, terminal

from helpers import REAL_RECORD, invoke_cli

REPO = Path(__file__).resolve().parent.parent
REAL = REAL_RECORD
PUBLISHED = next((REPO / "leaderboards" / "published").glob("fan2026crad__cifar10__crad__global_acc__*.json"))

HOSTILE = {
    "markup-close": "crad[/x]",
    "markup-open": "[bold red]loud[/bold red]",
    "markup-link": "[link=http://evil.example]x[/link]",
    "clear-screen": "a\x1b[2J\x1b[Hb",
    "hyperlink": "\x1b]8;;http://evil.example\x07click\x1b]8;;\x07",
    "window-title": "\x1b]0;pwned\x07t",
    "c1-csi": "c1\x9b31mred",
    "carriage-return": "safe\roverwritten",
    "bell-backspace": "x\x07\x08y",
    "newline-row": "a|b\n| x | y |",
    "html": "<img src=x onerror=alert(1)>",
    "backticks": "`rm -rf ~`",
    "md-link": "[click](javascript:alert(1))",
    "formula": '=HYPERLINK("http://evil.example","x")',
    "formula-at": "@SUM(1+1)*cmd|' /C calc'!A0",
    "math": "$\\frac{a}{$",
    "emoji": ":warning: :skull:",
    "bidi": "abc\u202edcba",
    "underscore": "_hidden",
}
# Control characters (tab and newline aside) and bidi overrides must never reach a terminal.
CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def _hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _record(base: dict, seed: int, method: str, task: str, name: str) -> dict:
    r = copy.deepcopy(base)
    r["history"] = r["history"][:3]
    r["method"]["name"] = r["config"]["method"] = method
    r["task"]["name"] = r["config"]["task"] = task
    r["arch_pool"]["name"] = r["config"]["pool"] = name
    r["arch_pool"]["assignment"] = [name] * len(r["arch_pool"]["assignment"])
    r["metrics"]["per_arch_global_acc"] = {name: 60.0, "mlp_small": 50.0}
    for c in r["metrics"]["per_client"]:
        c["arch"] = name
    r["metrics"]["extra_endpoints"] = {name: {"global_acc": 55.0, "local_acc": 65.0}}
    r["error"] = None
    r["config"]["seed"] = seed
    r["seeds"] = {k: seed for k in r["seeds"]}
    r["config_hash"] = _hash(f"{method}|{task}|{name}")
    r["record_id"] = _hash(f"{r['config_hash']}|{seed}")
    r["partition"]["hash"] = _hash(f"part{seed}")
    r["metrics"]["global_acc"] = 60.0 + seed
    return r


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """Every hostile string as a method name, and as a task name, in pool / architecture /
    endpoint names too (two seeds each); a plain 'local' record beside each hostile task (so the
    rank has two methods); a published figure with hostile citation fields."""
    base = json.loads(REAL.read_text())
    root = tmp_path_factory.mktemp("hostile")
    records = []
    for key, h in HOSTILE.items():
        for seed in (0, 1):
            records.append(_record(base, seed, h, "digits", h))
            records.append(_record(base, seed, "crad", h, h))
        records.append(_record(base, 0, "local", h, "cpu"))
    published = json.loads(PUBLISHED.read_text())
    published["source"]["citation"]["locator"] = HOSTILE["newline-row"] + HOSTILE["hyperlink"]
    published["source"]["citation"]["key"] = HOSTILE["formula"]
    published["method"]["published_name"] = HOSTILE["markup-close"] + HOSTILE["html"]
    records.append(published)
    for i, r in enumerate(records):
        (root / f"r{i:03d}.json").write_text(json.dumps(r))
    return root


def _invoke(*args: str):
    return invoke_cli(*args)


def _assert_clean(result, stdout: str, stderr: str, code: int = 0) -> None:
    assert result.exit_code == code, (result.exception, stdout[-2000:], stderr[-2000:])
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    for name, text in (("stdout", stdout), ("stderr", stderr)):
        bad = sorted({repr(c) for c in CONTROL.findall(text)})
        assert not bad, f"control characters on {name}: {bad}"
        assert "Traceback" not in text and "MarkupError" not in text


# ----------------------------------------------------------------------------- every output format


def test_table(folder):
    result, stdout, stderr = _invoke("leaderboard", "show", str(folder))
    _assert_clean(result, stdout, stderr)
    assert not stderr.strip()  # every hostile record is valid: none skipped
    # shown as itself, not read as markup or emoji codes (a cell may wrap at a space)
    for h in ("crad[/x]", "red]loud[/bold", "[link=http", ":skull:", "`rm"):
        assert h in stdout
    assert "│ ab " in stdout and "overwritten" in stdout  # the escapes removed, the text kept


@pytest.mark.parametrize("columns", [(), ("--columns", "all")], ids=["readable", "all-columns"])
def test_markdown_rows_stay_rows(folder, columns):
    result, stdout, stderr = _invoke("leaderboard", "show", str(folder), "--format", "markdown", *columns)
    _assert_clean(result, stdout, stderr)
    # no value becomes markup, whether in a cell or in a section's "same in every row" line
    assert "<" not in stdout and ">" not in stdout.replace("->", "")  # no raw HTML
    assert not re.search(r"(?<!\\)`", stdout)  # no code span
    assert not re.search(r"(?<!\\)\[click\]", stdout)  # no link
    if not columns:  # the structure, below, with every column (the default leaves some out)
        return
    loaded, _ = load_records([folder])
    rows, unmatched = display_rows(build_board(board_records(loaded)[0]))
    tables = stdout.split("\npublished figures with no reproduced group:\n\n")
    assert len(tables) == (2 if unmatched else 1)
    sections = re.split(r"(?:^|\n)\*\*Setting: [^\n]*\*\*\n\n", tables[0])[1:]  # one table per setting section
    # each table without the notes after it (records with no final figure: the fallback note)
    assert all("Note: " not in t.split("\n\nNote: ")[0] for t in sections)
    sections = [t.split("\n\nNote: ")[0] for t in sections]
    assert sum(len(t.strip("\n").split("\n")) - 2 for t in sections) == len(rows)
    every = text_columns() + chosen_columns()  # "all": the defaults and those shown only when chosen
    checks = [*((t, every, None) for t in sections), (tables[-1], UNMATCHED_COLUMNS, len(unmatched))]
    for text, columns, n_rows in checks:
        lines = text.strip("\n").split("\n")
        assert n_rows is None or len(lines) == 2 + n_rows  # no value added a row
        for line in lines:
            assert line.startswith("|") and line.endswith("|")
            assert len(re.findall(r"(?<!\\)\|", line)) == len(columns) + 1  # nor a column
    assert "<" not in stdout and ">" not in stdout.replace("->", "")  # no raw HTML
    assert not re.search(r"(?<!\\)`", stdout)  # no code span
    assert not re.search(r"(?<!\\)\[click\]", stdout)  # no link
    assert "\\[/x\\]" in stdout and "&lt;img src=x onerror=alert(1)&gt;" in stdout


def test_compare_markdown_escapes_the_setting_and_protocol_lines(folder):
    """Hostile task names reach ``compare --format markdown`` through each table's protocol line
    (crad against local on every hostile task): each line stays one line, each table keeps its
    columns, and no markup survives."""
    result, stdout, stderr = _invoke("leaderboard", "compare", str(folder), "--against", "local", "--format",
                                     "markdown")
    _assert_clean(result, stdout, stderr)
    heads = [line for line in stdout.split("\n") if line.startswith("**Setting: ")]
    assert len(heads) == len(HOSTILE)  # one table per hostile task, no value added a line
    for line in stdout.split("\n"):
        if line.startswith("|"):
            assert len(re.findall(r"(?<!\\)\|", line)) == 9  # the 8 columns: no value added one
    assert "<" not in stdout and ">" not in stdout.replace("->", "")  # no raw HTML
    assert not re.search(r"(?<!\\)`", stdout)  # no code span
    assert not re.search(r"(?<!\\)\[click\]", stdout)  # no link


def test_csv_parses_and_defuses_formulas(folder):
    result, stdout, stderr = _invoke("leaderboard", "show", str(folder), "--format", "csv")
    _assert_clean(result, stdout, stderr)
    rows = list(csv.reader(io.StringIO(stdout)))
    assert rows[0] == list(csv_columns())
    assert all(len(r) == len(csv_columns()) for r in rows)
    cells = [c for r in rows[1:] for c in r]
    assert "'" + HOSTILE["formula"] in cells and "'" + HOSTILE["formula-at"] in cells
    assert not [c for c in cells if c[:1] in ("=", "@", "+")]
    assert not [c for c in cells if c.startswith("-") and not re.fullmatch(r"-[0-9.e+-]+", c)]


def test_json_keeps_the_data_exactly(folder):
    result, stdout, stderr = _invoke("leaderboard", "show", str(folder), "--format", "json")
    _assert_clean(result, stdout, stderr)
    board = json.loads(stdout)
    methods = {g["method"] for g in board["groups"]}
    tasks = {g["task"] for g in board["groups"]}
    assert set(HOSTILE.values()) <= methods and set(HOSTILE.values()) <= tasks  # JSON escapes, never alters


@pytest.mark.parametrize("fmt", ["table", "markdown", "csv", "json"])
def test_rank(folder, fmt):
    result, stdout, stderr = _invoke("leaderboard", "show", str(folder), "--rank", "--format", fmt,
                                     *(("--columns", "all") if fmt == "markdown" else ()))
    _assert_clean(result, stdout, stderr)
    if fmt == "markdown":
        lines = [line for line in stdout.strip("\n").split("\n") if line]
        headings = [line for line in lines if not line.startswith("|")]  # each setting section's label
        assert headings and all(h.startswith("**Setting: ") and h.endswith("**") for h in headings)
        # six columns (#, method, mean rank, rank interval, protocols, ranks): seven unescaped pipes per row
        assert all(len(re.findall(r"(?<!\\)\|", line)) == 7 for line in lines if line not in headings)


def test_show_every_record(folder):
    for path in sorted(folder.glob("r*.json")):
        result, stdout, stderr = _invoke("show", str(path))
        _assert_clean(result, stdout, stderr)
    result, stdout, stderr = _invoke("show", str(folder / "r000.json"))
    assert "crad[/x]" in stdout


def test_validate(folder):
    result, stdout, stderr = _invoke("leaderboard", "validate", str(folder))
    _assert_clean(result, stdout, stderr)


def test_plots_captions_and_sidecars(folder, tmp_path):
    out = tmp_path / "plots"
    # digits holds every hostile method name; three hostile task names cover file names and captions
    # (all twenty would draw 80 figures, a minute of a 2-core machine, for no further case)
    tasks = ["digits", HOSTILE["math"], HOSTILE["clear-screen"], HOSTILE["newline-row"]]
    result, stdout, stderr = _invoke("plot", "all", str(folder), "--out", str(out),
                                     *[arg for t in tasks for arg in ("--task", t)])
    _assert_clean(result, stdout, stderr)
    sidecars = sorted(out.glob("*.sources.json"))
    assert len(sidecars) == 4 * len(tasks)  # every task drew every kind, math and all
    assert all(p.parent == out for p in out.rglob("*"))  # hostile task names never leave --out
    for sidecar in sidecars:
        text = sidecar.read_text()
        assert not CONTROL.search(text)  # JSON escapes what it keeps of the records
        data = json.loads(text)
        assert not CONTROL.search(data["caption"])  # the caption drawn on the figure
        assert (out / data["png"]).is_file()
        assert all(not CONTROL.search(g["label"]) for g in data["groups"])


# ----------------------------------------------------------------------------- flags and suites


@pytest.mark.parametrize("args, needle", [
    (["run", "--set", "aggregator=crad[lcb]", "--rounds", "1", "--clients", "3"], "unknown aggregator 'crad[lcb]'"),
    (["run", "--method", "crad[/x]"], "unknown method 'crad[/x]'"),
    (["list", "me[red]th\x1b[2J"], "unknown kind 'me[red]th\\x1b[2J'"),
    (["leaderboard", "show", "--format", "x[/y]"], "unknown --format 'x[/y]'"),
    (["leaderboard", "show", "no[/such]\x1b]0;t\x07folder"], "no such file or folder: no[/such]"),
])
def test_flag_values_are_quoted_as_given(args, needle, tmp_path):
    result, stdout, stderr = _invoke(*args, *(["--out", str(tmp_path / "o")] if args[0] == "run" else []))
    _assert_clean(result, stdout, stderr, code=2)
    text = (stdout + stderr).strip()
    assert len(text.splitlines()) == 1 and text.startswith("error:"), text
    assert needle in text, text


def test_hostile_suite_name_and_method_names(tmp_path):
    suite = tmp_path / "s.yaml"
    suite.write_text(yaml.safe_dump({"name": "[bold]x[/y]\x1b[2J", "methods": ["local"], "tasks": ["digits"],
                                     "out": str(tmp_path / "o")}))
    result, stdout, stderr = _invoke("matrix", str(suite), "--dry-run")
    _assert_clean(result, stdout, stderr)
    assert "suite [bold]x[/y]" in stdout
    suite.write_text(yaml.safe_dump({"methods": ["crad[/x]\x1b[2J"], "tasks": ["digits"], "out": str(tmp_path / "o")}))
    result, stdout, stderr = _invoke("matrix", str(suite))
    _assert_clean(result, stdout, stderr, code=2)
    assert "methods: method name 'crad[/x]\\x1b[2J' cannot name a record file" in stderr


# ----------------------------------------------------------------------------- the text functions


@pytest.mark.parametrize("raw, shown", [
    ("plain", "plain"),
    ("a\x1b[2J\x1b[Hb", "ab"),
    ("\x1b]8;;http://x\x07link\x1b]8;;\x07", "link"),
    ("\x1b]0;title\x1b\\t", "t"),
    ("\x1bPdcs\x1b\\ok", "ok"),
    ("c1\x9b31mred", "c1red"),
    ("two\nlines\tand\rcr", "two lines and cr"),
    ("nul\x00del\x7f", "nuldel"),
    ("bidi\u202eevil\u2066x\u2069", "bidievilx"),
    ("ünïcödé ✓ ±", "ünïcödé ✓ ±"),
])
def test_terminal(raw, shown):
    assert terminal(raw) == shown


def test_markdown_csv_and_matplotlib_escapes():
    assert markdown_cell("a|b\nc") == "a\\|b c"
    assert markdown_cell("<b>&`x`[l](u)*") == "&lt;b&gt;&amp;\\`x\\`\\[l\\](u)\\*"
    assert markdown_cell("back\\slash|") == "back\\\\slash\\|"
    assert csv_cell("=1+1") == "'=1+1" and csv_cell("-2") == "'-2" and csv_cell("@x") == "'@x"
    assert csv_cell(-2.5) == -2.5 and csv_cell(None) is None and csv_cell("a\nb") == "a b"
    assert mpl_text("$x$ costs $5") == r"\$x\$ costs \$5" and mpl_text("_x") == " _x"


def test_continue_command_is_one_quoted_line():
    assert shell_quote("plain") == "plain" and shell_quote("a b") == "'a b'"
    assert shell_quote("x\x1b[2J'") == "$'x\\x1b[2J\\''"
    line = command_line(["--resume"], argv=["/nowhere/hfl-bench", "run", "--out", "my runs", "--seed", "1"])
    assert line.endswith("run --out 'my runs' --seed 1 --resume")
    line = command_line(["--resume"], argv=["/nowhere/hfl-bench", "run", "--resume"])
    assert line.endswith("run --resume") and line.count("--resume") == 1
