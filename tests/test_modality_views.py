"""Multimodal runs in the results layer: record schema 1.4 (written only for a run with modalities,
validated with clear messages), the recipients' headline in `leaderboard show` (json, csv, table,
markdown) and the matrix summary, each extra endpoint's figure over recipients, donors and all
clients, the modality setting in the rank's protocol, and the HTML rows and group pages. Records
are a real record's variants (as in test_fault_views); ``build_record`` runs on a fake RunResult
whose per-client arrays give figures checked by hand."""

from __future__ import annotations

import copy
import csv
import io
import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from hfl_bench.cli import app
from hfl_bench.config import RunConfig, config_hash
from hfl_bench.federation import RoundMetrics, RunResult
from hfl_bench.matrix.runner import summary_row
from hfl_bench.matrix.suite import Cell
from hfl_bench.metering import Budget
from hfl_bench.method_card import MethodCard
from hfl_bench.record.check import problems as record_problems
from hfl_bench.record.io import load_schema
from hfl_bench.recording import SCHEMA_VERSION, build_record, strict_record
from hfl_bench.results.board import build_board
from hfl_bench.results.loading import load_records

from test_fault_views import REAL, show, write

NAMES = ["image", "signal"]
SHAPES = [{"name": "image", "shape": [1, 8, 8]}, {"name": "signal", "shape": [40]}]


@pytest.fixture(scope="module")
def real() -> dict:
    r = json.loads(REAL.read_text())
    r["history"] = r["history"][:3]
    r["method"]["version"] = "1.0"
    return r


def section(n: int, seed: int, missing: str = "signal", fraction: float = 0.5) -> dict:
    """A modalities section: the clients of the seed's parity are recipients (seed 0: 0, 2, ...)."""
    names = NAMES if missing in NAMES else [NAMES[0], missing]
    recipients = [c for c in range(n) if c % 2 == seed % 2][:round(fraction * n)]
    return {"names": list(names), "missing": missing, "recipient_fraction": fraction, "recipients": recipients,
            "donors": [c for c in range(n) if c not in recipients],
            "observed": [[m for m in names if m != missing] if c in recipients else list(names) for c in range(n)],
            "rule": "a seeded draw of round(fraction * N) clients miss the modality", "version": "1.0",
            "hash": "0123456789abcdef"}


def mm_record(base: dict, seed: int, method: str, every: float, recipients: float, donors: float, *,
              endpoints: dict[str, tuple[float, float, float]] | None = None, missing: str = "signal",
              fraction: float = 0.5) -> dict:
    """A 1.4 record: global accuracy over all clients, the recipients and the donors; each endpoint
    as (all, recipients, donors) global accuracy, local accuracy 1 below it."""
    r = copy.deepcopy(base)
    r["schema_version"] = "1.4"
    r["method"]["name"] = r["config"]["method"] = method
    r["config"].update(seed=seed, missing_modality=missing, recipient_fraction=fraction)
    r["seeds"] = {k: seed for k in r["seeds"]}
    r["config_hash"] = config_hash(r["config"])
    r["record_id"] = f"{r['config_hash']}-{seed}"
    r["partition"]["hash"] = f"part-seed{seed}"
    r["task"]["modalities"] = copy.deepcopy(SHAPES)
    n = r["federation"]["n_clients"]
    r["modalities"] = section(n, seed, missing, fraction)
    endpoints = endpoints or {}
    m = r["metrics"]
    m["global_acc"] = every
    m["extra_endpoints"] = {e: {"global_acc": a, "local_acc": a - 1} for e, (a, _, _) in endpoints.items()}
    for i, (who, acc) in enumerate((("recipients", recipients), ("donors", donors)), start=1):
        m[who] = {"n_clients": len(r["modalities"][who]), "global_acc": acc, "local_acc": acc - 1,
                  "mean_val_acc": acc - 2,
                  "endpoints": {e: {"global_acc": v[i], "local_acc": v[i] - 1} for e, v in endpoints.items()}}
    assert record_problems(r) == [], record_problems(r)
    return r


