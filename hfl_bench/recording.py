"""Writing a run's record: built from a run's result (or from a config and an error), made strict
JSON, written atomically, never lost (a fallback folder when its own cannot take it), and checked
before a run against a finished record of other data or another method version at its path. The
write side of ``hfl_bench.record``, beside the run path; the results layer only reads."""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

import hfl_bench
from hfl_bench.config import (
    FINAL_ROUNDS,
    HASH_NEUTRAL_DEFAULTS,
    HELD_MIN_TRAIN_COUNT,
    POOLED_SELECTION_RULE,
    SELECTION_RULE,
    ConfigError,
    RunConfig,
    config_hash,
)
from hfl_bench.paths import (
    UnsafePathError,
    checkpoint_for,
    inside,
    portable_config,
    record_filename,
    remove_checkpoint,
    unsaved_dirs,
    unsaved_folder,
    write_atomic,
)
from hfl_bench.provenance import environment, git_info, plugin_dist, plugins_used
from hfl_bench.record.io import CURRENT_VERSION, load_record, non_finite_fields

if TYPE_CHECKING:  # annotation only: reading records needs no torch
    from hfl_bench.federation import RunResult

SCHEMA_VERSION = CURRENT_VERSION  # what every new reproduced record (ok, diverged or failed) is written as
# Published records carry one figure from a paper and none of a run's sections: they stay 1.2,
# byte for byte what the generator (leaderboards/published/make_published.py) wrote before.
PUBLISHED_SCHEMA_VERSION = "1.2"


def _pct(x: float) -> float | None:
    return None if x is None or not np.isfinite(x) else round(float(x), 4)


def final_figures(history: list[dict[str, Any]], group: str | None = None,
                  n: int = FINAL_ROUNDS) -> dict[str, Any] | None:
    """Global and local accuracy averaged over the last ``n`` rounds that ran the global test
    (round 0, before training, excluded): the figures at the end of the budget, reported beside
    the selected round's; over all clients, or over a client ``group`` (its per-round figures in
    each history entry, ``Federation.client_groups``). None when no round after round 0 was
    evaluated (or the group has no clients)."""
    last = _final_rows(history, group, n)
    if not last:
        return None
    local = [h["local_acc"] for h in last if h.get("local_acc") is not None]
    out = {"rounds": len(last), "first_round": last[0]["round"], "last_round": last[-1]["round"],
           "global_acc": _pct(float(np.mean([h["global_acc"] for h in last]))),
           "local_acc": _pct(float(np.mean(local))) if local else None}
    if group is None and all(isinstance(h.get("client_global_acc"), list) for h in last):
        out["per_client"] = per_client_final(last)
    if endpoints := final_endpoints(last):
        out["endpoints"] = endpoints
    return out


def final_endpoints(rows: list[dict[str, Any]]) -> dict[str, dict[str, float | None]]:
    """Each extra endpoint's global and local accuracy averaged over the final window's rows (their
    ``endpoints``, schema 1.7), as the model's final figures are: the same rounds. An endpoint that a
    row of the window lacks (a record written before 1.7 has none) gets no final figure."""
    names = [set((h.get("endpoints") or {}) if isinstance(h.get("endpoints"), dict) else ()) for h in rows]
    common = sorted(set.intersection(*names)) if names else []

    def mean(name: str, key: str) -> float | None:
        values = [h["endpoints"][name].get(key) for h in rows if isinstance(h["endpoints"].get(name), dict)]
        present = [v for v in values if isinstance(v, (int, float))]
        # the global figure of every round, or none: a mean of some rounds is not the window's
        if key == "global_acc" and len(present) != len(rows):
            return None
        return _pct(float(np.mean(present))) if present else None

    return {name: {"global_acc": mean(name, "global_acc"), "local_acc": mean(name, "local_acc")} for name in common}


