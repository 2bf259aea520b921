"""hfl-bench: a benchmark suite for heterogeneous federated learning."""

__version__ = "0.1.0"
