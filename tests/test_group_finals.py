"""Schema 1.5: a record with client groups (honest / faulty under faults, recipients / donors in a
multimodal run) carries each group's per-round figures in ``history`` and its ``final`` figures,
so the final figure beside a group headline is over the same clients (``leaderboard show`` in
every format), and ``plot curves`` / ``plot bytes`` draw the headline's clients. Records written
as 1.3 / 1.4 have only all clients' final figures: their headline's final shows '-' and curves
leave them out with the reason. Records are variants of a real record (``test_modality_views``)."""

from __future__ import annotations

import copy
import csv
import io
import json

import pytest

from hfl_bench.record.check import problems as record_problems
from hfl_bench.record.io import load_schema
from hfl_bench.recording import SCHEMA_VERSION, build_record, final_figures, strict_record
from hfl_bench.results.plots import headline_curve, make_plots

from test_fault_views import show, write
from test_modality_views import fake_result, mm_record, real, section  # noqa: F401 (real: a fixture)

# Per-round global accuracy of all clients, the recipients and the donors in a 1.5 variant:
# rounds 0, 1, 2 of the real record's first three history entries.
ROUNDS = {"all": (10.0, 50.0, 70.0), "recipients": (10.0, 40.0, 60.0), "donors": (10.0, 60.0, 80.0)}


def with_groups(r: dict, shift: float = 0.0) -> dict:
    """A 1.4 multimodal record made 1.5: per-round group figures (``ROUNDS`` + shift) and finals."""
    r = copy.deepcopy(r)
    r["schema_version"] = "1.5"
    for i, h in enumerate(r["history"]):
        h["global_acc"], h["local_acc"] = ROUNDS["all"][i] + shift, 90.0
        for who in ("recipients", "donors"):
            h[who] = {"global_acc": ROUNDS[who][i] + shift, "local_acc": 80.0 + i}
    r["metrics"]["final"] = final_figures(r["history"])
    for who in ("recipients", "donors"):
        r["metrics"][who]["final"] = final_figures(r["history"], who)
    return r


def test_schema_1_5_is_1_4_plus_the_groups_per_round_and_final_figures():
    s14, s15 = load_schema("1.4"), load_schema("1.5")
    assert s15["properties"]["schema_version"] == {"const": "1.5"}
    assert set(s15["properties"]) == set(s14["properties"])
    history = s15["properties"]["history"]["items"]["properties"]
    assert set(history) - set(s14["properties"]["history"]["items"]["properties"]) == {
        "honest", "faulty", "recipients", "donors"}
    metrics = s15["properties"]["metrics"]["properties"]
    assert all("final" in metrics[g]["properties"] for g in ("honest", "faulty", "recipients", "donors"))


@pytest.mark.parametrize("frozen", [True, False], ids=["frozen-schema", "model"])
def test_a_1_5_record_validates_and_a_bad_group_figure_is_named(real, frozen):  # noqa: F811 (real: the imported fixture)
    good = with_groups(mm_record(real, 0, "fedsocket", 70.0, 60.0, 80.0))
    assert record_problems(good, frozen) == []
    bad = copy.deepcopy(good)
    bad["history"][1]["recipients"]["global_acc"] = 140.0
    assert any(p.startswith("history/1/recipients/global_acc:") for p in record_problems(bad, frozen))
    bad = copy.deepcopy(good)
    bad["metrics"]["recipients"]["final"].pop("rounds")
    assert any(p.startswith("metrics/recipients/final") for p in record_problems(bad, frozen))


def test_build_record_gives_each_group_its_final_figures_from_its_history():
    cfg, result = fake_result(section(4, 1))  # recipients 1 and 3, donors 0 and 2
    for h, (rec, don) in zip(result.history, ((9.0, 9.0), (30.0, 10.0), (50.0, 20.0))):
        h["recipients"] = {"global_acc": rec, "local_acc": None}
        h["donors"] = {"global_acc": don, "local_acc": 70.0}
    record = strict_record(build_record(cfg, result))
    assert record["schema_version"] == SCHEMA_VERSION and record_problems(record) == []
    m = record["metrics"]
    # rounds 1 and 2 (round 0, before training, is never a final round)
    assert m["recipients"]["final"] == {"rounds": 2, "first_round": 1, "last_round": 2, "global_acc": 40.0,
                                        "local_acc": None}
    assert m["donors"]["final"]["global_acc"] == 15.0 and m["donors"]["final"]["local_acc"] == 70.0
    assert m["final"]["global_acc"] == 22.5  # all clients: (20 + 25) / 2


