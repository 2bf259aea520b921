"""The method API: what a method is, and the services it composes.

A method is a ``Method`` subclass registered by name (``@register_method("name")``). It declares
its metadata (``fidelity``, ``citation``, ``topology``, ``notes``), its hyperparameters
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
  method's own modules; ``fed.make_optimizer(model)`` the protocol's SGD;
- plans: ``make_plan(fed, cid, rnd, epochs, purpose)`` a client's seeded epoch (batch order and
  augmented views); ``transfer_plan(fed, x, epochs=, seed_parts=)`` seeded epochs over shared inputs;
- training: ``train_client(fed, client, plan, loss)`` with a loss the method supplies
  (``loss(batch, logits)``), ``fit(fed, plan, trainees, loss_fn)`` for several models stepped
  together, ``train_students`` for clients trained with CE plus optional KD targets (lockstep
  capable); all detect divergence;
- inference and losses: ``predict_logits``, ``soft_targets``, ``kd_loss``, ``student_loss``;
  ``batch_targets(targets, batch)`` slices a student's ``Targets`` (whole-epoch tensor or
  per-batch function, as the peer-KD backbone hands them out) for one batch;
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
import re
import dataclasses
import inspect
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, ClassVar, Iterator

import torch
from torch import nn

from hfl_bench.checkpoint import load_attrs, pack_attrs
from hfl_bench.config import ConfigError, param, require_at_least
from hfl_bench.federation import Client, ClientView, Federation, RoundView
from hfl_bench.lockstep import train_students
from hfl_bench.metering import SERVER, Payload, Phase
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
    "SERVER", "Batch", "Client", "ClientView", "ConfigError", "Diverged", "EpochPlan", "Federation", "Method", "NoParams",
    "Payload", "Phase", "RoundView", "Targets", "Trainee", "TransferPlan", "batch_targets", "derive_seed", "finite_mean", "fit", "get_method_class", "kd_loss", "make_plan",
    "new_model", "param", "predict_logits", "register_method", "require_at_least", "seeded_init", "soft_targets",
    "student_loss", "train_client", "train_students", "transfer_plan",
]

# "original": a method first published in this project or in the plugin that ships it.
FIDELITIES = ("paper", "reconstructed", "original")
TOPOLOGIES = ("p2p", "server", "none")


@dataclass
class NoParams:
    pass


class Method(abc.ABC):
    """Base class of every method. Subclass it, set the metadata, implement ``run_round``."""

    name: ClassVar[str] = ""  # set by register_method
    fidelity: ClassVar[str] = "paper"  # "paper", "reconstructed" or "original"
    # The version of the method's numerics, in every record: bump it whenever what the method
    # computes changes (tests/test_method_pins.py refuses a changed pin under an unchanged version).
    # Records of different versions never share a leaderboard group.
    version: ClassVar[str] = ""
    citation: ClassVar[str] = ""
    topology: ClassVar[str] = "p2p"  # "p2p", "server" or "none"
    # Choices made where the source is silent; copied into every record.
    notes: ClassVar[tuple[str, ...]] = ()
    Params: ClassVar[type] = NoParams
    # True for a method that cannot run without the public transfer set (``--public-size``).
    needs_public: ClassVar[bool] = False
    # True for a method that runs on a task whose clients miss modalities (hfl_bench.modalities):
    # it reads inputs only through the clients' own models (they fuse whatever modalities a row
    # has) or handles the modalities itself. The others refuse such a task with ``why_single_modality``.
    missing_modalities: ClassVar[bool] = False
    why_single_modality: ClassVar[str] = "it was written for inputs of one modality"

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

    def endpoints(self, fed: RoundView) -> dict[str, list[nn.Module]]:
        """Extra per-client predictors reported beside the headline metric (e.g. a shared model or
        an ensemble), evaluated whenever the global test set is; reported at the selected round.
        A predictor shared by every client is the same module in every client's place: the
        evaluator then runs it once per distinct set of test inputs, not once per client."""
        return {}

    def hparams(self) -> dict[str, Any]:
        return dataclasses.asdict(self.params)

    def state_dict(self, fed: RoundView) -> dict[str, Any]:
        """The method's state for a checkpoint, as plain data (it loads with weights_only=True).

        The default walks the attributes (``vars(self)`` but ``params``) and keeps modules,
        optimizers, tensors, arrays, RNGs, numbers, strings and containers of them; anything else
        (functions, other objects) is left out, since ``setup`` rebuilds it deterministically.
        Override (and ``load_state_dict``) for state that this does not cover.
        """
        return pack_attrs(self, fed, skip=("params",))

    def load_state_dict(self, state: dict[str, Any], fed: RoundView) -> None:
        """Load ``state_dict``'s output into this method right after a fresh ``setup(fed)``:
        modules and optimizers are loaded in place, other values replaced. A module that the
        checkpoint holds but setup did not create is an error: create it here first (``dfml``)."""
        load_attrs(self, state, fed, where=f"method {self.name}")


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


VERSION_PATTERN = re.compile(r"[0-9]+(\.[0-9]+){0,3}")


def check_method_class(name: str, cls: Any) -> None:
    """A registered method must be a concrete ``Method`` subclass with valid metadata."""
    if not (inspect.isclass(cls) and issubclass(cls, Method)):
        raise RegistryError(f"method {name!r} must be a subclass of hfl_bench.method_api.Method, got {cls!r}")
    if inspect.isabstract(cls):
        missing = ", ".join(sorted(cls.__abstractmethods__))
        raise RegistryError(f"method {name!r} ({cls.__qualname__}) does not implement {missing}")
    if cls.fidelity not in FIDELITIES:
        raise RegistryError(f"method {name!r}: fidelity must be one of {', '.join(FIDELITIES)}, got {cls.fidelity!r}")
    if not (isinstance(cls.version, str) and VERSION_PATTERN.fullmatch(cls.version)):
        raise RegistryError(f"method {name!r}: version must be a string like \"1.0\" (digits and dots), "
                            f"got {cls.version!r}; set it on the class and bump it when its numerics change")
    if cls.topology not in TOPOLOGIES:
        raise RegistryError(f"method {name!r}: topology must be one of {', '.join(TOPOLOGIES)}, got {cls.topology!r}")
    if not dataclasses.is_dataclass(cls.Params):
        raise RegistryError(f"method {name!r}: Params must be a dataclass, got {cls.Params!r}")


METHODS.validate = check_method_class  # also checks classes third-party entry points register


def register_method(name: str):
    """Class decorator: register a ``Method`` subclass under ``name`` (refuses anything else)."""

    def add(cls):
        check_method_class(name, cls)
        cls.name = name
        return METHODS.register(name, cls)

    return add


def get_method_class(name: str) -> type[Method]:
    cls = METHODS.get(name)
    check_method_class(name, cls)
    return cls
