"""The method API: what a method is, and the services it composes.

A method is a ``Method`` subclass registered with ``@register_method``. It declares what it is in
one ``card = MethodCard(...)`` (``hfl_bench.method_card``: name, version, citation, fidelity,
topology, transfer data, peer data, evaluated predictor, refusals, smoke-test settings, notes), its hyperparameters
(``Params``, a dataclass whose fields use ``param(default, help)``) and implements
``run_round(fed, rnd, active)``: train the round's active clients and send what would cross the
network. It sees a whole round, so the building blocks can batch work across clients. The engine
owns everything else: data, partition, the loop, evaluation, selection, metering, checkpoints.

What a method may read of the federation during a round is ``RoundView`` (each client's part
``ClientView``), the type of the ``fed`` every hook receives: configuration, metadata, the
clients' models and label counts, the public set, the channel and the timer; no data tensors and
no partition indices. The services it composes are imported from here (they live in the
building blocks):

- models: ``new_model(fed, member, *seed_parts)`` builds a seeded model on the run's device,
  laid out as the engine lays out client models; ``with seeded_init(fed, *seed_parts):`` seeds a
  method's own modules; ``fed.make_optimizer(model)`` the run's optimizer (the protocol's SGD, or
  ``--optimizer adam``);
- plans: ``make_plan(fed, cid, rnd, epochs, purpose)`` a client's seeded epoch (batch order and
  augmented views); ``transfer_plan(fed, x, epochs=, seed_parts=)`` seeded epochs over shared inputs;
- training: ``train_client(fed, client, plan, loss)`` with a loss the method supplies
  (``loss(batch, logits)``), ``fit(fed, plan, trainees, loss_fn)`` for several models stepped
  together, ``train_students`` for clients trained with CE plus optional KD targets (their steps
  replayed as CUDA graphs on a GPU); all detect divergence;
- inference and losses: ``predict_logits``, ``soft_targets``, ``kd_loss``, ``student_loss``;
  ``batch_targets(targets, batch)`` slices a student's ``Targets`` (whole-epoch tensor or
  per-batch function, as the peer-KD backbone hands them out) for one batch;
- the work meter: every step the training services above take is counted on ``fed.budget`` (per
  client, by the data it ran on: ``Data.PRIVATE`` / ``PUBLIC`` / ``SYNTHETIC``); a method that steps
  an optimizer itself counts it there (``fed.budget.add(SERVER, Data.SERVER, steps, samples)``);
- communication and timing: ``fed.channel.send(src, dsts, payload, kind)`` (``SERVER`` for the
  server; ``kind`` a ``Payload``, or a mapping of a dict payload's keys to kinds) returns what the
  receivers get, which is what the method must use (under ``--faults`` a faulty client's message
  arrives corrupted); ``fed.timer(Phase.TRAINING)``;
- seeds: ``derive_seed(fed.cfg.seed, ...)`` for any draw a method makes;
- errors: ``ConfigError`` for a setting the method cannot run, ``require_at_least`` for ranges.

Family code shared by several methods lives in ``hfl_bench.families``.
"""

from __future__ import annotations

import abc
import dataclasses
import inspect
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, ClassVar, Iterator

import torch
from torch import nn

from hfl_bench import config as config_mod
from hfl_bench.checkpoint import load_attrs, pack_attrs
from hfl_bench.config import ConfigError, RunConfig, param, require_at_least
from hfl_bench.data import get_task
from hfl_bench.federation import Client, ClientView, Federation, RoundView
from hfl_bench.graphs import train_students
from hfl_bench.metering import SERVER, Data, Payload, Phase
from hfl_bench.method_card import (
    FIDELITIES,
    LIVE_MODEL,
    PREDICTORS,
    TOPOLOGIES,
    TRANSFERS,
    MethodCard,
    SmokeSettings,
    card_problems,
    matching_preset,
    preset_params_problems,
    preset_values,
)
from hfl_bench.pools import PoolMember, seeded_model
from hfl_bench.registry import METHODS, RegistryError
from hfl_bench.training import (
    Batch,
    Diverged,
    EpochPlan,
    Targets,
    Trainee,
    TransferPlan,
    batch_targets,
    derive_seed,
    finite_mean,
    fit,
    kd_loss,
    make_plan,
    predict_logits,
    soft_targets,
    student_loss,
    train_client,
    transfer_plan,
)