def plain(base: dict, seed: int, method: str, acc: float) -> dict:
    r = copy.deepcopy(base)
    r["method"]["name"] = r["config"]["method"] = method
    r["config"]["seed"] = seed
    r["config_hash"] = config_hash(r["config"])
    r["record_id"] = f"{r['config_hash']}-{seed}"
    r["metrics"]["global_acc"] = acc
    return r


SIGNAL = "missing=signal recipients=0.5"
IMAGE = "missing=image recipients=0.5"


@pytest.fixture(scope="module")
def folder(real, tmp_path_factory) -> Path:
    """fedsocket (endpoints q and joint), missing signal at 0.5: seeds 0 and 1, all clients 70 / 72,
    recipients 60 / 64, donors 80 / 80. local there: all 75 (above fedsocket's), recipients 50
    (below). Missing image at 0.5: fedsocket recipients 40, local 45. Without modalities: local 90,
    crad 80."""
    ends = [{"q": (75.0, 68.0, 82.0), "joint": (74.0, 66.0, 82.0)},
            {"q": (77.0, 70.0, 84.0), "joint": (76.0, 68.0, 84.0)}]
    rs = [mm_record(real, s, "fedsocket", every, rec, 80.0, endpoints=ends[s])
          for s, every, rec in ((0, 70.0, 60.0), (1, 72.0, 64.0))]
    rs.append(mm_record(real, 0, "local", 75.0, 50.0, 100.0))
    rs.append(mm_record(real, 0, "fedsocket", 60.0, 40.0, 80.0, missing="image", endpoints=ends[0]))
    rs.append(mm_record(real, 0, "local", 65.0, 45.0, 85.0, missing="image"))
    rs += [plain(real, 0, "local", 90.0), plain(real, 0, "crad", 80.0)]
    return write(tmp_path_factory.mktemp("modalities") / "runs", *rs)


def groups(folder: Path) -> dict[tuple, dict]:
    board = json.loads(show(str(folder), "--format", "json"))
    return {(g["method"], (g.get("modalities") or {}).get("setting", "none")): g for g in board["groups"]}


# ----------------------------------------------------------------------------- schema 1.4


def test_schema_1_4_is_1_3_plus_the_modality_fields():
    s13, s14 = load_schema("1.3"), load_schema("1.4")
    assert s14["properties"]["schema_version"] == {"const": "1.4"} and "modalities" not in s13["properties"]
    assert set(s14["properties"]) - set(s13["properties"]) == {"modalities"}
    added = set(s14["properties"]["metrics"]["properties"]) - set(s13["properties"]["metrics"]["properties"])
    assert added == {"recipients", "donors"}


def test_a_1_4_record_without_or_with_a_bad_modalities_section_is_rejected(real):
    """Checked as ``leaderboard validate`` does: against the frozen 1.4 schema, then upgraded, by the model."""
    good = mm_record(real, 0, "fedsocket", 70.0, 60.0, 80.0, endpoints={"q": (75.0, 68.0, 82.0)})
    assert record_problems(good, frozen=True) == []

    def problems(change) -> list[str]:
        r = copy.deepcopy(good)
        change(r)
        return record_problems(r, frozen=True)

    assert "(record): 'modalities' is a required property" in problems(lambda r: r.pop("modalities"))
    assert "metrics: 'recipients' is a required property" in problems(lambda r: r["metrics"].pop("recipients"))
    assert any(p.startswith("modalities/recipients:") for p in problems(lambda r: r["modalities"].update(recipients=3)))
    assert any(p.startswith("modalities/hash:") for p in problems(lambda r: r["modalities"].update(hash="xyz")))
    assert any(p.startswith("modalities/recipient_fraction:")
               for p in problems(lambda r: r["modalities"].update(recipient_fraction=1.5)))
    # what the schema cannot say, said as clearly
    assert problems(lambda r: r["modalities"].update(missing="audio")) == [
        "modalities/missing: 'audio' is not one of the modalities ['image', 'signal']"]
    both = problems(lambda r: r["modalities"]["donors"].append(0))
    assert "modalities: clients [0] are both recipients and donors" in both
    assert problems(lambda r: r["modalities"]["observed"][0].append("signal")) == [
        "modalities/observed/0: recipient 0 observes the missing modality 'signal'"]
    assert problems(lambda r: r["metrics"]["recipients"].update(n_clients=4)) == [
        "metrics/recipients/n_clients: 4, but modalities lists 5 recipients"]
    assert any(p.startswith("metrics/donors/endpoints/q/global_acc:")
               for p in problems(lambda r: r["metrics"]["donors"]["endpoints"]["q"].update(global_acc=120.0)))


