"""The static HTML leaderboard (`hfl-bench leaderboard html`): built by the real CLI from a few
committed records plus hostile hand-made ones, checked in its source (every record string escaped,
the no-network CSP, safe file names, deterministic) and in a real headless Chromium driven by
Playwright (rows against the records, sorting, filtering, a group page, no script from a record
runs, no network request)."""

from __future__ import annotations

import filecmp
import json
import re
import statistics
from pathlib import Path

import pytest
from markupsafe import escape
from typer.testing import CliRunner

from hfl_bench.cli import app

REPO = Path(__file__).resolve().parent.parent
MINI = REPO / "leaderboards" / "archive" / "first-wave" / "mini"
REPRODUCED = [MINI / "digits__crad__eeb0a26b41ab825c__seed0.json", MINI / "digits__crad__eeb0a26b41ab825c__seed1.json",
              MINI / "digits__fedavg__6340fec5c6ebc32d__seed0.json",
              # data-free on the heterogeneous pool, as crad: one setting section, one table to sort
              MINI / "digits__dfml__6a1ef72fa8925211__seed0.json", MINI / "digits__local__fba68acaac91804d__seed0.json"]
PUBLISHED = REPO / "leaderboards" / "published" / "fan2026crad__cifar10__crad__global_acc__40915a2d076d3c1a.json"

HOSTILE = '<script>window.pwned=1</script><img src=x onerror="window.pwned=2">'
# Every string the hostile records carry that the site shows.
HOSTILE_STRINGS = {
    "method": HOSTILE, "version": "v1<b>bold</b>&amp;", "faults": "drop<i>'quoted'</i>",
    "note": '<a href="http://example.com/x">link</a>', "python": "3.11<svg onload=window.pwned=3>",
    "locator": "Table 1 <iframe src=//example.com>", "citation": "evil<style>*{}</style>",
}
BROWSER_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                "--disable-background-networking", "--disable-component-update", "--disable-sync"]
CHROMIUM = Path("/usr/bin/chromium")


def _hostile_run() -> dict:
    r = json.loads(REPRODUCED[0].read_text())
    r["history"] = r["history"][:5]
    r["method"]["name"] = r["config"]["method"] = HOSTILE_STRINGS["method"]
    r["method"]["version"] = HOSTILE_STRINGS["version"]
    r["method"]["notes"] = [HOSTILE_STRINGS["note"]]
    r["config"]["faults"] = HOSTILE_STRINGS["faults"]
    r["environment"]["python"] = HOSTILE_STRINGS["python"]
    r["config_hash"] = "0123456789abcdef"
    r["record_id"] = "hostile0"
    r["metrics"]["global_acc"] = 12.5
    return r


def _hostile_published(group: dict) -> dict:
    """A published figure beside the crad group (digits, same partition and N), hostile citation."""
    p = json.loads(PUBLISHED.read_text())
    p["record_id"] = "published-digits"
    p["task"]["name"] = "digits"
    p["method"]["hparams"] = {"aggregator": "crad"}
    p["setting"].update(n_clients=10, clients_per_round=10, rounds=100)
    p["setting"]["pool"]["suite_name"] = group["arch_pool"]["name"]
    p["source"]["citation"]["locator"] = HOSTILE_STRINGS["locator"]
    p["source"]["citation"]["key"] = HOSTILE_STRINGS["citation"]
    p["metrics"]["global_acc"] = 50.0
    return p