__all__ = [
    "FIDELITIES", "LIVE_MODEL", "PREDICTORS", "TOPOLOGIES", "TRANSFERS", "MethodCard", "SmokeSettings",
    "check_card_setting",
    "SERVER", "Batch", "Client", "ClientView", "ConfigError", "Data", "Diverged", "EpochPlan", "Federation",
    "Method", "NoParams", "Payload", "Phase", "RoundView", "Targets", "Trainee", "TransferPlan", "batch_targets",
    "derive_seed", "finite_mean", "fit", "get_method_class", "kd_loss", "make_plan", "method_defaults",
    "new_model", "param", "predict_logits", "register_method", "require_at_least", "seeded_init", "soft_targets",
    "student_loss", "train_client", "train_students", "transfer_plan",
]


@dataclass
class NoParams:
    pass


class Method(abc.ABC):
    """Base class of every method. Subclass it, declare its ``card``, implement ``run_round``."""

    card: ClassVar[MethodCard]  # everything the method declares about itself (hfl_bench.method_card)
    Params: ClassVar[type] = NoParams

    def __init__(self, params: Any = None):
        self.params = params if params is not None else self.Params()

    def check(self, fed: RoundView) -> None:
        """Reject a setting the method cannot run (raise ConfigError with a clear message)."""

    def setup(self, fed: RoundView) -> None:
        """Called once after clients are built, before round 1."""

    @abc.abstractmethod
    def run_round(self, fed: RoundView, rnd: int, active: list[int]) -> dict[str, float]:
        """Train the active clients for one round; return optional scalars for the history."""

    def changed_clients(self, fed: RoundView, active: list[int]) -> list[int]:
        """Clients whose evaluated model changed this round (the others keep cached figures)."""
        return active

    def eval_models(self, fed: RoundView) -> list[nn.Module]:
        """The model evaluated for each client (default: the client's own model)."""
        return [c.model for c in fed.clients]

    def predictor(self) -> str:
        """Which predictor ``eval_models`` gives the headline (``method_card.PREDICTORS``), in every
        record's ``method.predictor``: the card's, unless a hyperparameter changes it (override then,
        reading only ``self.params``: the leaderboard asks it of old records too)."""
        return self.card.predictor

    def transfer(self) -> str:
        """What the method reads beyond its clients' private data (``method_card.TRANSFERS``), in
        every record's ``method.transfer`` and so in its setting section: the card's, unless a
        hyperparameter changes it (FedMD without its transfer step reads the public set unlabelled;
        override then, reading only ``self.params``)."""
        return self.card.transfer

    def endpoints(self, fed: RoundView) -> dict[str, list[nn.Module]]:
        """Extra per-client predictors reported beside the headline metric (e.g. a shared model or
        an ensemble), evaluated at every test round (a history curve and a final-window figure) and
        at the selected round. A predictor shared by every client is the same module in every
        client's place: the evaluator then runs it once per distinct set of test inputs, not once
        per client. A predictor with a ``hits(logits, y)`` method (a bool per row) is scored by that
        rule instead of ``argmax == y`` (FedCC's open-set rule): an endpoint only, never a headline."""
        return {}

    def hparams(self) -> dict[str, Any]:
        return dataclasses.asdict(self.params)

    def describe_run(self, fed: RoundView) -> dict[str, Any]:
        """Facts about this run that only the method knows and a reader of its record needs (the
        record's ``method.run_details``; absent when empty), as plain JSON data: e.g. the frozen
        feature bank a shared-predictor method built, where its encoders were pretrained and
        whether this run trained them. Asked once, when the record is built; never part of the
        config hash or of what the run computes."""
        return {}

    def state_dict(self, fed: RoundView) -> dict[str, Any]:
        """The method's state for a checkpoint, as plain data (it loads with weights_only=True).

        The default walks the attributes (``vars(self)`` but ``params``) and keeps modules,
        optimizers, tensors, arrays, RNGs, numbers, strings and containers of them; anything else
        (functions, other objects) is left out, since ``setup`` rebuilds it deterministically.
        Override (and ``load_state_dict``) for state that this does not cover.
        """
        return pack_attrs(self, fed, skip=("params",))

    def prepare_resume(self, fed: RoundView, rnd: int) -> None:
        """Called on a resumed run right after a fresh ``setup(fed)``, before the checkpoint's
        client models load; ``rnd`` is the checkpoint's last completed round. A method whose
        clients' models change shape from round to round (the width family's dynamic capacity)
        rebuilds them here as they were after round ``rnd``; the default does nothing."""

    def load_state_dict(self, state: dict[str, Any], fed: RoundView) -> None:
        """Load ``state_dict``'s output into this method right after a fresh ``setup(fed)``:
        modules and optimizers are loaded in place, other values replaced. A module that the
        checkpoint holds but setup did not create is an error: create it here first (``dfml``)."""
        load_attrs(self, state, fed, where=f"method {self.card.name}")