@pytest.fixture(scope="module")
def folder(real, tmp_path_factory):  # noqa: F811 (real: the imported fixture)
    """fedsocket seeds 0 and 1 as 1.5 (final: recipients 50 / 52, all 60 / 62); local seed 0 as 1.4."""
    rs = [with_groups(mm_record(real, s, "fedsocket", 70.0, 60.0, 80.0), shift=2.0 * s) for s in (0, 1)]
    local = mm_record(real, 0, "local", 75.0, 50.0, 100.0)  # as written before 1.5: only all clients' final
    local["metrics"]["final"] = final_figures(local["history"])
    rs.append(local)
    return write(tmp_path_factory.mktemp("finals") / "runs", *rs)


def test_the_final_figure_beside_a_group_headline_is_the_same_clients(folder):
    board = {g["method"]: g for g in json.loads(show(str(folder), "--format", "json"))["groups"]}
    fs, local = board["fedsocket"], board["local"]
    assert fs["final"]["global_acc"] == {"mean": 51.0, "sd": 1.4142, "n": 2}  # recipients 50, 52
    assert fs["final_all_clients"]["global_acc"]["mean"] == 61.0  # all clients 60, 62
    assert local["final"]["global_acc"]["n"] == 0  # a 1.4 record: no recipients' final figure

    rows = {(r["row_type"], r["method"]): r for r in csv.DictReader(io.StringIO(show(str(folder), "--format", "csv")))}
    assert float(rows[("reproduced", "fedsocket")]["final_global_mean"]) == 51.0
    assert float(rows[("reproduced", "fedsocket")]["all_final_global_mean"]) == 61.0
    assert rows[("reproduced", "local")]["final_global_mean"] == ""

    lines = show(str(folder), "--format", "markdown").splitlines()
    header = [c.strip() for c in next(line for line in lines if line.startswith("| method")).split("|")]
    at = header.index("global acc")  # the headline: the final figure, the selected round's where there is none

    def final_of(start: str) -> str:
        return next(line for line in lines if line.startswith(f"| {start}")).split("|")[at].strip()
    assert final_of("fedsocket") == "51.00 ± 1.41"
    assert final_of("local") == "50.00 ± -\\*"  # no recipients' final in a 1.4 record: the selected round's, marked
    all_rows = [line.split("|")[at].strip() for line in lines if "↳ all clients" in line]
    assert all_rows[0].startswith("61.00") and not all_rows[1].endswith("*")  # the 1.4 record has all clients' final


def test_curves_draw_the_recipients_and_leave_out_a_record_without_them(folder, tmp_path):
    r = json.loads(next(folder.glob("*fedsocket*seed0.json")).read_text())
    assert headline_curve(r) == dict(enumerate(ROUNDS["recipients"]))
    written, skipped = make_plots("curves", [folder], tmp_path / "plots")
    sources = json.loads(written[0].sources.read_text())
    assert [g["method"] for g in sources["groups"]] == ["fedsocket"]
    assert sources["details"]["y_axis"] == "global accuracy (%), recipients clients (the headline)"
    reasons = [s.reason for s in skipped if "local" in s.path]
    assert reasons == ["curves: no per-round recipients figures in history "
                       "(the headline's; written from schema 1.5 on)"]

    written, _ = make_plots("bytes", [folder], tmp_path / "plots")
    details = json.loads(written[0].sources.read_text())["details"]
    assert details["y_axis"] == ("global accuracy (%), mean of the last rounds (* selected round where a record has "
                                 "no final), recipients clients (the headline)")


def test_the_html_site_shows_each_groups_final_figure(folder, tmp_path):
    from typer.testing import CliRunner

    from hfl_bench.cli import app

    out = tmp_path / "site"
    result = CliRunner().invoke(app, ["leaderboard", "html", str(out), str(folder)])
    assert result.exit_code == 0, result.output
    index = (out / "index.html").read_text()
    assert 'data-v="51.0">51.00 ± 1.41</td>' in index  # fedsocket's final column: the recipients'
    pages = {p: p.read_text() for p in (out / "groups").glob("*.html")}
    page = next(t for t in pages.values() if "fedsocket on digits" in t)
    assert "<th>final global acc, recipients</th><td class=\"mono\">51.00 ± 1.41</td>" in page
    assert "<th>final global acc, all clients</th><td class=\"mono\">61.00 ± 1.41</td>" in page
    local = next(t for t in pages.values() if "local on digits" in t)
    assert "<th>final global acc, recipients</th><td class=\"mono\">-</td>" in local  # a 1.4 record
