"""The method card: everything a method declares about itself, in one frozen, typed value.

Each registered method class sets ``card = MethodCard(...)`` (``hfl_bench.method_api``). The card
is the one source of the method's name, version, citation, fidelity, topology, what it reads
beyond the clients' private data, whether its client models train on other clients' data
(``peer_data``), which predictor its headline evaluates (``predictor``, one of ``PREDICTORS``),
what settings it refuses, the settings of a quick test run, the named presets of
hyperparameters (a paper's own budget), the notes every record carries and the changelog (what
each version changed): ``hfl-bench list`` and ``describe``, the record's ``method`` section, the
leaderboard's setting sections, the engine's refusals, the docs' method pages and the test suites all read it.

``card_problems`` says what is wrong with a card; registering a method refuses one with problems.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from hfl_bench.config import ConfigError, canonical_json, canonical_params
from hfl_bench.faults import KINDS as FAULT_KINDS

# "original": a method first published in this project or in the plugin that ships it.
FIDELITIES = ("paper", "reconstructed", "original")
TOPOLOGIES = ("p2p", "server", "none")
# What a method reads beyond its clients' private data: nothing, the held-out public set
# (``--public-size``) without or with its labels, or inputs it synthesizes itself.
TRANSFERS = ("none", "public-unlabelled", "public-labelled", "synthetic")
PUBLIC_TRANSFERS = ("public-unlabelled", "public-labelled")
# Which predictor a method's headline evaluates for each client (``Method.predictor``): the
# client's live model (also a view of it, e.g. FedCC's with the unknown logit dropped); a stored
# snapshot of it (DFML's peak models); a nearest-prototype classifier on its features (FedProto,
# FedTGP); its head on features fused with a shared model's (FedMRL); the Joint mix of its model and
# a shared predictor (FedSocket's endpoint=joint); an ensemble of several clients' models. Short
# values: the leaderboard shows the predictor as a column.
PREDICTORS = ("live model", "stored snapshot", "prototype classifier", "live + shared", "joint", "ensemble")
LIVE_MODEL = "live model"
VERSION_PATTERN = re.compile(r"[0-9]+(\.[0-9]+){0,3}")
# A preset's name: what ``--preset NAME`` selects and ``method.preset`` records.
PRESET_NAME = re.compile(r"[a-z][a-z0-9_]*")
# The public set of a smoke run of a method that reads one (samples held out of digits' training set).
SMOKE_PUBLIC_SIZE = 100

K = TypeVar("K")
V = TypeVar("V")


class FrozenMap(Mapping[K, V]):
    """A read-only, hashable mapping: a card's mappings, so that a frozen card stays hashable."""

    __slots__ = ("_items",)

    def __init__(self, items: Mapping[K, V] | Any = ()):
        self._items: dict[K, V] = dict(items)

    def __getitem__(self, key: K) -> V:
        return self._items[key]

    def __iter__(self) -> Iterator[K]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __hash__(self) -> int:
        return hash(frozenset(self._items.items()))

    def __repr__(self) -> str:
        return f"FrozenMap({self._items!r})"


@dataclass(frozen=True, kw_only=True)
class SmokeSettings:
    """The settings that keep a test run of the method to seconds while every part of it runs: the
    test suites run every registered method with them (on ``digits``, 4 clients, a few rounds)."""

    # Hyperparameters as ``--set key=value`` gives them (strings), e.g. fewer warm-up epochs.
    method_params: Mapping[str, str] = FrozenMap()
    # The architecture pool; None: the task's default (a single-architecture method names one).
    pool: str | None = None
    # Samples held out as the public set; None: SMOKE_PUBLIC_SIZE for a method that reads a
    # public set, else 0.
    public_size: int | None = None
    # Samples held out as the pretraining split (``--pretrain-size``); 0: none.
    pretrain_size: int = 0

    def __post_init__(self) -> None:
        if isinstance(self.method_params, Mapping):
            object.__setattr__(self, "method_params", FrozenMap(self.method_params))


