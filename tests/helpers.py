"""Builders the method tests share: a federation on the CPU, and a method set up on it."""

from __future__ import annotations

from hfl_bench import testing
from hfl_bench.config import RunConfig
from hfl_bench.federation import Federation
from hfl_bench.method_api import Method


def cpu_federation(cfg: RunConfig) -> Federation:
    """The federation ``cfg`` describes (unset fields from the task's defaults), on the CPU
    (``hfl_bench.testing.cpu_federation``, which plugin packages use too)."""
    return testing.cpu_federation(cfg)


def ready_method(cls: type[Method] | str, fed: Federation, **params) -> Method:
    """``cls`` (or a method name) with these hyperparameters, checked against ``fed`` and set up on
    it (``hfl_bench.testing.ready_method``)."""
    return testing.ready_method(cls, fed, **params)


def record_sends(fed: Federation, monkeypatch) -> list[tuple]:
    """The (source, destination) of every metered send on ``fed``'s channel from now on; the
    sends still go through (and are counted) as usual."""
    sends: list[tuple] = []
    send = fed.channel.send
    monkeypatch.setattr(fed.channel, "send",
                        lambda src, dst, p, kind: sends.append((src, dst)) or send(src, dst, p, kind))
    return sends


def invoke_cli(*args: str):
    """Run the real CLI in-process: (result, stdout, stderr); stderr is "" where the runner mixes it in."""
    from typer.testing import CliRunner

    from hfl_bench.cli import app

    result = CliRunner().invoke(app, list(args))
    try:
        stderr = result.stderr
    except ValueError:
        stderr = ""
    return result, result.stdout, stderr
