"""Missing modalities: which client observes which modality of a multimodal task, and the rule
that a client never sees what it does not observe.

A multimodal task (``TaskInfo.modalities``) stores a sample flat, one modality after the other.
The missing-modality partition draws a seeded fraction of the clients (``recipient_fraction``,
round(f N) of them, at least one when f > 0) as *recipients* that miss one modality
(``missing_modality``); the others are *donors* that observe every modality. The draw is
``training.seeded_choice(seed, N, k, "recipients")``: it depends on the run's seed and N only,
so every method of a comparison has the same recipients.

Missing means absent from the data: the engine writes NaN over the missing modality in every
row a recipient holds (its training, validation and local test halves), and evaluates a
recipient on a copy of the global test set with that modality NaN too. A model for such a task
reads a modality only for the rows where it is finite (``pools.LateFusionNet``), so any code path
that touched a missing value would turn a loss or an accuracy into NaN (the training loops raise
``Diverged``) instead of quietly using data the client does not have.
"""

from __future__ import annotations

import difflib
import hashlib
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from hfl_bench.config import ConfigError
from hfl_bench.data import modality_layout
from hfl_bench.training import seeded_choice

if TYPE_CHECKING:
    from hfl_bench.config import RunConfig
    from hfl_bench.data import TaskInfo

VERSION = "1.0"  # of the recipient draw and the masking rule; bump when either changes
RULE = ("recipients: round(recipient_fraction * N) clients (at least 1 when the fraction is > 0) drawn by "
        "seeded_choice(seed, N, k, 'recipients'); they observe every modality but missing_modality, whose values "
        "are NaN in every row they hold and in the test inputs they are evaluated on; donors observe all")


def slices(info: "TaskInfo") -> dict[str, slice]:
    """Where each modality lies in a flattened sample (the last dimension of the stored input)."""
    return {name: where for name, (where, _) in modality_layout(info.modalities).items()}


@dataclass(frozen=True)
class ModalityPlan:
    names: tuple[str, ...]  # the task's modalities, in layout order
    missing: str
    fraction: float
    observed: tuple[tuple[str, ...], ...]  # per client

    @property
    def recipients(self) -> list[int]:
        return [cid for cid, o in enumerate(self.observed) if len(o) < len(self.names)]

    @property
    def donors(self) -> list[int]:
        return [cid for cid, o in enumerate(self.observed) if len(o) == len(self.names)]

    @property
    def hash(self) -> str:
        text = json.dumps([VERSION, list(self.names), self.missing, [list(o) for o in self.observed]])
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def record(self) -> dict[str, Any]:
        """The record's ``modalities`` section."""
        return {"names": list(self.names), "missing": self.missing, "recipient_fraction": self.fraction,
                "recipients": self.recipients, "donors": self.donors,
                "observed": [list(o) for o in self.observed], "rule": RULE, "version": VERSION, "hash": self.hash}


def plan_for(cfg: "RunConfig", info: "TaskInfo") -> ModalityPlan | None:
    """The run's modality plan (None for a single-modality task); ConfigError for settings that
    do not apply or name no modality of the task."""
    names = tuple(m.name for m in info.modalities)
    if not names:
        for flag, value in (("--recipient-fraction", cfg.recipient_fraction),
                            ("--missing-modality", cfg.missing_modality)):
            if value is not None:
                raise ConfigError(f"{flag} applies to multimodal tasks only; task {info.name} has one modality")
        return None
    missing = cfg.missing_modality
    if missing not in names:
        close = difflib.get_close_matches(str(missing), names, n=1, cutoff=0.5)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ConfigError(f"--missing-modality {missing!r} is not a modality of task {info.name}{hint}; "
                          f"its modalities: {', '.join(names)}")
    fraction = float(cfg.recipient_fraction if cfg.recipient_fraction is not None else 0.0)
    k = 0 if fraction == 0 else min(cfg.clients, max(1, round(fraction * cfg.clients)))
    recipients = set(seeded_choice(cfg.seed, cfg.clients, k, "recipients")) if k else set()
    partial = tuple(n for n in names if n != missing)
    observed = tuple(partial if cid in recipients else names for cid in range(cfg.clients))
    return ModalityPlan(names, missing, fraction, observed)


def mask(x: torch.Tensor, info: "TaskInfo", observed: tuple[str, ...]) -> torch.Tensor:
    """A copy of ``x`` (stored samples [..., D]) with every modality not in ``observed`` NaN."""
    out = x.clone()
    for name, where in slices(info).items():
        if name not in observed:
            out[..., where] = float("nan")
    return out


def mask_clients(x: torch.Tensor, info: "TaskInfo", plan: ModalityPlan, rows: list[torch.Tensor]) -> torch.Tensor:
    """A copy of the training inputs with each recipient's missing modality NaN in the rows it
    holds (``rows[cid]``: its training, validation and local test indices)."""
    out = x.clone()
    for cid in plan.recipients:
        if len(rows[cid]):
            out[rows[cid]] = mask(out[rows[cid]], info, plan.observed[cid])
    return out