@dataclass(frozen=True, kw_only=True)
class MethodCard:
    """What a method is and declares (module docstring). ``name`` is the registry name."""

    name: str
    # The version of the method's numerics, in every record: bump it whenever what the method
    # computes changes (tests/test_method_pins.py refuses a changed pin under an unchanged version).
    # Records of different versions never share a leaderboard group.
    version: str
    citation: str
    fidelity: str  # one of FIDELITIES
    topology: str  # one of TOPOLOGIES
    summary: str  # one line: what ``hfl-bench list methods`` shows
    transfer: str = "none"  # one of TRANSFERS
    # True for a method whose client models are trained, with labels, on other clients' private
    # data: a client's model travels to a peer, is trained there on the peer's shard and comes back
    # (DFML). Averaging parameters each client trained on its own shard (FedAvg, a shared head) is
    # not: only the average travels. Part of the leaderboard's setting section.
    peer_data: bool = False
    # Which predictor the headline evaluates (one of PREDICTORS) at the default hyperparameters;
    # a method whose hyperparameters change it overrides ``Method.predictor``.
    predictor: str = LIVE_MODEL
    # True for a method that needs every client on one architecture (a homogeneous pool).
    single_architecture: bool = False
    # True for a method whose clients train sub-models of one global model (width slices: HeteroFL,
    # FedRolex): part of the leaderboard's setting section ("one global model, sub-models per client").
    submodels: bool = False
    # The method's own model family: the pool a run uses when --pool is not given (before the task's
    # default); None: the task's default pool.
    pool: str | None = None
    # True for a method that runs a task whose clients miss modalities (hfl_bench.modalities): it
    # reads inputs only through the clients' own models (they fuse whatever modalities a row has)
    # or handles the modalities itself. The others refuse such a task with ``why_single_modality``.
    missing_modalities: bool = False
    why_single_modality: str = "it was written for inputs of one modality"
    # Why the method cannot run on token ids (a text task, ``TaskInfo.input_kind == "tokens"``),
    # in one line: it makes or transforms inputs itself (an input-space generator, a shared extractor
    # of input values). Empty: it reads inputs only through the clients' own models, and runs.
    why_not_tokens: str = ""
    # Fault kinds (``--faults``, hfl_bench.faults.KINDS) the method refuses, each with why.
    refuses_faults: Mapping[str, str] = FrozenMap()
    smoke: SmokeSettings = SmokeSettings()
    # Named sets of hyperparameters (``Params`` fields to values), selected with ``run --preset
    # NAME``: a paper's own settings where they deviate from the protocol's budget (the defaults
    # train the clients' private data with the protocol's optimizer, lr, batch size and local
    # epochs), e.g. {"paper": {"optimizer": "adam"}}. An explicit ``--set`` overrides a value.
    presets: Mapping[str, Mapping[str, Any]] = FrozenMap()
    # Choices made where the source is silent; copied into every record.
    notes: tuple[str, ...] = ()
    # What each version changed, oldest first: (version, what changed) pairs, the last one the card's
    # ``version`` (a card at 1.0 needs none). ``describe`` shows it; records carry only the version.
    changelog: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        if isinstance(self.refuses_faults, Mapping):
            object.__setattr__(self, "refuses_faults", FrozenMap(self.refuses_faults))
        if isinstance(self.presets, Mapping) and all(isinstance(v, Mapping) for v in self.presets.values()):
            object.__setattr__(self, "presets", FrozenMap({k: FrozenMap(v) for k, v in self.presets.items()}))
        if isinstance(self.notes, list):
            object.__setattr__(self, "notes", tuple(self.notes))
        if isinstance(self.changelog, (list, tuple)) and all(isinstance(e, (list, tuple)) for e in self.changelog):
            object.__setattr__(self, "changelog", tuple(tuple(e) for e in self.changelog))

    @property
    def needs_public(self) -> bool:
        """Whether the method cannot run without the public transfer set (``--public-size``)."""
        return self.transfer in PUBLIC_TRANSFERS

    def smoke_config(self) -> dict[str, Any]:
        """The ``RunConfig`` fields of a smoke run: ``method_params``, ``pool``, ``public_size`` and,
        where the card sets one, ``pretrain_size``."""
        public = self.smoke.public_size
        if public is None:
            public = SMOKE_PUBLIC_SIZE if self.needs_public else 0
        pretrain = {"pretrain_size": self.smoke.pretrain_size} if self.smoke.pretrain_size else {}
        return {"method_params": dict(self.smoke.method_params), "pool": self.smoke.pool, "public_size": public,
                **pretrain}

    def as_dict(self) -> dict[str, Any]:
        """The card as JSON data (``needs_public`` and the smoke run's settings resolved)."""
        return {
            "name": self.name, "version": self.version, "citation": self.citation, "fidelity": self.fidelity,
            "topology": self.topology, "summary": self.summary, "transfer": self.transfer,
            "peer_data": self.peer_data, "predictor": self.predictor, "needs_public": self.needs_public,
            "single_architecture": self.single_architecture, "submodels": self.submodels, "pool": self.pool,
            "missing_modalities": self.missing_modalities, "why_single_modality": self.why_single_modality,
            "why_not_tokens": self.why_not_tokens,
            "refuses_faults": dict(self.refuses_faults), "smoke": self.smoke_config(),
            "presets": {name: dict(values) for name, values in self.presets.items()}, "notes": list(self.notes),
            "changelog": [{"version": v, "change": text} for v, text in self.changelog],
        }