# ----------------------------------------------------------------------------- build_record


class FakeMethod:
    card = MethodCard(name="fake", version="1.0", fidelity="paper", topology="p2p", citation="Doe et al.",
                      summary="A stand-in for build_record.")

    def hparams(self) -> dict:
        return {}

    def predictor(self) -> str:
        return self.card.predictor

    def transfer(self) -> str:
        return self.card.transfer

    def describe_run(self, fed) -> dict:
        return {}


def fake_result(modalities: dict | None = None, faults: dict | None = None) -> tuple[RunConfig, RunResult]:
    """Four clients; recipients 1 and 3 and donors 0 and 2 when ``modalities`` is set."""
    nan = float("nan")
    best = RoundMetrics(
        round=2, val_acc=np.array([50.0, 60.0, 70.0, 80.0]), local_acc=np.array([40.0, nan, 60.0, 90.0]),
        global_acc=np.array([10.0, 20.0, 30.0, 40.0]), global_class_acc=np.full((4, 3), 25.0),
        endpoints={"q": {"global_acc": 65.0, "local_acc": 25.0}, "joint": {"global_acc": 2.5, "local_acc": None}},
        endpoint_clients={"q": {"global_acc": np.array([50.0, 60.0, 70.0, 80.0]),
                                "local_acc": np.array([nan, 20.0, 30.0, nan])},
                          "joint": {"global_acc": np.array([1.0, 2.0, 3.0, 4.0]), "local_acc": np.full(4, nan)}})
    info = {"name": "digits", "version": "1.0", "num_classes": 3, "input_shape": [1, 1, 104],
            **({"modalities": SHAPES} if modalities else {})}
    fed = SimpleNamespace(
        data=SimpleNamespace(train_x=torch.zeros(6, 2), train_y=torch.tensor([0, 1, 2, 0, 1, 2]),
                             test_y=torch.tensor([0, 1]),
                             fingerprint="00112233445566aa"),
        clients=[SimpleNamespace(cid=c, arch=SimpleNamespace(name="cnn"), model=torch.nn.Linear(2, 3))
                 for c in range(4)],
        info=SimpleNamespace(name="digits", as_record=lambda: dict(info)), pool=SimpleNamespace(name="cpu"),
        partition=SimpleNamespace(scheme="dirichlet", params={"alpha": 0.3}, seed=0, hash="p0", heldout_fraction=0.2,
                                  public_size=0, pretrain_size=0,
                                  class_counts=lambda labels, c, split: np.ones((4, c), dtype=int)),
        num_classes=3, exec_path="fast", use_cuda_graphs=False, channel=SimpleNamespace(total=0),
        budget=Budget(4), device=torch.device("cpu"))
    history = [{"round": r, "mean_val_acc": v, "global_acc": g}
               for r, v, g in ((0, 9.0, 9.0), (1, 50.0, 20.0), (2, 65.0, 25.0))]
    cfg = RunConfig(method="fake-method", task="fake-task", clients=4, rounds=2, seed=0, local_epochs=1,
                    faults=faults["spec"] if faults else "")
    return cfg, RunResult(status="ok", error=None, best=best, history=history, fed=fed, method=FakeMethod(),
                          wall_time_s=1.0, peak_memory={}, bytes_sent_per_client_round=np.zeros((2, 4)),
                          code={"git_sha": None, "git_dirty": None}, faults=faults, modalities=modalities)