def per_client_final(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each client's global and local accuracy averaged over the final window's rows (their
    ``client_global_acc`` / ``client_local_acc``, schema 1.6); None where a client has no figure."""
    def means(key: str) -> list[float | None]:
        table = np.array([[np.nan if v is None else v for v in h.get(key) or []] for h in rows], dtype=float)
        if table.ndim != 2 or not table.size:
            return []
        return [_pct(float(np.mean(col))) if np.isfinite(col).all() else None for col in table.T]

    glob, local = means("client_global_acc"), means("client_local_acc")
    return [{"cid": cid, "global_acc": g, "local_acc": local[cid] if cid < len(local) else None}
            for cid, g in enumerate(glob)]


def _final_rows(history: list[dict[str, Any]], group: str | None, n: int) -> list[dict[str, Any]]:
    """The final window (``final_figures``): the last ``n`` history rows, after round 0, that ran the
    global test; a client group's own per-round figures where ``group`` is named."""
    rows = [h if group is None else {"round": h.get("round", 0), **(h.get(group) or {})} for h in history]
    evaluated = [h for h in rows if h.get("round", 0) >= 1 and h.get("global_acc") is not None]
    return evaluated[-n:]


def _mean_of(values: list[Any]) -> float | None:
    present = [v for v in values if v is not None]
    return _pct(float(np.mean(present))) if present else None


def _defined_mean(values: np.ndarray, idx: np.ndarray) -> tuple[float | None, int]:
    """The mean of the finite ``values[idx]`` and how many there are (nan: a client without the figure)."""
    v = np.asarray(values, dtype=float)[idx]
    ok = np.isfinite(v)
    return (_pct(float(v[ok].mean())) if ok.any() else None), int(ok.sum())


def seen_unseen_figures(best: Any, clients: list[int], history: list[dict[str, Any]],
                        group: str | None = None) -> dict[str, Any] | None:
    """The seen / unseen-class accuracy over ``clients`` (``RoundMetrics.seen_acc``): at the
    selected round, the mean over the clients that have the figure (a client that lacks no class
    has no unseen figure: ``n_clients_unseen`` counts those that do), and over the final window
    (``final_figures``' rounds; the history's per-round means, of all clients or of ``group``).
    None for a selected round without the figures (a run resumed from an older checkpoint)."""
    if getattr(best, "seen_acc", None) is None or getattr(best, "unseen_acc", None) is None:
        return None
    idx = np.asarray(clients, dtype=int)
    seen, n_seen = _defined_mean(best.seen_acc, idx)
    unseen, n_unseen = _defined_mean(best.unseen_acc, idx)
    out: dict[str, Any] = {"n_clients": int(idx.size), "n_clients_seen": n_seen, "n_clients_unseen": n_unseen,
                           "seen_acc": seen, "unseen_acc": unseen}
    last = _final_rows(history, group, FINAL_ROUNDS)
    if last:
        out["final"] = {"rounds": len(last), "first_round": last[0]["round"], "last_round": last[-1]["round"],
                        "seen_acc": _mean_of([h.get("seen_acc") for h in last]),
                        "unseen_acc": _mean_of([h.get("unseen_acc") for h in last])}
    return out


def all_clients_seen_unseen(best: Any, fed: Any, train_counts: np.ndarray,
                            history: list[dict[str, Any]]) -> dict[str, Any] | None:
    """``metrics.seen_unseen``: ``seen_unseen_figures`` over all clients, with the rule that says which
    classes a client holds (``min_train_count``), each architecture's means and each client's figures."""
    figures = seen_unseen_figures(best, [c.cid for c in fed.clients], history)
    if figures is None:
        return None
    n_held = (np.asarray(train_counts) >= HELD_MIN_TRAIN_COUNT).sum(1)
    by_arch: dict[str, list[int]] = {}
    for c in fed.clients:
        by_arch.setdefault(c.arch.name, []).append(c.cid)
    per_arch = {}
    for arch, cids in by_arch.items():
        seen, _ = _defined_mean(best.seen_acc, np.asarray(cids))
        unseen, n_unseen = _defined_mean(best.unseen_acc, np.asarray(cids))
        per_arch[arch] = {"seen_acc": seen, "unseen_acc": unseen, "n_clients_unseen": n_unseen}
    per_client = [{"cid": c.cid, "n_seen_classes": int(n_held[c.cid]), "seen_acc": _pct(best.seen_acc[c.cid]),
                   "unseen_acc": _pct(best.unseen_acc[c.cid])} for c in fed.clients]
    return {"min_train_count": HELD_MIN_TRAIN_COUNT, **figures, "per_arch": per_arch, "per_client": per_client}


def group_figures(best: Any, clients: list[int]) -> dict[str, Any]:
    """The selected round's mean global, local and validation accuracy over ``clients``."""
    if not clients:
        return {"n_clients": 0, "global_acc": None, "local_acc": None, "mean_val_acc": None}
    idx = np.asarray(clients)

    def mean(values: np.ndarray | None) -> float | None:
        if values is None:
            return None
        v = np.asarray(values, dtype=float)[idx]
        return _pct(float(np.nanmean(v))) if np.isfinite(v).any() else None

    return {"n_clients": len(clients), "global_acc": mean(best.global_acc), "local_acc": mean(best.local_acc),
            "mean_val_acc": mean(best.val_acc)}


def endpoint_figures(best: Any, clients: list[int]) -> dict[str, dict[str, float | None]]:
    """Each extra endpoint's selected-round accuracy over ``clients`` (``RoundMetrics.endpoint_clients``,
    averaged by ``evaluation.endpoint_means``: the mean global accuracy, the mean local accuracy over
    the clients that have a local test half; None where no client of the group has a figure)."""
    from hfl_bench.evaluation import endpoint_means  # torch: only where a run's record is built

    return {name: endpoint_means(per, clients)
            for name, per in (getattr(best, "endpoint_clients", None) or {}).items()}


def modality_figures(best: Any, clients: list[int]) -> dict[str, Any]:
    """``group_figures`` over ``clients`` plus each extra endpoint's figures over them: a multimodal
    run's ``metrics.recipients`` (the headline: the clients that miss a modality) or ``metrics.donors``."""
    return {**group_figures(best, clients), "endpoints": endpoint_figures(best, clients)}


def _headline_clients(result: RunResult) -> str:
    """Whose figure a run's headline is (``figures.headline_of`` reads it back from the record): the
    honest clients under faults, the recipients of a multimodal run that has any, else all."""
    if result.faults is not None:
        return "honest"
    return "recipients" if result.modalities is not None and result.modalities.get("recipients") else "all"


def headline_block(metrics: dict[str, Any], clients: str) -> dict[str, Any]:
    """The record's headline (schema 1.7, first in ``metrics``: where a script looks first): the
    figure, the statistic, whose clients and the window; the value is the final figure (the mean
    over the final window) of those clients, as every view reads it (``results.headline``), or the
    selected round's where the run has no final window (no round after 0 was evaluated)."""
    block = metrics if clients == "all" else metrics.get(clients) or {}
    final = block.get("final") if isinstance(block.get("final"), dict) else None
    if final is not None and final.get("global_acc") is not None:
        window = {k: final[k] for k in ("rounds", "first_round", "last_round")}
        return {"figure": "global_acc", "statistic": "final", "clients": clients, "value": final["global_acc"],
                "window": window}
    return {"figure": "global_acc", "statistic": "selected", "clients": clients, "value": block.get("global_acc"),
            "window": None}


def schema_version_of(result: RunResult) -> str:
    """The version a run's record is written as: the oldest that holds all of it (module constants:
    every run record has the seen / unseen-class figures and the budget of 1.6 and the peer data
    and predictor of 1.7)."""
    return SCHEMA_VERSION


def faults_section(cfg_dict: dict[str, Any], faults: dict[str, Any]) -> dict[str, Any]:
    """The record's ``faults`` block: the plan (``FaultPlan.record``), whose validation selected the
    reported round (``all``: every client's, the rule without faults, ``evaluation.select_round``;
    records written before it say ``honest``) and the config hash of the same run without faults
    (the baseline a drop is measured against)."""
    baseline = {**cfg_dict, "faults": HASH_NEUTRAL_DEFAULTS["faults"]}
    return {**faults, "selection": "all", "baseline_config_hash": config_hash(baseline)}


def flops_section(fed) -> dict[str, Any]:
    """The record's ``cost.flops``: each client's model counted on the task's inputs (cached per
    architecture, input shape and model shape for the process), times the samples the budget counted."""
    from hfl_bench import flops  # torch: only where a run is recorded, never where records are read

    per = [flops.per_sample(c.arch.name, c.model, fed.data.train_x) for c in fed.clients]
    return flops.record(fed.budget, [p.forward for p in per], [p.training for p in per])


def build_record(cfg: RunConfig, result: RunResult, chash: str | None = None,
                 portable: dict[str, Any] | None = None) -> dict[str, Any]:
    """The record of a finished run; ``chash`` and ``portable``: the config's hash and the config
    as the record stores it when the caller has them (a ``ResolvedRun``'s), else made here."""
    fed, method, best = result.fed, result.method, result.best
    cfg_dict = dataclasses.asdict(cfg)
    chash = chash if chash is not None else config_hash(cfg_dict)
    labels = fed.data.train_y.cpu().numpy()
    train_counts = fed.partition.class_counts(labels, fed.num_classes, "train")
    assignment = [c.arch.name for c in fed.clients]
    metrics: dict[str, Any] | None = None
    if best is not None:
        per_arch: dict[str, list[float]] = {}
        for c in fed.clients:
            per_arch.setdefault(c.arch.name, []).append(float(best.global_acc[c.cid]))
        metrics = {
            "unit": "percent",
            "global_acc": _pct(float(np.mean(best.global_acc))),
            "local_acc": _pct(float(np.nanmean(best.local_acc))),
            "mean_val_acc": _pct(best.mean_val),
            "per_client": [
                {"cid": c.cid, "arch": c.arch.name, "global_acc": _pct(best.global_acc[c.cid]),
                 "local_acc": _pct(best.local_acc[c.cid]), "val_acc": _pct(best.val_acc[c.cid])}
                for c in fed.clients
            ],
            "per_class_global_acc": [_pct(v) for v in best.global_class_acc.mean(axis=0)],
            "per_arch_global_acc": {a: _pct(float(np.mean(v))) for a, v in per_arch.items()},
            "extra_endpoints": best.endpoints,
            **({"final": final} if (final := final_figures(result.history)) else {}),
            **({"seen_unseen": su} if (su := all_clients_seen_unseen(best, fed, train_counts, result.history)) else {}),
        }
        if result.faults is not None:  # the headline under faults: the honest clients' figures
            metrics["honest"] = group_figures(best, result.faults["honest_clients"])
            metrics["faulty"] = group_figures(best, result.faults["faulty_clients"])
        if result.modalities is not None:  # the headline of a multimodal run: the recipients' figures
            metrics["recipients"] = modality_figures(best, result.modalities["recipients"])
            metrics["donors"] = modality_figures(best, result.modalities["donors"])
        for group in ("honest", "faulty", "recipients", "donors"):
            if group in metrics and (final := final_figures(result.history, group)):
                metrics[group]["final"] = final
        groups = {**({"honest": result.faults["honest_clients"], "faulty": result.faults["faulty_clients"]}
                     if result.faults is not None else {}),
                  **({"recipients": result.modalities["recipients"], "donors": result.modalities["donors"]}
                     if result.modalities is not None else {})}
        for group, clients in groups.items():
            if (su := seen_unseen_figures(best, clients, result.history, group)) is not None:
                metrics[group]["seen_unseen"] = su
        selected = {"round": best.round, **{k: metrics[k] for k in ("global_acc", "local_acc", "mean_val_acc")}}
        metrics = {"headline": headline_block(metrics, _headline_clients(result)), "selected": selected, **metrics}
    sent = result.bytes_sent_per_client_round
    rounds_run = len(result.history) - 1
    record = {
        "schema_version": schema_version_of(result),
        "record_id": hashlib.sha256(f"{chash}|{cfg.seed}|reproduced".encode()).hexdigest()[:16],
        "source": {"kind": "reproduced", "citation": None},
        "status": result.status,
        "error": result.error,
        "method": {
            "name": cfg.method,  # the registry key: right also for an entry point that names a class
            "fidelity": method.card.fidelity,
            "version": _run_version(method.card.version, method.hparams()),
            "citation": method.card.citation,
            "notes": list(method.card.notes),
            "plugin_dist": plugin_dist(type(method).__module__),
            "hparams": method.hparams(),
            **card_setting(method.card, method.predictor(), method.transfer()),
            # Schema 1.6: the card's preset the hyperparameters hold (``--preset``), null for the
            # protocol's budget (``method_api.canonical_method``).
            "preset": cfg.preset,
            # Optional: what the method states about this run (``Method.describe_run``), e.g. its feature bank.
            **({"run_details": details} if (details := method.describe_run(fed)) else {}),
        },
        "task": dict(fed.info.as_record(), n_train=int(len(labels)), n_test=int(len(fed.data.test_y)),
                     **_fingerprint_field(fed.data)),
        "arch_pool": {
            "name": fed.pool.name,
            "assignment": assignment,
            "n_params": [sum(p.numel() for p in c.model.parameters()) for c in fed.clients],
        },
        "partition": {
            "scheme": fed.partition.scheme,
            "params": fed.partition.params,
            "seed": fed.partition.seed,
            "hash": fed.partition.hash,
            "heldout_fraction": fed.partition.heldout_fraction,
            "public_size": fed.partition.public_size,
            # the pretraining split (--pretrain-size), only where there is one: older records stay as they were
            **({"pretrain_size": fed.partition.pretrain_size} if fed.partition.pretrain_size else {}),
            "train_counts": train_counts.tolist(),
            "val_counts": fed.partition.class_counts(labels, fed.num_classes, "val").tolist(),
        },
        "federation": {
            "n_clients": cfg.clients,
            "clients_per_round": cfg.clients_per_round or cfg.clients,
            "rounds": cfg.rounds,
            "rounds_run": rounds_run,
            "local_epochs": cfg.local_epochs,
            "topology": method.card.topology,
            "exec": fed.exec_path,
            "eval_every": cfg.eval_every,
            # sampled evaluation (--eval-clients) and offloaded client state (--client-state), only where used
            **({"eval_clients": cfg.eval_clients} if cfg.eval_clients is not None else {}),
            **({"client_state": cfg.client_state} if cfg.client_state != "resident" else {}),
            "cuda_graphs": fed.use_cuda_graphs,
            # present only for a resumed run: the rounds of the checkpoints it continued from
            **({"resumed_from_rounds": resumed} if (resumed := result.resumed_from_rounds) else {}),
        },
        "seeds": {"python": cfg.seed, "numpy": cfg.seed, "torch": cfg.seed, "partition": cfg.seed},
        "selection": selection_block(result),
        **({"faults": faults_section(cfg_dict, result.faults)} if result.faults is not None else {}),
        **({"modalities": dict(result.modalities)} if result.modalities is not None else {}),
        # schema 1.10: the simulated clock's devices and times (hfl_bench.clock), only with --devices
        **({"clock": dict(result.clock)} if result.clock is not None else {}),
        "metrics": metrics,
        "cost": {
            "bytes_sent_per_client_per_round": float(sent.mean()) if sent.size else 0.0,
            "bytes_total": int(fed.channel.total),
            "wall_time_per_round_s": round(result.wall_time_s / max(rounds_run, 1), 4),
            "wall_time_total_s": round(result.wall_time_s, 3),
            "peak_memory": result.peak_memory,
            "budget": fed.budget.record(),  # steps and samples by kind of data (metering.Budget)
            "flops": flops_section(fed),  # schema 1.9: FLOPs per sample and trained (hfl_bench.flops)
        },
        "history": result.history,
        "plugins": plugins_used(_used(cfg.method, method.hparams(), fed.info.name, fed.pool.name,
                                      fed.partition.scheme)),
        "config": portable if portable is not None else portable_config(cfg_dict),  # no path of the machine that ran
        "config_hash": chash,
        "code": {"hfl_bench_version": hfl_bench.__version__, **result.code},
        "environment": environment(fed.device),
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
    }
    return json.loads(json.dumps(record, default=_jsonable))


def selection_block(result: RunResult) -> dict[str, Any]:
    """The record's ``selection``: the rule that ran (``evaluation.selection_rule``), the round it
    selected and, under the pooled rule, that round's score (mean pooled validation accuracy)."""
    block = {"rule": result.selection_rule or SELECTION_RULE, "round": result.best.round if result.best else None}
    if result.selection_score is not None:
        block["score"] = _pct(result.selection_score)
    return block


def card_setting(card: Any, predictor: str, transfer: str | None = None) -> dict[str, Any]:
    """What the leaderboard's setting section reads from a method's card: the transfer data it reads
    (``transfer``: the run's, ``Method.transfer``; default the card's) and whether it needs a single
    architecture (schema 1.6), whether its client models are trained on peers' data, whether they are
    sub-models of one global model (``submodels``, written only where true), and
    ``predictor``, what the run's headline evaluated (``Method.predictor``, schema 1.7)."""
    return {"transfer": transfer or card.transfer, "single_architecture": bool(card.single_architecture),
            "peer_data": bool(card.peer_data), "predictor": predictor,
            # only where true: the records of every other method stay as they were
            **({"submodels": True} if getattr(card, "submodels", False) else {})}


def _used(method: str, hparams: Any, task: str, pool: Any, partitioner: Any) -> list[tuple[str, Any]]:
    """The ``(kind, name)`` of each registered plugin a run uses (``provenance.plugins_used``); the
    method's aggregation rule is its ``aggregator`` hyperparameter, when it has one."""
    aggregator = hparams.get("aggregator") if isinstance(hparams, dict) else None
    return [("method", method), ("task", task), ("pool", pool), ("partitioner", partitioner),
            ("aggregator", aggregator)]


def _fingerprint_field(data: Any) -> dict[str, str]:
    """``{"data_fingerprint": ...}`` when the loaded data says exactly which data it is (the
    engine's ``TaskData.fingerprint``); nothing for data that cannot say."""
    fingerprint = getattr(data, "fingerprint", None)
    return {"data_fingerprint": fingerprint} if isinstance(fingerprint, str) and fingerprint else {}


def _jsonable(obj):
    if isinstance(obj, (np.integer,)):
        return int(obj)
    if isinstance(obj, (np.floating,)):
        return None if not np.isfinite(obj) else float(obj)
    if isinstance(obj, np.ndarray) or hasattr(obj, "tolist"):  # numpy arrays and torch tensors
        return obj.tolist()
    return str(obj)


def failed_selection_rule(cfg: RunConfig) -> str:
    """The selection rule a run that failed before its partition existed would have used, from its
    config: one class per client (``classes`` k = 1) leaves every validation half one class, so the
    pooled rule (``evaluation.selection_rule``); else the usual one. A failed seed then counts in
    the group its successful seeds form (the rule is part of the group key)."""
    one_class = cfg.partition == "classes" and cfg.classes_per_client == 1
    return POOLED_SELECTION_RULE if one_class else SELECTION_RULE


def build_failed_record(cfg: RunConfig, error: str) -> dict[str, Any]:
    """A ``status: "failed"`` record from just a config and an error (a run that raised, or a
    config that could not be resolved). Method and task details are filled in when their names
    are registered; fidelity, task version and class count are null otherwise."""
    from hfl_bench.config import coerce_params
    from hfl_bench.data import get_task
    from hfl_bench.engine import pick_device
    from hfl_bench.method_api import get_method_class

    cfg_dict = dataclasses.asdict(cfg)
    chash = config_hash(cfg_dict)
    method: dict[str, Any] = {"name": cfg.method, "fidelity": None, "version": None, "hparams": dict(cfg.method_params),
                              "preset": cfg.preset}
    task: dict[str, Any] = {"name": cfg.task, "version": None, "num_classes": None}
    try:
        cls = get_method_class(cfg.method)
        card = cls.card
        method.update(fidelity=card.fidelity, version=card.version, citation=card.citation, notes=list(card.notes),
                      plugin_dist=plugin_dist(cls.__module__), **card_setting(card, card.predictor))
        params = coerce_params(cls.Params, cfg.method_params, cfg.method)
        method["hparams"] = dataclasses.asdict(params)
        method["predictor"] = cls(params).predictor()  # what the run would have evaluated
        method["transfer"] = cls(params).transfer()
        method["version"] = _run_version(card.version, method["hparams"])
    except Exception:  # noqa: BLE001 - unknown method or bad hyperparameters: keep what we have
        pass
    try:
        task = get_task(cfg.task).info.as_record()
    except Exception:  # noqa: BLE001
        pass
    try:
        device = pick_device(cfg.device)
    except Exception:  # noqa: BLE001 - e.g. CUDA asked for but absent (maybe the very error)
        import torch

        device = torch.device("cpu")
    record = {
        "schema_version": SCHEMA_VERSION,
        "record_id": hashlib.sha256(f"{chash}|{cfg.seed}|reproduced".encode()).hexdigest()[:16],
        "source": {"kind": "reproduced", "citation": None},
        "status": "failed",
        "error": error,
        "method": method,
        "task": task,
        "selection": {"rule": failed_selection_rule(cfg), "round": None},
        "metrics": None,
        "plugins": plugins_used(_used(cfg.method, method["hparams"], cfg.task, cfg.pool, cfg.partition)),
        "config": portable_config(cfg_dict),  # no path of the machine that ran
        "config_hash": chash,
        "code": {"hfl_bench_version": hfl_bench.__version__, **git_info()},
        "environment": environment(device),
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
    }
    return json.loads(json.dumps(record, default=_jsonable))


def write_record(record: dict[str, Any], out_dir: str | Path) -> Path:
    """Write the record; for a run that ended (ok or diverged), then delete its checkpoint, which
    the record makes obsolete (a failed run keeps it: ``--resume`` may still continue it).
    ValueError for a record that is not strict JSON (NaN, infinity), UnsafePathError for a name
    that cannot be a file name, OSError when the folder cannot take it."""
    path = inside(out_dir, record_filename(record))
    write_atomic(path, json.dumps(record, indent=1, allow_nan=False) + "\n")
    if record.get("status") != "failed":
        remove_checkpoint(checkpoint_for(path))  # a failure is a warning: the record is written
    return path


def _nulled(obj: Any) -> Any:
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _nulled(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_nulled(v) for v in obj]
    return obj


def strict_record(record: dict[str, Any]) -> dict[str, Any]:
    """The record as strict JSON can hold it. One with a NaN or infinite number somewhere (a run
    whose figures broke) becomes a failed record: those numbers null, everything else kept, and
    the error naming the fields, so it is written, read back and never averaged in."""
    bad = non_finite_fields(record)
    if not bad:
        return record
    shown = ", ".join(bad[:5]) + (f" and {len(bad) - 5} more" if len(bad) > 5 else "")
    note = f"record had non-finite numbers (NaN or infinity), written as null: {shown}"
    previous = record.get("error")
    return dict(_nulled(record), status="failed", error=f"{note}; {previous}" if previous else note)


@dataclasses.dataclass
class Saved:
    """Where a record went. ``path`` is None when it could not be written anywhere; ``problem``
    says why it is not (only) in its folder; ``record`` is what was written (``strict_record``)."""

    record: dict[str, Any]
    path: Path | None
    intended: Path | None
    problem: str | None = None

    @property
    def fallback(self) -> bool:
        return self.path is not None and self.path != self.intended


def save_record(record: dict[str, Any], out_dir: str | Path, keep_final: bool = False,
                divert: str | None = None) -> Saved:
    """Write a record so that a finished run is never lost: as strict JSON (``strict_record``) to
    ``out_dir``; if that folder cannot take it (disk full, folder removed), to a new folder under
    the first of ``paths.unsaved_dirs()`` that can, and ``problem`` says so. With ``keep_final``
    a failed record does not replace a final (ok or diverged) record already at its path. With
    ``divert`` (why the record may not go to its path: ``write_conflict``) it goes straight to
    the fallback folder and ``problem`` says why."""
    record = strict_record(record)
    try:
        intended = inside(out_dir, record_filename(record))
    except UnsafePathError as e:
        return Saved(record, None, None, f"not written: {e}")
    if keep_final and record.get("status") == "failed" and intended.is_file():
        try:
            existing = load_record(intended)
        except ValueError:
            existing = {}
        if existing.get("status") in ("ok", "diverged"):
            return Saved(record, None, intended, f"not written: the finished record already at {intended} was kept")
    if divert is not None:
        first = f"was not written to {intended}: {divert}"
    else:
        try:
            return Saved(record, write_record(record, out_dir), intended)
        except OSError as e:
            first = f"could not be written to {intended} ({e.strerror or type(e).__name__})"
    tried = []
    for base in unsaved_dirs():
        try:
            path = write_record(record, unsaved_folder(base))
        except OSError as e:
            tried.append(f"{base}: {e.strerror or type(e).__name__}")
            continue
        return Saved(record, path, intended, f"{first}; saved to {path} instead (move it into {intended.parent})")
    return Saved(record, None, intended, f"{first}, nor to a fallback folder ({'; '.join(tried)})")


def data_fingerprint(cfg: RunConfig) -> str | None:
    """The fingerprint of the data ``cfg`` would load (``Task.fingerprint(data_dir)``: cheap,
    cached), or None when the task cannot say. Raises what the task raises (missing data)."""
    from hfl_bench.data import get_task

    fingerprint = getattr(get_task(cfg.task), "fingerprint", None)  # tasks predating fingerprints: None
    value = fingerprint(cfg.data_dir) if callable(fingerprint) else None
    return value if isinstance(value, str) and value else None


def other_data(record: dict[str, Any], fingerprint: str | None) -> str | None:
    """The recorded data fingerprint when it is known and differs from ``fingerprint``."""
    recorded = (record.get("task") or {}).get("data_fingerprint") if isinstance(record.get("task"), dict) else None
    if isinstance(recorded, str) and fingerprint is not None and recorded != fingerprint:
        return recorded
    return None


def other_data_message(path: Path, recorded: str, current: str) -> str:
    return (f"{path} holds a record of other data (data fingerprint {recorded}; this data: {current}); "
            f"it is not overwritten: use another --out")


# A record with one of these statuses is a finished result: a matrix rerun skips its cell, and
# neither ``run`` nor ``matrix`` replaces it with another version's (a failed record is replaced).
FINAL_STATUSES = ("ok", "diverged")


def _run_version(card_version: str, hparams: Any) -> str:
    """``aggregation.run_version``, imported when needed: reading records needs no torch."""
    from hfl_bench.aggregation import run_version

    return run_version(card_version, hparams)


def registered_version(method: str, method_params: dict[str, Any] | None = None) -> str | None:
    """The version this code records for ``method`` run with ``method_params`` (``run_version``: the
    card's, and its aggregation rule's past "1.0"); None for an unknown name (the run fails on its
    own). Hyperparameters that do not coerce leave the card's version (the run fails on them)."""
    from hfl_bench.config import coerce_params
    from hfl_bench.registry import METHODS, RegistryError

    try:
        cls = METHODS.get(method)
    except RegistryError:
        return None
    try:
        hparams = dataclasses.asdict(coerce_params(cls.Params, dict(method_params or {}), method))
    except Exception:  # noqa: BLE001 - bad hyperparameters: the run reports them
        return cls.card.version
    return _run_version(cls.card.version, hparams)


def other_version(record: dict[str, Any], current: str | None) -> str | None:
    """The recorded method version when it is known and differs from ``current``: the same config
    hash (versions are not in it) run by another implementation of the method."""
    method = record.get("method") if isinstance(record.get("method"), dict) else {}
    recorded = method.get("version")
    if isinstance(recorded, str) and current is not None and recorded != current:
        return recorded
    return None


def other_version_message(path: Path, method: str, recorded: str, current: str) -> str:
    return (f"{path} holds this setting's result from {method} {recorded}, but this code's {method} is {current} "
            f"(its numerics changed); it is not overwritten: archive it or use another --out")


def check_same_data(cfg: RunConfig, path: Path, version: str | None = None) -> None:
    """Before a run: ConfigError when ``path`` holds a record of this config run on other data, or
    by another version of the method (its file name would be the same: a finished result is never
    overwritten by another's). Data that cannot be fingerprinted, or a record without a
    fingerprint or a method version (older records), is not a conflict. ``version``: the run's
    method version when the caller knows it (``ResolvedRun.version``), else ``registered_version``."""
    if not path.is_file():
        return
    try:
        record = load_record(path)
        current = data_fingerprint(cfg)
    except Exception:  # noqa: BLE001 - an unreadable record is replaced; missing data fails in the run
        return
    recorded = other_data(record, current)
    if recorded is not None:
        raise ConfigError(other_data_message(path, recorded, current))
    version = version if version is not None else registered_version(cfg.method, cfg.method_params)
    recorded = other_version(record, version)
    if recorded is not None and record.get("status") in FINAL_STATUSES:  # a failed run is no result
        raise ConfigError(other_version_message(path, cfg.method, recorded, version))


def write_conflict(cfg: RunConfig, path: Path | None = None, version: str | None = None) -> str | None:
    """At the write: why this run's record may not replace the file at ``path`` (default: the
    config's record path) (a finished record of other data, or of another method version:
    ``check_same_data``), or None."""
    try:
        from hfl_bench.paths import record_path

        check_same_data(cfg, path if path is not None else record_path(cfg), version)
    except ConfigError as e:
        return str(e)
    return None


@dataclass(frozen=True)
class RecordFile:
    """One run's record file, from the check before the run to the write after it, holding what
    the record is named and checked by (``open_record``): the run's config passes this module
    once, when the file is opened; building and writing the record then use the handle."""

    cfg: RunConfig
    path: Path
    config_hash: str | None = None
    version: str | None = None
    portable_config: dict[str, Any] | None = None

    def build(self, result: RunResult) -> dict[str, Any]:
        """The finished run's record (``build_record``)."""
        return build_record(self.cfg, result, self.config_hash, self.portable_config)

    def build_failed(self, error: str) -> dict[str, Any]:
        """A failed record that says ``error`` (``build_failed_record``)."""
        return build_failed_record(self.cfg, error)

    def conflict(self) -> str | None:
        """At the write: why the record may not replace the file at its path (``write_conflict``)."""
        return write_conflict(self.cfg, self.path, self.version)


def open_record(cfg: RunConfig, path: Path, config_hash: str | None = None, version: str | None = None,
                portable_config: dict[str, Any] | None = None, check: bool = True) -> RecordFile:
    """The run's ``RecordFile``; with ``check`` (before a run), ConfigError when ``path`` holds a
    finished record of other data or another method version (``check_same_data``)."""
    if check:
        check_same_data(cfg, path, version)
    return RecordFile(cfg, path, config_hash, version, portable_config)


