import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HFL_BENCH_DATA", os.path.join(os.path.dirname(__file__), ".data-unused"))

import pytest  # noqa: E402
import torch  # noqa: E402

# Two threads on a loaded machine make small-model timings swing; one keeps tests steady.
torch.set_num_threads(1)


@pytest.fixture
def tiny_cfg():
    """A RunConfig for fast end-to-end runs on digits (4 clients, 2 rounds)."""
    from hfl_bench.config import RunConfig

    def make(**overrides):
        values = dict(task="digits", clients=4, rounds=2, seed=0)
        values.update(overrides)
        return RunConfig(**values)

    return make