def test_build_record_writes_the_recipients_and_donors_figures():
    plan = section(4, 1)  # recipients 1 and 3, donors 0 and 2
    assert (plan["recipients"], plan["donors"]) == ([1, 3], [0, 2])
    cfg, result = fake_result(plan)
    record = strict_record(build_record(cfg, result))
    assert record["schema_version"] == SCHEMA_VERSION and record["status"] == "ok"
    assert record["modalities"] == plan and record["task"]["modalities"] == SHAPES
    m = record["metrics"]
    # recipients 1 and 3: global (20 + 40) / 2, local 90 (client 1 has no local half), val (60 + 80) / 2;
    # q: global (60 + 80) / 2, local 20 (client 3 has none); joint: global (2 + 4) / 2, no local figure
    assert m["recipients"] == {"n_clients": 2, "global_acc": 30.0, "local_acc": 90.0, "mean_val_acc": 70.0,
                               "endpoints": {"q": {"global_acc": 70.0, "local_acc": 20.0},
                                             "joint": {"global_acc": 3.0, "local_acc": None}}}
    # donors 0 and 2: global (10 + 30) / 2, local (40 + 60) / 2, val (50 + 70) / 2; q: (50 + 70) / 2, local 30
    assert m["donors"] == {"n_clients": 2, "global_acc": 20.0, "local_acc": 50.0, "mean_val_acc": 60.0,
                           "endpoints": {"q": {"global_acc": 60.0, "local_acc": 30.0},
                                         "joint": {"global_acc": 2.0, "local_acc": None}}}
    assert m["global_acc"] == 25.0 and m["extra_endpoints"]["q"] == {"global_acc": 65.0, "local_acc": 25.0}
    assert record_problems(record, frozen=True) == record_problems(record) == []


def test_build_record_without_modalities_has_no_client_groups():
    cfg, result = fake_result()
    record = build_record(cfg, result)
    assert record["schema_version"] == SCHEMA_VERSION == "1.11"
    assert "modalities" not in record and "modalities" not in record["task"]
    assert not {"recipients", "donors", "honest", "faulty"} & set(record["metrics"])
    assert record_problems(strict_record(record)) == []


def test_modalities_and_faults_together_write_both():
    faults = {"spec": "byzantine:[0]/random", "kind": "byzantine", "strength": None, "mode": "random",
              "fraction": None, "faulty_clients": [0], "honest_clients": [1, 2, 3]}
    cfg, result = fake_result(section(4, 1), faults)
    record = strict_record(build_record(cfg, result))
    assert record["schema_version"] == SCHEMA_VERSION and record["faults"]["kind"] == "byzantine"
    assert record["metrics"]["honest"]["global_acc"] == 30.0 and record["metrics"]["recipients"]["global_acc"] == 30.0
    assert record_problems(record) == []


# ----------------------------------------------------------------------------- leaderboard show


