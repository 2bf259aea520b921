"""Builders the method tests share: a federation on the CPU, and a method set up on it."""

from __future__ import annotations

import torch

from hfl_bench import engine
from hfl_bench.config import RunConfig, resolve
from hfl_bench.data import get_task
from hfl_bench.method import Method


def cpu_federation(cfg: RunConfig) -> engine.Federation:
    """The federation ``cfg`` describes (unset fields from the task's defaults), on the CPU."""
    task = get_task(cfg.task)
    cfg = resolve(cfg, task.info.defaults)
    return engine.build_federation(cfg, task.info, task.load(), torch.device("cpu"))


def ready_method(cls: type[Method], fed: engine.Federation, **params) -> Method:
    """``cls`` with these hyperparameters, checked against ``fed`` and set up on it."""
    method = cls(cls.Params(**params))
    method.check(fed)
    method.setup(fed)
    return method