def new_model(fed: RoundView, member: PoolMember, *seed_parts, num_classes: int | None = None) -> nn.Module:
    """A model of pool member ``member``, initialized from ``derive_seed(fed.cfg.seed, *seed_parts)``
    under a forked RNG (the run's global stream is left alone), on the run's device and laid out as
    the engine lays out client models. ``("init", cid)`` rebuilds a client's own initialization;
    ``num_classes`` overrides the task's (FedCC's extra "unknown" output)."""
    info = fed.info if num_classes is None else dataclasses.replace(fed.info, num_classes=num_classes)
    return seeded_model(member, info, derive_seed(fed.cfg.seed, *seed_parts), fed.device, keep_global_rng=True)


@contextmanager
def seeded_init(fed: RoundView, *seed_parts) -> Iterator[None]:
    """Build modules inside this block from ``derive_seed(fed.cfg.seed, *seed_parts)``; the run's
    global torch RNG stream is restored afterwards (a method's own modules: a generator, a shared
    predictor). Pool models come from ``new_model``."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(derive_seed(fed.cfg.seed, *seed_parts))
        yield


# What a class declared before cards: each now lives in the card (refused on the class, where it
# would be silently ignored).
CARD_ATTRIBUTES = ("name", "version", "fidelity", "citation", "topology", "notes", "needs_public",
                   "missing_modalities", "why_single_modality", "why_not_tokens")


def check_method_class(name: str, cls: Any) -> None:
    """A registered method must be a concrete ``Method`` subclass with a valid card naming it."""
    if not (inspect.isclass(cls) and issubclass(cls, Method)):
        raise RegistryError(f"method {name!r} must be a subclass of hfl_bench.method_api.Method, got {cls!r}")
    if inspect.isabstract(cls):
        missing = ", ".join(sorted(cls.__abstractmethods__))
        raise RegistryError(f"method {name!r} ({cls.__qualname__}) does not implement {missing}")
    stray = [a for a in CARD_ATTRIBUTES if any(a in vars(k) for k in cls.__mro__ if k is not Method)]
    if stray:
        raise RegistryError(f"method {name!r} ({cls.__qualname__}) sets {', '.join(stray)} on the class: "
                            "declare them in its card (card = MethodCard(...))")
    if getattr(cls, "card", None) is None:
        raise RegistryError(f"method {name!r} ({cls.__qualname__}) declares no card: set "
                            f"card = MethodCard(name={name!r}, version=..., ...) on the class")
    problems = card_problems(cls.card, name)
    if problems:
        raise RegistryError(f"method {name!r}: " + "; ".join(problems))
    if not dataclasses.is_dataclass(cls.Params):
        raise RegistryError(f"method {name!r}: Params must be a dataclass, got {cls.Params!r}")
    problems = preset_params_problems(cls.card, cls.Params)
    if problems:
        raise RegistryError(f"method {name!r}: " + "; ".join(problems))


METHODS.validate = check_method_class  # also checks classes third-party entry points register


def register_method(cls: Any) -> Any:
    """Class decorator: register a ``Method`` subclass under its card's name (refuses anything else
    and a card with problems)."""
    if isinstance(cls, str):
        raise RegistryError(f"register_method takes the name from the class's card: write @register_method, "
                            f"not @register_method({cls!r})")
    card = getattr(cls, "card", None)
    name = card.name if isinstance(card, MethodCard) and isinstance(card.name, str) else ""
    if not name:
        check_method_class(getattr(cls, "__qualname__", repr(cls)), cls)  # says what is missing
    return METHODS.register(name, cls)


def get_method_class(name: str) -> type[Method]:
    cls = METHODS.get(name)
    check_method_class(name, cls)
    return cls


def method_defaults(method: str) -> dict[str, Any]:
    """The settings a method brings over the task's defaults: its own model family's pool
    (``MethodCard.pool``), else none; {} for an unknown method (reported where it is made)."""
    try:
        card = get_method_class(method).card
    except RegistryError:
        return {}
    return {"pool": card.pool} if card.pool else {}


def check_card_setting(card: MethodCard, fed: Federation) -> None:
    """Refuse a setting the card says the method cannot run (one clear ConfigError): a pool of
    several architectures for a single-architecture method, a fault kind it refuses."""
    if card.single_architecture and not fed.pool.homogeneous:
        members = ", ".join(m.name for m in fed.pool.members)
        raise ConfigError(f"{card.name} needs one architecture for every client; pool {fed.pool.name!r} mixes "
                          f"{members}. Use a homogeneous pool such as --pool cpu-cnn, --pool sensor-cnn (hapt, "
                          "uci-har) or --pool paper-resnet18.")
    faults = fed.faults.kind if fed.faults is not None else None
    if faults in card.refuses_faults:
        raise ConfigError(f"method {card.name} does not run under --faults {faults}: {card.refuses_faults[faults]}")


# ----------------------------------------------------------------------------- a run's method


def resolve_method(cfg: RunConfig) -> tuple[RunConfig, Method]:
    """A run's method worked out once: ``cfg`` with its preset and hyperparameters in the one
    hashed form (``canonical_method``), and the method instance that runs it (``make_method``:
    ConfigError, one line, for an unknown method or hyperparameter, a task it cannot run, a
    missing public set)."""
    cfg = canonical_method(cfg)
    return cfg, make_method(cfg)


def make_method(cfg: RunConfig) -> Method:
    cls = get_method_class(cfg.method)
    check_method_for_task(cls, cfg.task)
    params = config_mod.coerce_params(cls.Params, cfg.method_params, cfg.method)
    if cls.card.needs_public and not cfg.public_size:
        raise ConfigError(f"method {cfg.method} needs a public transfer set: pass --public-size N "
                          f"(samples held out of the training set; the CRAD setup uses 500)")
    return cls(params)


def check_method_for_task(cls: type[Method], task: str) -> None:
    """A task whose clients miss modalities runs only methods written for it, and a text task (token
    ids) only methods whose card does not refuse token ids (one clear line each)."""
    try:
        info = get_task(task).info
    except RegistryError:
        return  # an unknown task is reported where the task is loaded, with its own message
    card = cls.card
    if info.modalities and not card.missing_modalities:
        able = sorted(n for n, c in METHODS.items() if c.card.missing_modalities)
        raise ConfigError(f"method {card.name} does not run task {info.name}, whose clients miss modalities: "
                          f"{card.why_single_modality}. Methods that do: {', '.join(able)}")
    if info.input_kind == "tokens" and card.why_not_tokens.strip():
        raise ConfigError(f"method {card.name} does not run task {info.name}, whose inputs are token ids: "
                          f"{card.why_not_tokens}")


def canonical_method(cfg: RunConfig) -> RunConfig:
    """A config whose settings are already canonical (``config.canonical_settings``), with its
    preset and hyperparameters in the one hashed form (``config.canonical_params``): one run, one
    config hash and one record file, however its values were typed. A ``--preset`` is resolved into
    the hyperparameters (explicit ones win) and ``preset`` becomes the name of the card's preset the
    resolved hyperparameters hold, or None (``method_card.matching_preset``). An unknown preset is
    refused (ConfigError); an unknown method or hyperparameter is left as given: ``make_method``
    reports it (with the method's hyperparameter table on a terminal)."""
    try:
        cls = get_method_class(cfg.method)
    except RegistryError:
        return cfg
    # The preset's values, then the explicit ones over them; an unknown preset is refused here.
    raw = {**preset_values(cls.card, cfg.preset), **cfg.method_params}
    try:
        params = config_mod.canonical_params(cls.Params, raw, cfg.method)
    except (ConfigError, TypeError):
        return dataclasses.replace(cfg, method_params=raw)
    preset = matching_preset(cls.card, cls.Params, params, cfg.preset)
    # compared as hashed: a dict compares 0 and 0.0 equal, and a suite's ``alpha_max: 0`` would then
    # keep its int and hash unlike ``--set alpha_max=0``
    if config_mod.canonical_json(params) == config_mod.canonical_json(cfg.method_params) and preset == cfg.preset:
        return cfg
    return dataclasses.replace(cfg, method_params=params, preset=preset)
