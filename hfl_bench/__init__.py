"""hfl-bench: a benchmark suite for heterogeneous federated learning.

The Python API (``hfl_bench.api``) is re-exported here: ``hfl_bench.run``, ``hfl_bench.load_records``,
``hfl_bench.group``, ``hfl_bench.compare``, ``hfl_bench.plot``, ``RunConfig``, ``RunRecord`` and the
errors meant for the user (``ConfigError``, ``RegistryError``, ``DatasetError``, ``PartitionError``).
They are imported on first use (PEP 562), so ``import hfl_bench`` stays light and the package's own modules,
which import it for its version, never import the layers above them.
"""

__version__ = "0.1.0"

# name -> the module that defines it
_API = {
    **{name: "hfl_bench.api" for name in ("run", "load_records", "group", "compare", "plot", "comparison_frame",
                                          "RunRecord", "Records", "RecordNotSaved")},
    "RunConfig": "hfl_bench.config", "ConfigError": "hfl_bench.config", "RegistryError": "hfl_bench.registry",
    "DatasetError": "hfl_bench.errors", "PartitionError": "hfl_bench.errors",
}
__all__ = ["__version__", *_API]


def __getattr__(name: str):
    if name in _API:
        import importlib

        return getattr(importlib.import_module(_API[name]), name)
    raise AttributeError(f"module 'hfl_bench' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_API))
