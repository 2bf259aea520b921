"""The method interface: a method sees a whole round; the engine owns everything else.

A method is a class with a ``Params`` dataclass (its hyperparameters, with help text) and a
``run_round`` that trains the round's active clients using the engine's primitives
(``hfl_bench.training``, ``hfl_bench.peerkd``) and sends whatever crosses the network through
``fed.channel``. Data, partition, evaluation, checkpoint selection and metering are the engine's.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from torch import nn

from hfl_bench.config import ConfigError
from hfl_bench.registry import METHODS

if TYPE_CHECKING:
    from hfl_bench.engine import Federation


def param(default: Any, help: str):
    """A hyperparameter field with help text: ``lam: float = param(0.7, "Distillation weight.")``."""
    return field(default=default, metadata={"help": help})


def require_at_least(method: str, params: Any, names: tuple[str, ...], minimum: float) -> None:
    """For ``Method.check``: each named hyperparameter must be >= ``minimum`` (ConfigError naming it)."""
    for name in names:
        value = getattr(params, name)
        if value < minimum:
            raise ConfigError(f"{method}: {name} must be >= {minimum}, got {value}")


@dataclass
class NoParams:
    pass


class Method:
    """Base class of method plugins."""

    name: ClassVar[str] = ""
    fidelity: ClassVar[str] = "paper"  # "paper" or "reconstructed"
    citation: ClassVar[str] = ""
    topology: ClassVar[str] = "p2p"  # "p2p", "server" or "none"
    # Choices made where the source is silent; copied into every record.
    notes: ClassVar[tuple[str, ...]] = ()
    Params: ClassVar[type] = NoParams
    # True for a method that cannot run without the public transfer set (``--public-size``).
    needs_public: ClassVar[bool] = False

    def __init__(self, params: Any = None):
        self.params = params if params is not None else self.Params()

    def check(self, fed: "Federation") -> None:
        """Reject a setting the method cannot run (raise ConfigError with a clear message)."""

    def setup(self, fed: "Federation") -> None:
        """Called once after clients are built, before round 1."""

    def run_round(self, fed: "Federation", rnd: int, active: list[int]) -> dict[str, float]:
        """Train the active clients for one round; return optional scalars for the history."""
        raise NotImplementedError

    def changed_clients(self, fed: "Federation", active: list[int]) -> list[int]:
        """Clients whose evaluated model changed this round (the others keep cached figures)."""
        return active

    def eval_models(self, fed: "Federation") -> list[nn.Module]:
        """The model evaluated for each client (default: the client's own model)."""
        return [c.model for c in fed.clients]

    def endpoints(self, fed: "Federation") -> dict[str, list[nn.Module]]:
        """Extra per-client predictors reported beside the headline metric (e.g. a shared model or
        an ensemble), evaluated whenever the global test set is; reported at the selected round."""
        return {}

    def hparams(self) -> dict[str, Any]:
        return dataclasses.asdict(self.params)

    def state_dict(self, fed: "Federation") -> dict[str, Any]:
        """The method's state for a checkpoint, as plain data (it loads with weights_only=True).

        The default walks the attributes (``vars(self)`` but ``params``) and keeps modules,
        optimizers, tensors, arrays, RNGs, numbers, strings and containers of them; anything else
        (functions, other objects) is left out, since ``setup`` rebuilds it deterministically.
        Override (and ``load_state_dict``) for state that this does not cover.
        """
        from hfl_bench.checkpoint import pack_attrs

        return pack_attrs(self, fed, skip=("params",))

    def load_state_dict(self, state: dict[str, Any], fed: "Federation") -> None:
        """Load ``state_dict``'s output into this method right after a fresh ``setup(fed)``:
        modules and optimizers are loaded in place, other values replaced. A module that the
        checkpoint holds but setup did not create is an error: create it here first (``dfml``)."""
        from hfl_bench.checkpoint import load_attrs

        load_attrs(self, state, fed, where=f"method {self.name}")


def register_method(name: str):
    """Class decorator: register a ``Method`` subclass under ``name``."""

    def add(cls):
        cls.name = name
        return METHODS.register(name, cls)

    return add


def get_method_class(name: str) -> type[Method]:
    return METHODS.get(name)
