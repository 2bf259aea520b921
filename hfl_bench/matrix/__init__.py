"""Matrix runs: a suite of methods x tasks x seeds (x fault settings), run cell by cell (no command line here:
``hfl_bench.cli.matrix`` is the ``hfl-bench matrix`` command).

Modules: ``suite`` (the suite file and its cells), ``resume`` (which cells already have a final
record), ``cells`` (running one cell into a record), ``executor_api`` (the ``Executor`` base class,
its options dataclasses and the ``EXECUTORS`` registry, plugins' through the entry point group
``hfl_bench.executors``), ``executors`` (the built-ins: local, in this process; pool, worker
processes; ray, Ray tasks) and ``runner`` (run_matrix, dry runs and the summary rows).

A suite is a YAML file (format below, and in the README). Each cell is one ``RunConfig``,
resolved against its task's defaults, run as ``engine.run`` + ``recording.build_record`` and
written to the suite's output folder under ``paths.record_path``, so a cell's record path
is known before it runs: a rerun skips every cell whose record is already there (status ok or
diverged, same config hash and seed, same data fingerprint; ``resume``) and retries the failed
ones. Nothing one cell raises, while running or while its record is built or written, stops the
others: the cell becomes a ``status: "failed"`` record (a record ``--out`` cannot take goes to
``paths.unsaved_dirs()``, and the summary says where) and the matrix goes on. Method and task
names must be able to name files (``paths.NAME_PATTERN``): a suite naming ``x/../../elsewhere``
is refused when it is read, and one naming an unregistered method, task or pool before its first
cell (``suite.check_names``). Pool workers die with the driver; Ctrl-C stops every cell and the
same command continues.

Suite format::

    name: mini                      # optional; default: the file name
    description: ...                # optional
    out: leaderboards/reproduced/mini   # record folder (relative to the working directory)
    methods: [local, crad, fedavg]
    tasks: [digits, mnist1d]
    seeds: [0, 1, 2]                # optional; default: each task's default seed
    faults: [none, byzantine:0.2]   # optional fault axis (README Faults): one cell per spec, none =
                                    # no faults; then faults may not appear in settings or overrides
    settings:                       # shared: any RunConfig field, plus method_params
      rounds: 100
    task_overrides:                 # optional, per task; applied over settings
      mnist1d: {rounds: 50}
    method_overrides:               # optional, per method; applied last
      fedavg: {pool: cpu-cnn}
      crad: {method_params: {lam: 0.5}}
      dfml:                         # a list: variants, one run of the method per entry
        - {}
        - {method_params: {eval: current}}

``method_params`` mappings are merged key by key across the layers; other keys replace. A
method's variants each give their own cells (own config hash and record), named in the summary's
``variant`` column; two variants that resolve to one config are refused (``suite.suite_cells``).
"""
