import atexit
import os
import shutil
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HFL_BENCH_DATA", os.path.join(os.path.dirname(__file__), ".data-unused"))
# Caches the CLI writes (the metadata index, unsaved records) go to a folder of this test session,
# never the user's ~/.cache; subprocesses inherit it. Removed when the session (or xdist worker) exits.
os.environ["XDG_CACHE_HOME"] = tempfile.mkdtemp(prefix="hfl-bench-tests-cache-")
atexit.register(shutil.rmtree, os.environ["XDG_CACHE_HOME"], ignore_errors=True)
# pytest-xdist's workers get COLUMNS=80 / LINES=24; the CLI honours COLUMNS (a piped table is
# otherwise 200 wide), so tests see what a plain piped process sees whether xdist runs them or not.
for _name in ("COLUMNS", "LINES"):
    os.environ.pop(_name, None)

import pytest  # noqa: E402
import torch  # noqa: E402

# Two threads on a loaded machine make small-model timings swing; one keeps tests steady.
torch.set_num_threads(1)


@pytest.fixture
def tiny_cfg():
    """A RunConfig for fast end-to-end runs on digits (4 clients, 2 rounds, and the quick protocol
    of ``hfl_bench.testing.QUICK``: one local epoch at batch 64, not the task's calibrated one)."""
    from hfl_bench.config import RunConfig
    from hfl_bench.testing import QUICK

    def make(**overrides):
        values = dict(task="digits", clients=4, rounds=2, seed=0, **QUICK)
        values.update(overrides)
        return RunConfig(**values)

    return make


@pytest.fixture
def run_record(tmp_path):
    """Run the real CLI (`hfl-bench run ARGS --out TMP --json -q`) in-process, check it exits 0,
    and return the record it wrote after validating it against the JSON Schema of its own version."""
    import json
    from pathlib import Path

    jsonschema = pytest.importorskip("jsonschema")
    from typer.testing import CliRunner

    from hfl_bench.cli import app
    from hfl_bench.record.io import load_schema


    def run(*args: str, out: Path | None = None) -> dict:
        result = CliRunner().invoke(app, ["run", *args, "--out", str(out or tmp_path / "runs"), "--json", "-q"])
        assert result.exit_code == 0, result.output
        summary = json.loads(getattr(result, "stdout", result.output))
        record = json.loads(Path(summary["record"]).read_text())
        validator = jsonschema.Draft202012Validator(load_schema(record["schema_version"]))
        errors = [f"{list(e.path)}: {e.message}" for e in validator.iter_errors(record)]
        assert not errors, errors
        assert summary["metrics"]["global_acc"] == record["metrics"]["global_acc"]
        return record

    return run
