"""The run record as a type: reading a record file safely (``io``), the schema files (frozen for old
versions, generated for the current one), and, once wired, the typed model and the upgrade steps
that bring an old record to the current shape. Nothing here imports torch or numpy: the results
layer reads records through this package alone."""
