"""Runs from several threads of one process (issue 63, rows 1 and 2): ``hfl_bench.run`` called by a
thread pool gives the records a sequential run gives (runs in one process run one at a time,
``engine.RUN_LOCK``), and registry discovery raced by several threads in a fresh process never shows
one of them a registry half filled."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import hfl_bench
from hfl_bench import pools
from hfl_bench.testing import QUICK

ENV = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")
TINY = {"task": "digits", "rounds": 2, "clients": 3, **QUICK}
SWEEP = [{"method": "crad", "seed": 0}, {"method": "crad", "seed": 1}]
TIMINGS = ("seconds", "phases")
MEET_S = 3.0  # how long a run waits at its first model for the other thread's run


def _figures(record: hfl_bench.RunRecord) -> dict:
    """What two runs of one config share: everything but the timings, the date and the paths."""
    return {"config_hash": record.config_hash, "status": record.status, "metrics": record.data["metrics"],
            "history": [{k: v for k, v in e.items() if k not in TIMINGS} for e in record.history]}


@pytest.mark.slow  # four runs, and a wait of MEET_S at the meeting point
def test_runs_from_a_thread_pool_give_the_sequential_records(tmp_path, monkeypatch):
    sequential = [_figures(hfl_bench.run(**TINY, **cell, out=str(tmp_path / "sequential"), threads=1))
                  for cell in SWEEP]

    # Each thread's run stops at its first client model (its seed already set: ``pools.seeded_model``)
    # until the other thread's run gets there too, or MEET_S passes: runs that share the process's
    # random state then build from the other's seed. Runs one at a time never meet.
    meet = threading.Barrier(len(SWEEP), timeout=MEET_S)
    met: set[int] = set()
    build = pools.build_model

    def build_after_meeting(*args, **kwargs):
        if threading.get_ident() not in met:
            met.add(threading.get_ident())
            try:
                meet.wait()
            except threading.BrokenBarrierError:  # the other run is not there: it waits for this one
                pass
        return build(*args, **kwargs)

    monkeypatch.setattr(pools, "build_model", build_after_meeting)
    with ThreadPoolExecutor(len(SWEEP)) as pool:
        futures = [pool.submit(hfl_bench.run, **TINY, **cell, out=str(tmp_path / "threads"), threads=1)
                   for cell in SWEEP]
        threaded = [_figures(f.result(timeout=300)) for f in futures]
    assert len(met) == len(SWEEP)  # both runs went through the meeting point
    for cell, alone, together in zip(SWEEP, sequential, threaded):
        assert together == alone, f"{cell}: the threaded run's figures differ from the sequential run's"


def test_a_progress_callback_may_run_again_in_its_own_thread(tmp_path):
    """The run lock is reentrant: a run started from a progress callback (the same thread) runs."""
    inner = []

    def progress(rnd, rounds, entry):
        if not inner:
            inner.append(hfl_bench.run(**{**TINY, "rounds": 1}, method="local", out=str(tmp_path / "inner"), threads=1))

    outer = hfl_bench.run(**TINY, method="local", seed=1, out=str(tmp_path / "outer"), threads=1, progress=progress)
    assert outer.status == "ok" and inner[0].status == "ok"


# A fresh process whose discovery is slowed down (listing the entry points of a group takes a
# second): a second thread looks a task up while the first is discovering.
RACE = textwrap.dedent("""
    import json, threading, time
    from hfl_bench import registry

    listing = registry._entry_points
    entered = threading.Event()

    def slow(group):
        entered.set()
        time.sleep(1.0)
        return listing(group)

    registry._entry_points = slow
    found = {}

    def look(key, lookup):
        try:
            found[key] = lookup()
        except Exception as e:
            found[key] = f"{type(e).__name__}: {e}"

    first = threading.Thread(target=look, args=("first", lambda: registry.TASKS.get("digits").info.name))
    first.start()
    entered.wait(30)
    others = [threading.Thread(target=look, args=("second", lambda: registry.TASKS.get("digits").info.name)),
              threading.Thread(target=look, args=("names", lambda: registry.TASKS.names())),
              threading.Thread(target=look, args=("method", lambda: registry.METHODS.get("crad").__name__))]
    for t in others:
        t.start()
    for t in [first, *others]:
        t.join(120)
    print(json.dumps(found))
""")


@pytest.mark.slow  # a process
def test_registry_discovery_raced_by_threads_in_a_fresh_process():
    done = subprocess.run([sys.executable, "-c", RACE], capture_output=True, text=True, env=ENV, timeout=300,
                          cwd=Path(__file__).resolve().parent.parent)
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["first"] == "digits" and found["second"] == "digits", found
    assert isinstance(found["names"], list) and "digits" in found["names"], found
    assert found["method"] == "CRAD", found