def _one_line(value: Any) -> bool:
    return isinstance(value, str) and bool(value.strip()) and "\n" not in value


def card_problems(card: Any, name: str) -> list[str]:
    """What is wrong with ``card`` as the card of the method registered as ``name`` (none: [])."""
    if not isinstance(card, MethodCard):
        return [f"card must be a hfl_bench.method_api.MethodCard, got {card!r}"]
    problems = []
    if card.name != name:
        problems.append(f"its card names {card.name!r}, but it is registered as {name!r}")
    if not (isinstance(card.version, str) and VERSION_PATTERN.fullmatch(card.version)):
        problems.append(f"version must be a string like \"1.0\" (digits and dots), got {card.version!r}; "
                        "set it in the card and bump it when the method's numerics change")
    for field, allowed in (("fidelity", FIDELITIES), ("topology", TOPOLOGIES), ("transfer", TRANSFERS),
                           ("predictor", PREDICTORS)):
        if getattr(card, field) not in allowed:
            problems.append(f"{field} must be one of {', '.join(allowed)}, got {getattr(card, field)!r}")
    if not _one_line(card.summary):
        problems.append(f"summary must be one line of text, got {card.summary!r}")
    if not isinstance(card.citation, str):
        problems.append(f"citation must be a string, got {card.citation!r}")
    for field in ("single_architecture", "submodels", "missing_modalities", "peer_data"):
        if not isinstance(getattr(card, field), bool):
            problems.append(f"{field} must be True or False, got {getattr(card, field)!r}")
    if card.pool is not None and not _one_line(card.pool):
        problems.append(f"pool must name a registered pool (hfl-bench list pools) or be None, got {card.pool!r}")
    if not card.missing_modalities and not _one_line(card.why_single_modality):
        problems.append("why_single_modality must say in one line why it refuses a task whose clients miss modalities")
    if not isinstance(card.why_not_tokens, str) or "\n" in card.why_not_tokens:
        problems.append("why_not_tokens must be one line saying why it refuses token ids, or empty")
    if not isinstance(card.refuses_faults, Mapping):
        problems.append(f"refuses_faults must map fault kinds to why, got {card.refuses_faults!r}")
    else:
        for kind, why in card.refuses_faults.items():
            if kind not in FAULT_KINDS:
                problems.append(f"refuses_faults: unknown fault kind {kind!r}; known: {', '.join(FAULT_KINDS)}")
            elif not _one_line(why):
                problems.append(f"refuses_faults: say in one line why it refuses {kind}")
    if not (isinstance(card.notes, tuple) and all(isinstance(n, str) for n in card.notes)):
        problems.append(f"notes must be a tuple of strings, got {card.notes!r}")
    problems += _changelog_problems(card)
    problems += _smoke_problems(card)
    problems += _preset_problems(card)
    return problems


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(x) for x in version.split("."))


def _changelog_problems(card: MethodCard) -> list[str]:
    """The changelog's shape: (version, one line of text) pairs, versions increasing, the last the card's."""
    log = card.changelog
    if not (isinstance(log, tuple) and all(isinstance(e, tuple) and len(e) == 2 for e in log)):
        return [f"changelog must be a tuple of (version, what changed) pairs, got {log!r}"]
    problems = []
    for version, text in log:
        if not (isinstance(version, str) and VERSION_PATTERN.fullmatch(version)):
            problems.append(f"changelog: a version is a string like \"1.1\" (digits and dots), got {version!r}")
        elif not _one_line(text):
            problems.append(f"changelog: say in one line what {version} changed, got {text!r}")
    if problems or not log:
        return problems
    versions = [v for v, _ in log]
    keys = [_version_key(v) for v in versions]
    if any(a >= b for a, b in zip(keys, keys[1:])):
        problems.append(f"changelog: versions must increase, oldest first, got {', '.join(versions)}")
    if isinstance(card.version, str) and VERSION_PATTERN.fullmatch(card.version) \
            and _version_key(versions[-1]) != _version_key(card.version):
        problems.append(f"changelog: the last entry is {versions[-1]}, but the card's version is {card.version}; "
                        "add what this version changed")
    return problems


