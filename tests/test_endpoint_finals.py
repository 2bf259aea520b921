"""Schema 1.7: a record's headline block (``metrics.headline``, what every view reads) and its
selected round named as such (``metrics.selected``); every extra endpoint has a per-round curve
(``history[].endpoints``) and a final-window figure (``metrics.final.endpoints``) computed like the
model's, and the views and paired comparisons read an endpoint at the headline's statistic. Runs
are real runs of the CLI (``run_record``) with the quick protocol."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest

from hfl_bench.record.check import problems as record_problems
from hfl_bench.recording import final_endpoints, final_figures
from hfl_bench.results.figures import headline_basis, headline_value
from hfl_bench.results.figures import statistic_value as compared_value

QUICK = ("--clients", "4", "--rounds", "4", "--eval-every", "1", "--local-epochs", "1", "--batch-size", "64")


@pytest.fixture(scope="module")
def fml(tmp_path_factory):
    """One real FML run: its meme is an extra endpoint, evaluated at every test round."""
    from pathlib import Path

    from typer.testing import CliRunner

    from hfl_bench.cli import app

    out = tmp_path_factory.mktemp("fml")
    result = CliRunner().invoke(app, ["run", "--method", "fml", "--task", "digits", *QUICK, "--out", str(out),
                                      "--json", "-q"])
    assert result.exit_code == 0, result.output
    record = json.loads(Path(json.loads(result.stdout)["record"]).read_text())
    assert record["schema_version"] == "1.11" and record_problems(record) == []  # the schema knows every new field
    return record


def test_the_headline_block_is_first_and_is_what_every_view_reads(fml):
    metrics = fml["metrics"]
    assert list(metrics)[:2] == ["headline", "selected"]
    block = metrics["headline"]
    assert block["statistic"] == headline_basis(fml) == "final" and block["clients"] == "all"
    assert block["value"] == headline_value(fml) == metrics["final"]["global_acc"]
    assert block["window"] == {k: metrics["final"][k] for k in ("rounds", "first_round", "last_round")}
    # the selected round's figures, named as such (and still at the top level for older readers)
    assert metrics["selected"] == {"round": fml["selection"]["round"], "global_acc": metrics["global_acc"],
                                   "local_acc": metrics["local_acc"], "mean_val_acc": metrics["mean_val_acc"]}


def test_every_test_round_has_the_endpoints_figures_and_the_final_window_averages_them(fml):
    tested = [h for h in fml["history"] if h.get("global_acc") is not None]
    assert len(tested) == 5  # rounds 0-4, --eval-every 1
    assert all(set(h["endpoints"]) == {"meme"} for h in tested)
    window = [h for h in tested if h["round"] >= 1][-fml["metrics"]["final"]["rounds"]:]
    final = fml["metrics"]["final"]["endpoints"]["meme"]
    for key in ("global_acc", "local_acc"):
        assert final[key] == pytest.approx(np.mean([h["endpoints"]["meme"][key] for h in window]), abs=1e-4)
    # the selected round's endpoint figure is that round's history entry
    selected = next(h for h in fml["history"] if h["round"] == fml["selection"]["round"])
    assert fml["metrics"]["extra_endpoints"]["meme"] == selected["endpoints"]["meme"]
    assert compared_value(fml, endpoint="meme") == final["global_acc"]
    assert compared_value(fml, "selected", endpoint="meme") == selected["endpoints"]["meme"]["global_acc"]


def test_an_endpoint_without_a_final_figure_falls_back_to_its_selected_round_marked(fml):
    old = copy.deepcopy(fml)
    del old["metrics"]["final"]["endpoints"]
    assert headline_basis(old, endpoint="meme") == "selected"
    assert headline_value(old, endpoint="meme") == old["metrics"]["extra_endpoints"]["meme"]["global_acc"]
    assert compared_value(old, endpoint="meme") is None  # a comparison reads exactly the figure asked for


def test_an_endpoint_missing_from_a_round_of_the_window_has_no_final_figure():
    rows = [{"round": r, "global_acc": 50.0, "endpoints": {"q": {"global_acc": 40.0 + r, "local_acc": None}}}
            for r in (1, 2, 3)]
    assert final_endpoints(rows) == {"q": {"global_acc": 42.0, "local_acc": None}}
    rows[1]["endpoints"] = {}
    assert final_endpoints(rows) == {}
    assert "endpoints" not in final_figures([{"round": 0, "global_acc": 10.0}, *rows])
