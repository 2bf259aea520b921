"""The tutorial plugin: one method, ``example-prior`` (``hfl_bench_prior.method``)."""