def _preset_problems(card: MethodCard) -> list[str]:
    """A preset's shape; that its keys are ``Params`` fields and its values theirs is checked
    where the class is known (``preset_params_problems``)."""
    presets = card.presets
    if not isinstance(presets, Mapping):
        return [f"presets must map preset names to hyperparameters, got {presets!r}"]
    problems = []
    for name, values in presets.items():
        if not (isinstance(name, str) and PRESET_NAME.fullmatch(name)):
            problems.append(f"presets: a preset's name is an identifier in lower case (e.g. \"paper\"), "
                            f"got {name!r}")
        elif not (isinstance(values, Mapping) and values and all(isinstance(k, str) for k in values)):
            problems.append(f"presets: {name!r} must map hyperparameter names to values, got {values!r}")
    return problems


def preset_params_problems(card: MethodCard, params_cls: type) -> list[str]:
    """What is wrong with the card's presets as settings of ``params_cls`` (the method's
    ``Params``): a key that is no field, a value of the wrong type, or a value equal to the
    field's default (a preset that sets nothing would not change the run)."""
    problems = []
    fields = {f.name for f in dataclasses.fields(params_cls)}
    for name, values in card.presets.items():
        unknown = sorted(set(values) - fields)
        if unknown:
            problems.append(f"preset {name!r} sets {', '.join(unknown)}, no hyperparameter of {card.name}; "
                            f"known: {', '.join(sorted(fields)) or '(none)'}")
            continue
        try:
            kept = canonical_params(params_cls, dict(values), card.name)
        except ConfigError as e:
            problems.append(f"preset {name!r}: {e}")
            continue
        at_default = sorted(set(values) - set(kept))
        if at_default:
            problems.append(f"preset {name!r} sets {', '.join(at_default)} to the default: leave it out")
    return problems


def _smoke_problems(card: MethodCard) -> list[str]:
    smoke = card.smoke
    if not isinstance(smoke, SmokeSettings):
        return [f"smoke must be a SmokeSettings, got {smoke!r}"]
    problems = []
    if not (isinstance(smoke.method_params, Mapping)
            and all(isinstance(k, str) and isinstance(v, str) for k, v in smoke.method_params.items())):
        problems.append("smoke.method_params must map names to strings (as --set gives them), "
                        f"got {smoke.method_params!r}")
    if smoke.pool is not None and not isinstance(smoke.pool, str):
        problems.append(f"smoke.pool must be a pool name or None, got {smoke.pool!r}")
    if card.single_architecture and smoke.pool is None:
        problems.append("a single-architecture method names a homogeneous smoke.pool (e.g. \"cpu-cnn\")")
    public = smoke.public_size
    if public is not None and (isinstance(public, bool) or not isinstance(public, int) or public < 0):
        problems.append(f"smoke.public_size must be an integer >= 0 or None, got {public!r}")
    elif public == 0 and card.needs_public:
        problems.append(f"smoke.public_size is 0, but a method whose transfer is {card.transfer} needs a public set")
    pretrain = smoke.pretrain_size
    if isinstance(pretrain, bool) or not isinstance(pretrain, int) or pretrain < 0:
        problems.append(f"smoke.pretrain_size must be an integer >= 0, got {pretrain!r}")
    return problems


def preset_values(card: MethodCard, preset: str | None) -> dict[str, Any]:
    """The hyperparameters ``--preset NAME`` sets ({} for None); ConfigError, one line naming the
    method's presets, for a name the card does not declare."""
    if preset is None:
        return {}
    if preset not in card.presets:
        known = ", ".join(card.presets) or "none"
        raise ConfigError(f"method {card.name} has no preset {preset!r}; its presets: {known} "
                          f"(hfl-bench describe {card.name} shows them)")
    return dict(card.presets[preset])


def matching_preset(card: MethodCard, params_cls: type, params: Mapping[str, Any],
                    given: str | None = None) -> str | None:
    """The preset whose every value the run's canonical hyperparameters ``params`` hold (``given``
    first, then in the card's order), else None: a run's preset follows from what it computes, so
    ``--preset paper`` and the same values by ``--set`` are one run under one name, and a preset
    whose value an explicit ``--set`` changed is no longer that preset."""
    names = ([given] if given in card.presets else []) + [n for n in card.presets if n != given]
    for name in names:
        wanted = canonical_params(params_cls, dict(card.presets[name]), card.name)
        if all(k in params and canonical_json(params[k]) == canonical_json(v) for k, v in wanted.items()):
            return name
    return None
