"""The results layer: record files (build, write, load, schema), the one record reader, which
records are valid (``validation``), the one seed-grouping rule, the leaderboard (published
figures, ranking, rendering) and the plots, and untrusted text made safe for each output
(``text``).

Nothing here is a command: the CLI (``hfl_bench.cli``) calls into it, never the other way round.
"""
