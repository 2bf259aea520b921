"""Record upgrades: a record of any schema version, brought once, at load, to the current shape.

One step per schema version (``STEPS``: 1.0 -> 1.1 -> ... -> 1.10 -> 1.11, where 1.8 is exactly the
1.7 shape, 1.9 adds ``cost.flops``, 1.10 the simulated ``clock`` and 1.11 what re-clocking reads),
each a pure function from one version's record to the next version's. A step fills what its
version added, where the older record lacks it, with the value the results layer's readers gave its absence
(``hfl_bench.results.setting``, ``loading``, ``headline``), so that a view of an upgraded record
prints what the view of the raw record printed. What an old record cannot say (its seen / unseen-
class accuracy, its budget, its FLOPs, its clock, its plugins, its endpoints' curves, a final window
it never computed) stays absent, as the readers already read the absence: "-", or the selected
round marked as the fallback.

What a built-in method's card said, and whether a built-in pool is one architecture, comes from a
frozen table (``BUILTIN_CARDS``, ``BUILTIN_POOLS``), never from the registry: upgrading a record
imports neither torch nor any plugin, and gives the same record whatever is installed. A method or
pool the table does not know (a third-party plugin's) gets the readers' "unknown".

Where it plugs in: ``results.loading`` validates a record against its own version's schema
(``leaderboard validate``), so the raw record is validated first and ``upgrade`` applied after
(``UpgradeError`` is a ValueError: a loader turns it into its "not a record" reason). The reader
for a record without a pool assignment (a failed run) asks ``pool_homogeneous``, not the registry.

A shared-types module: it imports only the standard library.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from typing import Any, Optional

CURRENT = "1.11"  # what ``upgrade`` returns: the 1.7 shape, cost.flops and clock, upgraded from any version
UNKNOWN = "unknown"  # the readers' unknown transfer and predictor (``results.setting.UNKNOWN``)
PUBLISHED = "published"  # ``source.kind`` of a paper's figure: it describes no run of this code


class UpgradeError(ValueError):
    """A record that cannot be upgraded (no or an unknown ``schema_version``); one sentence."""


# --------------------------------------------------------------------------- the frozen table
# What each built-in method's card said, per (method name, method version), when that version was
# current; the key None is "unversioned": records written before methods had versions (schema
# 1.0 / 1.1, before commit d75f24f), of the methods that existed then. Written by hand, once,
# from the cards at this commit and from ``git log -p -- methods/ hfl_bench/method_card.py
# hfl_bench/pools.py``: before the card (64a0364) a method said ``needs_public`` and FedAvg
# refused a pool of several architectures in its own ``check``; the card's ``transfer`` and
# ``single_architecture`` (64a0364), ``peer_data`` and ``predictor`` (7e98149) were introduced
# without changing what any method computes (pins and record values unchanged), so a version
# current before a field existed gets the value the card first declared for the method. No card
# field changed across versions since (DFML 1.1, FedCC 1.1 / 1.2, FedMD 1.1, FedSocket and Naive
# Shared 1.1 / 1.2 changed numerics only). NEVER regenerate this from the live registry: it is
# what old records meant, and must not follow a card edited later or a plugin installed now
# (tests/test_record_upgrade.py checks each built-in method's current version against its card).
#
# ``predictor``: the predictor the headline evaluated, as a rule over the run's hyperparameters
# (``Method.predictor``): ``default`` unless hyperparameter ``param`` has a value in ``values``. A
# record without that hyperparameter ran the default (DFML's ``eval=peak``, commit 7133ec3: "what
# every record ran"; the shared predictor's ``endpoint=private`` since FedSocket's first commit).
_LIVE = {"default": "live model"}
_PLAIN = {"transfer": "none", "single_architecture": False, "peer_data": False, "predictor": _LIVE}
_DFML = {**_PLAIN, "peer_data": True,
         "predictor": {"param": "eval", "values": {"current": "live model"}, "default": "stored snapshot"}}
_SHARED = {**_PLAIN, "predictor": {"param": "endpoint", "values": {"joint": "joint"}, "default": "live model"}}
_PROTOTYPES = {**_PLAIN, "predictor": {"default": "prototype classifier"}}
BUILTIN_CARDS: dict[str, dict[Optional[str], dict[str, Any]]] = {
    "crad": {None: _PLAIN, "1.0": _PLAIN},
    "uncertainty-kd": {None: _PLAIN, "1.0": _PLAIN},
    "uniform-kd": {None: _PLAIN, "1.0": _PLAIN},
    "dfml": {None: _DFML, "1.0": _DFML, "1.1": _DFML},
    "ds-fl": {"1.0": {**_PLAIN, "transfer": "public-unlabelled"}},
    "fd": {"1.0": _PLAIN},
    "fedavg": {None: {**_PLAIN, "single_architecture": True}, "1.0": {**_PLAIN, "single_architecture": True}},
    "fedcc": {v: {**_PLAIN, "transfer": "public-unlabelled"} for v in (None, "1.0", "1.1", "1.2")},
    "fedgd": {None: {**_PLAIN, "transfer": "synthetic"}, "1.0": {**_PLAIN, "transfer": "synthetic"}},
    "fedgen": {"1.0": {**_PLAIN, "transfer": "synthetic"}},
    "fedgh": {"1.0": _PLAIN},
    "fedkd": {"1.0": _PLAIN},
    "fedl2g": {"1.0": _PLAIN},
    # the card's transfer: FedMD's ``transfer_epochs=0`` reads the public set unlabelled
    # (``FedMD.transfer``, 2ec3b2c), which records state from schema 1.6 on; before, the readers
    # took the card's, and so does this table
    "fedmd": {v: {**_PLAIN, "transfer": "public-labelled"} for v in (None, "1.0", "1.1")},
    "fedmkd": {None: _PLAIN, "1.0": _PLAIN},
    # issue 66: every record of theirs states its card (schema 1.9, ``method.submodels`` true)
    "fedrolex": {"1.0": _PLAIN},
    "depthfl": {"1.0": _PLAIN},
    "heterofl": {"1.0": _PLAIN},
    "fjord": {"1.0": _PLAIN},
    "feddf": {"1.0": {**_PLAIN, "transfer": "public-unlabelled"}},
    "fedmrl": {"1.0": {**_PLAIN, "predictor": {"default": "live + shared"}}},
    "fedproto": {"1.0": _PROTOTYPES},
    "fedsocket": {None: _SHARED, "1.0": _SHARED, "1.1": _SHARED, "1.2": _SHARED},
    "fedtgp": {"1.0": _PROTOTYPES},
    "fml": {None: _PLAIN, "1.0": _PLAIN},
    "lg-fedavg": {"1.0": _PLAIN},
    "local": {None: _PLAIN, "1.0": _PLAIN},
    "msfkd": {None: {**_PLAIN, "transfer": "public-unlabelled"}, "1.0": {**_PLAIN, "transfer": "public-unlabelled"}},
    "naive-shared": {"1.0": _SHARED, "1.1": _SHARED, "1.2": _SHARED},
}
# Whether each built-in pool is one architecture (``ArchPool.homogeneous``): the same frozen
# source; no pool's members changed since it was added (hfl_bench/pools.py history).
BUILTIN_POOLS: dict[str, bool] = {"paper": False, "cpu": False, "cpu-mm": False, "cpu-cnn": True,
                                  "paper-resnet18": True, "sensor": False, "sensor-cnn": True, "text": False,
                                  "text-cnn": True, "heterofl-cnn": True, "heterofl-cnn-paper": True,
                                  "depthfl-cnn": True, "heterofl-resnet18": True, "heterofl-resnet18-paper": True,
                                  "heterofl-cnn-levels": False}


def card_for(method: Any, version: Any) -> Optional[dict[str, Any]]:
    """The frozen card of built-in ``method`` at ``version`` (a run version such as
    ``1.0+crad-accuracy-1.1`` reads its method's part, before the ``+``; None: unversioned, which
    for a method added after versions began is its first card: a record that names no version
    was written before any later one); None for a method or version the table does not know."""
    if not isinstance(method, str) or not (version is None or isinstance(version, str)):
        return None
    cards = BUILTIN_CARDS.get(method, {})
    if version is None:
        return cards.get(None) or next(iter(cards.values()), None)
    return cards.get(version.split("+", 1)[0])


def predictor_of(card: Mapping[str, Any], hparams: Any) -> str:
    """The predictor ``card``'s rule gives for the run's hyperparameters ``hparams``."""
    rule = card["predictor"]
    value = hparams.get(rule["param"]) if "param" in rule and isinstance(hparams, Mapping) else None
    return rule.get("values", {}).get(value, rule["default"]) if isinstance(value, str) else rule["default"]


def pool_homogeneous(name: Any) -> Optional[bool]:
    """Whether built-in pool ``name`` is one architecture; None for a pool the table does not know
    (the frozen stand-in for the registry's ``ArchPool.homogeneous``)."""
    return BUILTIN_POOLS.get(name) if isinstance(name, str) else None


# --------------------------------------------------------------------------- the steps
def _with(record: dict[str, Any], version: str, **sections: Any) -> dict[str, Any]:
    """A new record: ``record``'s fields, ``schema_version`` set to ``version``, ``sections``
    replacing those fields."""
    return {**record, "schema_version": version, **sections}


def _reproduced(record: dict[str, Any]) -> bool:
    """A run of this code (not a paper's figure): the records whose method section describes a run."""
    source = record.get("source")
    return not (isinstance(source, dict) and source.get("kind") == PUBLISHED)


def _method(record: dict[str, Any]) -> dict[str, Any]:
    method = record.get("method")
    return method if isinstance(method, dict) else {}


def step_1_0_to_1_1(record: dict[str, Any]) -> dict[str, Any]:
    """1.1 added fidelity "original" (nothing to fill) and ``plugins``: which plugins an old run used
    is not known, and the readers read its absence as such, so it stays absent."""
    return _with(record, "1.1")


def step_1_1_to_1_2(record: dict[str, Any]) -> dict[str, Any]:
    """1.2 added the method's ``version`` (required): null where absent, the readers' "unversioned"
    (``Loaded.method_version`` None), a version of its own. ``metrics.final`` is not computed from
    ``history``: no reader recomputes it, and a record without it reads its selected round,
    marked as the fallback (``results.headline``)."""
    method = record.get("method")
    if isinstance(method, dict) and "version" not in method:
        return _with(record, "1.2", method={**method, "version": None})
    return _with(record, "1.2")


def step_1_2_to_1_3(record: dict[str, Any]) -> dict[str, Any]:
    """1.3 added the ``faults`` section and the honest / faulty figures: only runs with --faults
    have them, and no older run had faults. Nothing to fill."""
    return _with(record, "1.3")


def step_1_3_to_1_4(record: dict[str, Any]) -> dict[str, Any]:
    """1.4 added the ``modalities`` section and the recipients' / donors' figures: only multimodal
    runs have them, and no older run was one. Nothing to fill."""
    return _with(record, "1.4")


def step_1_4_to_1_5(record: dict[str, Any]) -> dict[str, Any]:
    """1.5 added a client group's per-round and final figures: an older record's history has no
    group's figures to compute them from, and the readers fall back to the group's selected round
    (marked). Nothing to fill."""
    return _with(record, "1.5")


def step_1_5_to_1_6(record: dict[str, Any]) -> dict[str, Any]:
    """1.6 added the method's ``transfer``, ``single_architecture`` and ``preset`` (and seen /
    unseen-class accuracy, ``cost.budget``, per-client final figures, which an old record cannot
    have: absent, read as "-"). A run's record gets, where it lacks them, its method's card
    (``card_for``; ``results.setting.transfer_setting`` and ``single_architecture`` read the
    registered card): transfer ``unknown`` and single architecture None for a method the table
    does not know; and preset null, the protocol's budget (``results.setting.budget_class``)."""
    if not _reproduced(record) or not isinstance(record.get("method"), dict):
        return _with(record, "1.6")
    method = _method(record)
    card = card_for(method.get("name"), method.get("version"))
    filled = {"transfer": card["transfer"] if card else UNKNOWN,
              "single_architecture": card["single_architecture"] if card else None,
              "preset": None}
    return _with(record, "1.6", method={**method, **{k: v for k, v in filled.items() if k not in method}})


def headline_clients(record: dict[str, Any]) -> str:
    """Whose figure a record's headline is (``results.figures.headline_of``): the honest clients of a
    run with faults, the recipients of a multimodal run that has any, else all clients."""
    if isinstance(record.get("faults"), dict):
        return "honest"
    modalities = record.get("modalities")
    return "recipients" if isinstance(modalities, dict) and modalities.get("recipients") else "all"


def headline_block(record: dict[str, Any]) -> dict[str, Any]:
    """``metrics.headline`` as a 1.7 run writes it (``results.records.headline_block``) and every view
    reads it (``results.figures.headline_value`` of ``global_acc``): the final figure of the
    headline's clients, else their selected round's (window null)."""
    metrics = record["metrics"]
    clients = headline_clients(record)
    block = metrics if clients == "all" else metrics.get(clients) if isinstance(metrics.get(clients), dict) else {}
    final = block.get("final") if isinstance(block.get("final"), dict) else None
    if final is not None and final.get("global_acc") is not None:
        window = {k: final.get(k) for k in ("rounds", "first_round", "last_round")}
        return {"figure": "global_acc", "statistic": "final", "clients": clients, "value": final["global_acc"],
                "window": window}
    return {"figure": "global_acc", "statistic": "selected", "clients": clients, "value": block.get("global_acc"),
            "window": None}


def step_1_6_to_1_7(record: dict[str, Any]) -> dict[str, Any]:
    """1.7 added the method's ``peer_data`` and ``predictor``, ``metrics.headline`` and
    ``metrics.selected`` (and the endpoints' curves and final figures, the pooled rule's score,
    ``federation.checkpoint_refused``: an older run has none, and ran no pooled rule). A run's
    record gets, where it lacks them: peer data and predictor from its method's card at its
    hyperparameters (``results.setting.peer_data_setting`` / ``predictor_setting``; False and
    ``unknown`` for a method the table does not know); the headline (``headline_block``) and the
    selected round's figures (the top-level ``global_acc``, ``local_acc``, ``mean_val_acc``;
    left out where ``selection.round`` is not a round after 0, which 1.7 cannot hold)."""
    if not _reproduced(record):
        return _with(record, "1.7")
    sections: dict[str, Any] = {}
    if isinstance(record.get("method"), dict):
        method = _method(record)
        card = card_for(method.get("name"), method.get("version"))
        filled = {"peer_data": card["peer_data"] if card else False,
                  "predictor": predictor_of(card, method.get("hparams")) if card else UNKNOWN}
        sections["method"] = {**method, **{k: v for k, v in filled.items() if k not in method}}
    metrics = record.get("metrics")
    if isinstance(metrics, dict):
        head: dict[str, Any] = {}
        if "headline" not in metrics:
            head["headline"] = headline_block(record)
        selection = record.get("selection") if isinstance(record.get("selection"), dict) else {}
        rnd = selection.get("round")
        if "selected" not in metrics and isinstance(rnd, int) and not isinstance(rnd, bool) and rnd >= 1:
            figures = {k: metrics.get(k) for k in ("global_acc", "local_acc", "mean_val_acc")}
            head["selected"] = {"round": rnd, **figures}
        sections["metrics"] = {**head, **metrics}  # first in metrics, as a 1.7 run writes them
    return _with(record, "1.7", **sections)


def step_1_7_to_1_8(record: dict[str, Any]) -> dict[str, Any]:
    """1.8 is the 1.7 shape, whose config hashes are canonical (``identity.canonical_hash``): a record
    written before hyperparameters were canonicalized (and typed with ``--set``) gets the hash its
    run has now, and so does its fault baseline; every other record changes only its version."""
    from hfl_bench.record.identity import canonical_hash

    sections: dict[str, Any] = {}
    if (mapped := canonical_hash(record, record.get("config_hash"))) != record.get("config_hash"):
        sections["config_hash"] = mapped
    faults = record.get("faults")
    if isinstance(faults, dict) and isinstance(faults.get("baseline_config_hash"), str):
        baseline = canonical_hash(record, faults["baseline_config_hash"], faults="")
        if baseline != faults["baseline_config_hash"]:
            sections["faults"] = {**faults, "baseline_config_hash": baseline}
    return _with(record, "1.8", **sections)


def step_1_8_to_1_9(record: dict[str, Any]) -> dict[str, Any]:
    """1.9 added ``cost.flops`` (FLOPs per sample and training FLOPs per client, ``hfl_bench.flops``):
    what an older run computed was never counted, and zero would say it computed nothing, so it
    stays absent, which every view reads as not recorded. Nothing to fill."""
    return _with(record, "1.9")


def step_1_9_to_1_10(record: dict[str, Any]) -> dict[str, Any]:
    """1.10 added the simulated clock (``clock`` and each round's ``history[].clock``, ``--devices``;
    ``hfl_bench.clock``): an older run had no devices, so it stays absent, which every view reads
    as not recorded. Nothing to fill."""
    return _with(record, "1.10")


def step_1_10_to_1_11(record: dict[str, Any]) -> dict[str, Any]:
    """1.11 added, optional, each round's clock entry's per-client ``flops``, ``up_bytes`` and
    ``down_bytes`` (what each client's time was computed from) and ``clock.reclocked`` (``hfl-bench
    reclock``'s provenance): an older clock entry never recorded them, so they stay absent; the
    clock still reads as timed, and ``hfl-bench reclock`` refuses it in one line. Nothing to fill."""
    return _with(record, "1.11")


# The steps in order: ``STEPS[v]`` takes a record of version ``v`` to the next version.
STEPS: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    "1.0": step_1_0_to_1_1,
    "1.1": step_1_1_to_1_2,
    "1.2": step_1_2_to_1_3,
    "1.3": step_1_3_to_1_4,
    "1.4": step_1_4_to_1_5,
    "1.5": step_1_5_to_1_6,
    "1.6": step_1_6_to_1_7,
    "1.7": step_1_7_to_1_8,
    "1.8": step_1_8_to_1_9,
    "1.9": step_1_9_to_1_10,
    "1.10": step_1_10_to_1_11,
}
VERSIONS = (*STEPS, CURRENT)  # every version ``upgrade`` reads


def upgrade(raw: dict[str, Any]) -> dict[str, Any]:
    """``raw`` (a record as read from its file, any version of ``VERSIONS``) in the current shape
    (``CURRENT``), as a new record: ``raw`` is left as it was. UpgradeError for a record without a
    ``schema_version`` or with one this code does not know (validate the raw record against its
    own version's schema first: the upgrade fills fields, it does not check them)."""
    if not isinstance(raw, dict):
        raise UpgradeError(f"a record is a JSON object, not {type(raw).__name__}: it cannot be upgraded")
    version = raw.get("schema_version")
    if version not in VERSIONS:
        said = "has no schema_version" if version is None else f"has schema_version {version!r}"
        raise UpgradeError(f"the record {said}; this hfl-bench reads schema versions {', '.join(VERSIONS)}")
    record = copy.deepcopy(raw)  # the steps share what they do not change: one copy keeps raw apart
    order = list(STEPS)
    for v in order[order.index(version):] if version != CURRENT else []:
        record = STEPS[v](record)
    return record
