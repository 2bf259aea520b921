"""The results layer: record files (build, write, load, schema), the one record reader, the one
seed-grouping rule, the leaderboard (published figures, ranking, rendering) and the plots.

Nothing here is a command: the CLI (``hfl_bench.cli``) calls into it, never the other way round.
"""
