"""hfl-bench example plugin: method ``example-kd``, aggregator ``example-median``, task ``example-blobs``."""

from hfl_bench_example import aggregator, method, task  # noqa: F401  (registers all three)