@pytest.fixture(scope="module")
def records(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("records")
    for f in REPRODUCED + [PUBLISHED]:
        (folder / f.name).write_text(f.read_text())
    (folder / "hostile run.json").write_text(json.dumps(_hostile_run()))
    (folder / "zz__published_digits.json").write_text(
        json.dumps(_hostile_published(json.loads(REPRODUCED[0].read_text()))))
    (folder / "not_a_record.json").write_text(json.dumps({"hello": "<b>world</b>"}))
    return folder


def _build(records: Path, out: Path) -> str:
    result = CliRunner().invoke(app, ["leaderboard", "html", str(out), str(records)])
    assert result.exit_code == 0, result.output
    return result.output


@pytest.fixture(scope="module")
def site(records, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site") / "site"
    output = _build(records, out)
    assert "wrote" in output and (out / "index.html").is_file()
    return out


def _expected_rows() -> dict[str, str]:
    """Method -> 'mean ± sd' of the headline global accuracy, computed from the record files
    directly: these schema 1.0 records have no final figure, so it is the selected round's, marked
    ``*`` (``headline.FALLBACK_MARK``)."""
    by_method: dict[str, list[float]] = {}
    for f in REPRODUCED:
        r = json.loads(f.read_text())
        assert "final" not in r["metrics"]
        by_method.setdefault(r["method"]["name"], []).append(r["metrics"]["global_acc"])
    by_method[HOSTILE] = [12.5]
    out = {}
    for m, xs in by_method.items():
        sd = f"{round(statistics.stdev(xs), 4):.2f}" if len(xs) > 1 else "-"
        out[m] = f"{round(statistics.fmean(xs), 4):.2f} ± {sd}*"
    return out


# ----------------------------------------------------------------------------- the HTML source


def test_source_escapes_every_record_string_and_forbids_network(site):
    pages = [site / "index.html", *sorted((site / "groups").glob("*.html"))]
    assert len(pages) == 1 + 5  # crad, dfml, local, fedavg, the hostile method
    text = {p: p.read_text() for p in pages}
    hostile_page = next(p for p, t in text.items() if "groups" in p.parts and escape(HOSTILE) in t)
    for s in HOSTILE_STRINGS.values():
        for p, t in text.items():
            assert s not in t, f"{s!r} unescaped in {p}"
        shown_in = [p for p, t in text.items() if str(escape(s)) in t]
        assert shown_in, f"{s!r} not shown escaped anywhere"
    for key in ("method", "version", "faults", "note", "python"):
        assert str(escape(HOSTILE_STRINGS[key])) in text[hostile_page]
    for key in ("method", "version", "faults", "locator", "citation"):
        assert str(escape(HOSTILE_STRINGS[key])) in text[site / "index.html"]
    for p, t in text.items():
        m = re.search(r'<meta http-equiv="Content-Security-Policy" content="([^"]+)">', t)
        assert m, f"no CSP in {p}"
        assert "default-src 'none'" in m.group(1) and "img-src 'self' data:" in m.group(1)
        assert "unsafe-inline" not in m.group(1).split("script-src")[1].split(";")[0]
        assert not re.search(r"""<[^>]*\s(src|href)=["']?(https?:)?//""", t), f"external URL in {p}"
    # only the index has a script (sorting, filtering), and exactly one
    assert text[site / "index.html"].count("<script>") == 1
    assert all("<script>" not in t for p, t in text.items() if p.name != "index.html")


def test_safe_file_names_skipped_list_and_copied_records(site, records):
    for p in (site / "groups").iterdir():
        assert re.fullmatch(r"[A-Za-z0-9_.-]+\.html", p.name) and not p.name.startswith("."), p.name
    copied = sorted(p.name for p in (site / "records").iterdir())
    assert all(re.fullmatch(r"[A-Za-z0-9_-]+\.json", n) for n in copied), copied
    # every valid record (the hostile run and two published included)
    assert "hostile_run.json" in copied and len(copied) == len(REPRODUCED) + 3
    assert (site / "records" / REPRODUCED[0].name).read_bytes() == REPRODUCED[0].read_bytes()
    index = (site / "index.html").read_text()
    assert "not_a_record.json" in index and "Left out: 1" in index  # the skipped file, with why
    for href in re.findall(r'href="([^"]+)"', index):
        assert not href.startswith(("/", "file:")) and (site / href).exists(), href
    assert list((site / "plots").glob("*.png")), "no plots"
    assert re.search(r'<img src="plots/[^"]+\.png"', index)


def test_regenerating_gives_no_diff(site, records, tmp_path):
    again = tmp_path / "again"
    _build(records, again)
    _build(records, again)  # over a site it wrote: cleared and rewritten
    cmp = filecmp.dircmp(site, again)

    def same(c: filecmp.dircmp) -> bool:
        if c.left_only or c.right_only or c.funny_files:
            return False
        _, mismatch, errors = filecmp.cmpfiles(c.left, c.right, c.common_files, shallow=False)
        return not mismatch and not errors and all(same(s) for s in c.subdirs.values())
    assert same(cmp)


def test_refuses_a_folder_it_did_not_write(records, tmp_path):
    (tmp_path / "mine.txt").write_text("keep me")
    result = CliRunner().invoke(app, ["leaderboard", "html", str(tmp_path), str(records)])
    assert result.exit_code == 2 and (tmp_path / "mine.txt").read_text() == "keep me"


# ----------------------------------------------------------------------------- a real browser


@pytest.fixture(scope="module")
def browser():
    try:
        from playwright.sync_api import Error, sync_playwright
    except ImportError:
        pytest.skip("playwright is not installed (pip install playwright; the test extra has it)")
    if not CHROMIUM.exists():
        pytest.skip(f"no Chromium at {CHROMIUM} (apt-get install -y chromium; .ci/run installs it)")
    with sync_playwright() as p:
        try:
            b = p.chromium.launch(executable_path=str(CHROMIUM), args=BROWSER_ARGS)
        except Error as e:
            pytest.skip(f"Chromium at {CHROMIUM} cannot be started: {e}")
        yield b
        b.close()


def _cells(page, column: str, table: str = "table.leaderboard") -> list[str]:
    return page.eval_on_selector_all(
        f"{table} tbody.group:not([hidden]) tr.reproduced",
        """(rows, col) => rows.map(r => {
               const headers = Array.from(r.closest('table').tHead.rows[0].cells).map(c => c.textContent.trim());
               return r.cells[headers.indexOf(col)].textContent.trim(); })""", column)


@pytest.mark.slow  # drives Chromium
def test_in_a_headless_browser(site, browser, tmp_path):
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    requests: list[str] = []
    errors: list[str] = []
    page.on("request", lambda r: requests.append(r.url))
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto((site / "index.html").as_uri())
    page.wait_for_load_state("load")

    # the rows are the records': method names and mean ± sd of global accuracy
    expected = _expected_rows()
    names, accs = _cells(page, "method"), _cells(page, "global acc")
    assert sorted(names) == sorted(expected)
    assert dict(zip(names, accs)) == expected
    assert page.locator("tr.published").count() == 1  # the digits figure beside the crad group
    assert page.evaluate("Array.from(document.images).every(i => i.complete && i.naturalWidth > 0)")

    # one setting section each: the data-free heterogeneous one (crad, local), dfml's (models trained
    # on peers' data, with its reason), fedavg's single architecture, and the hostile run (a method no
    # registry knows, with a fault setting): never sorted or ranked with the others
    assert page.locator("h2.setting").count() == page.locator("section.protocol").count() == 4
    assert _cells(page, "method", "section.protocol:last-of-type table.leaderboard") == [HOSTILE]
    assert _cells(page, "method", "section.protocol:nth-of-type(2) table.leaderboard") == ["dfml"]
    assert _cells(page, "method", "section.protocol:nth-of-type(3) table.leaderboard") == ["fedavg"]
    assert page.locator("p.reason").count() == 1 and "travels" in page.locator("p.reason").inner_text()
    assert _cells(page, "predictor", "section.protocol:nth-of-type(2) table.leaderboard") == ["stored snapshot"]

    # sorting the first table: global accuracy ascending, then descending; by method name
    means = {m: float(a.split(" ± ")[0]) for m, a in expected.items() if m not in (HOSTILE, "fedavg", "dfml")}
    others = ["dfml", "fedavg", HOSTILE]
    page.locator("table.leaderboard th", has_text="global acc").first.click()
    assert _cells(page, "method") == sorted(means, key=means.get) + others
    page.locator("table.leaderboard th", has_text="global acc").first.click()
    assert _cells(page, "method") == sorted(means, key=means.get, reverse=True) + others
    page.locator("table.leaderboard th", has_text="method").first.click()
    assert _cells(page, "method") == sorted(means, key=str.lower) + others

    # the filters: one method, then back to all; one setting hides the other sections and their headings
    page.select_option("#filter-method", "fedavg")
    assert _cells(page, "method") == ["fedavg"]
    page.select_option("#filter-method", "")
    assert len(_cells(page, "method")) == 5
    page.select_option("#filter-setting", "data-free, single architecture, protocol budget")
    assert _cells(page, "method") == ["fedavg"] and page.locator("h2.setting:not([hidden])").count() == 1
    page.select_option("#filter-setting", "")
    assert len(_cells(page, "method")) == 5

    shot = tmp_path / "index.png"
    page.screenshot(path=str(shot), full_page=True)
    print(f"screenshot of the index: {shot}")

    # the hostile group's page: its name is text, nothing of it ran
    page.get_by_role("link", name=HOSTILE).click()
    page.wait_for_load_state("load")
    assert re.search(r"/groups/[A-Za-z0-9_.-]+\.html$", page.url)
    assert HOSTILE in page.locator("h1").inner_text()
    assert page.evaluate("typeof window.pwned") == "undefined"
    assert page.evaluate("document.querySelectorAll('script, iframe, svg, img').length") == 0
    assert page.locator("table.per-class tbody tr").count() == 10
    assert page.locator("table.per-arch tbody tr").count() >= 1
    link = page.locator("a", has_text="hostile run.json").first
    assert link.get_attribute("href") == "../records/hostile_run.json"

    page.go_back()
    page.wait_for_load_state("load")
    assert page.evaluate("typeof window.pwned") == "undefined"
    assert not errors, errors
    assert requests and all(u.startswith(("file://", "data:")) for u in requests), requests
    page.close()