def test_the_headline_is_the_recipients_figure_in_json_and_csv(folder):
    board = json.loads(show(str(folder), "--format", "json"))
    assert "over the recipients" in board["headline"]
    gs = groups(folder)
    assert set(gs) == {("fedsocket", SIGNAL), ("local", SIGNAL), ("fedsocket", IMAGE), ("local", IMAGE),
                       ("local", "none"), ("crad", "none")}
    fs = gs[("fedsocket", SIGNAL)]
    assert fs["headline_clients"] == "recipients" and fs["modalities"] == {
        "setting": SIGNAL, "names": NAMES, "missing": "signal", "recipient_fraction": 0.5}
    assert fs["global_acc"] == {"mean": 62.0, "sd": 2.8284, "n": 2}  # recipients 60, 64
    assert fs["recipients"]["global_acc"] == fs["global_acc"] and fs["recipients"]["local_acc"]["mean"] == 61.0
    assert fs["donors"]["global_acc"] == {"mean": 80.0, "sd": 0.0, "n": 2}
    assert fs["all_clients"]["global_acc"]["mean"] == 71.0
    assert gs[("local", "none")]["headline_clients"] == "all" and gs[("local", "none")]["global_acc"]["mean"] == 90.0

    rows = list(csv.DictReader(io.StringIO(show(str(folder), "--format", "csv"))))
    by = {(r["row_type"], r["method"], r["modalities"], r["endpoint"]): r for r in rows}
    head = by[("reproduced", "fedsocket", SIGNAL, "")]
    assert head["headline_clients"] == "recipients" and float(head["global_mean"]) == 62.0
    assert float(head["all_global_mean"]) == 71.0 and float(head["donors_global_mean"]) == 80.0
    q = by[("endpoint", "fedsocket", SIGNAL, "q")]  # recipients 68, 70; donors 82, 84; all 75, 77
    assert (float(q["global_mean"]), float(q["donors_global_mean"]), float(q["all_global_mean"])) == (69.0, 83.0, 76.0)
    assert float(q["local_mean"]) == 68.0 and q["n_seeds"] == "2"
    assert by[("reproduced", "local", "none", "")]["donors_global_mean"] == ""
    assert not [r for r in rows if r["row_type"] == "endpoint" and r["modalities"] == "none"]


def test_endpoint_figures_per_client_group(folder):
    loaded, _ = load_records([folder])
    board = build_board(loaded)
    g = next(g for g in board.groups if g.method == "fedsocket" and g.modalities == SIGNAL)
    assert g.is_multimodal and g.headline_clients == "recipients" and g.endpoints() == ["joint", "q"]
    assert g.stat("global_acc", "q").mean == 69.0  # the headline: recipients
    assert [g.stat("global_acc", "q", who).mean for who in ("recipients", "donors", "all")] == [69.0, 83.0, 76.0]
    assert [g.stat("local_acc", "joint", who).mean for who in ("recipients", "donors", "all")] == [66.0, 82.0, 74.0]
    assert g.stat("global_acc", "q", "honest").n == 0  # no such figure in a record
    plain_group = next(g for g in board.groups if g.method == "local" and not g.is_multimodal)
    assert plain_group.headline_clients == "all" and plain_group.modalities == "none"
    ep = groups(folder)[("fedsocket", SIGNAL)]["endpoints"]["q"]
    assert ep["global_acc"]["mean"] == 69.0 and ep["recipients"]["global_acc"]["mean"] == 69.0
    assert ep["donors"]["global_acc"]["mean"] == 83.0 and ep["all_clients"]["global_acc"]["mean"] == 76.0


def test_table_and_markdown_say_whose_figure_the_headline_is(folder):
    table = show(str(folder))
    assert "global and local acc and the selected figures are over the recipients" in " ".join(table.split())
    assert "↳ donors" in table and "↳ [q] recipients" in table
    markdown = show(str(folder), "--format", "markdown")
    assert "Note: multimodal groups" in markdown and SIGNAL in markdown
    section = next(part for part in markdown.split("**Setting: ") if SIGNAL in part.split("\n\n| ")[0])
    line = next(x for x in section.splitlines() if x.startswith("| fedsocket |"))  # the setting: above the table
    assert "62.00 ± 2.83" in line  # the recipients' figure is the group's own row
    assert "↳ all clients | " in markdown and "71.00 ± 1.41" in markdown


def test_single_modality_output_is_unchanged(folder, tmp_path):
    clean = tmp_path / "clean"
    clean.mkdir()
    for f in folder.glob("*.json"):
        if "modalities" not in json.loads(f.read_text()):
            (clean / f.name).write_text(f.read_text())
    board = json.loads(show(str(clean), "--format", "json"))
    assert board["headline"].startswith("global_acc and local_acc are the headline statistic (final: the mean over "
                                        "the last evaluated rounds;")
    assert "over the honest clients for a group run with faults (metrics.honest), over all clients otherwise" in (
        board["headline"])
    assert not [k for g in board["groups"] for k in ("modalities", "recipients", "donors") if k in g]
    markdown = show(str(clean), "--format", "markdown")
    assert "Note: multimodal" not in markdown and "↳" not in markdown and "recipients" not in show(str(clean))


