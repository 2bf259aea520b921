"""``python -m hfl_bench.cli``: the same as the ``hfl-bench`` console script."""

from hfl_bench.cli import main

main()