def test_protocols_separate_modality_settings(folder):
    rank = json.loads(show(str(folder), "--rank", "--format", "json"))["rank"]
    protocols: dict[str, dict] = {}
    for row in rank:
        for x in row["ranks"]:
            protocols.setdefault(x["protocol"], {})[row["method"]] = x["rank"]
    assert len(protocols) == 3
    signal = next(p for p in protocols if p.endswith(SIGNAL))
    image = next(p for p in protocols if p.endswith(IMAGE))
    clean = next(p for p in protocols if "missing=" not in p)
    # local's all-client figure (75) is above fedsocket's (71); the rank reads the recipients' (50 < 62)
    assert protocols[signal] == {"fedsocket": 1, "local": 2} and protocols[image] == {"local": 1, "fedsocket": 2}
    assert protocols[clean] == {"local": 1, "crad": 2}


def test_the_matrix_summary_headline_is_the_recipients(real):
    record = mm_record(real, 0, "fedsocket", 70.0, 60.0, 80.0)
    row = summary_row(Cell(RunConfig(method="fedsocket", task="digits")), record, "ok", None)
    assert row["global_acc"] == 60.0
    row = summary_row(Cell(RunConfig(method="crad", task="digits")), plain(real, 0, "crad", 80.0), "ok", None)
    assert row["global_acc"] == 80.0


# ----------------------------------------------------------------------------- HTML


def test_html_rows_and_group_pages_show_the_recipients(folder, real, tmp_path):
    hostile = "<img src=x onerror=alert(1)>"
    runs = tmp_path / "runs"
    runs.mkdir()
    for f in folder.glob("*.json"):
        (runs / f.name).write_text(f.read_text())
    write(runs, mm_record(real, 0, "fedsocket", 70.0, 55.0, 80.0, missing=hostile))
    out = tmp_path / "site"
    result = CliRunner().invoke(app, ["leaderboard", "html", str(out), str(runs)])
    assert result.exit_code == 0, result.output
    index = (out / "index.html").read_text()
    assert "the headline global and local\naccuracy is the recipients'" in index
    assert f'data-modalities="{SIGNAL}"' in index and 'id="filter-modalities"' in index
    assert 'data-v="62.0">62.00 ± 2.83</td>' in index  # the group's sort value is the recipients' figure
    assert "↳ donors" in index and "↳ [q] all clients" in index and "80.00 ± 0.00" in index
    assert index.count('<section class="protocol"') == 4  # signal, image, the hostile name, none
    assert hostile not in index and "&lt;img src=x onerror=alert(1)&gt;" in index
    pages = {p: p.read_text() for p in (out / "groups").glob("*.html")}
    page = next(t for t in pages.values() if "fedsocket on digits" in t and SIGNAL in t)
    assert "recipients (metrics.recipients): the clients that miss a modality" in page
    assert "<th>selected global acc, recipients</th><td class=\"mono\">62.00 ± 2.83</td>" in page
    assert "<th>selected global acc, donors</th><td class=\"mono\">80.00 ± 0.00</td>" in page
    assert "<th>selected global acc, all clients</th><td class=\"mono\">71.00 ± 1.41</td>" in page
    assert "seed 0: [0, 2, 4, 6, 8]; seed 1: [1, 3, 5, 7, 9]" in page
    # these records hold an endpoint's selected round only (before schema 1.7): it stands in, marked
    assert "<td>q</td><td>donors</td><td class=\"num\">83.00 ± 1.41*</td>" in page
    assert not [t for t in pages.values() if hostile in t]
    plain_page = next(t for t in pages.values() if "<h1>crad on digits (cpu)</h1>" in t)
    assert "recipients" not in plain_page and "↳" not in plain_page and 'data-modalities="none"' in plain_page
