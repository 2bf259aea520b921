"""The run record as a type: the model (``model``: pydantic, schema 1.11), one upgrade step per older
version (``upgrade``, with the frozen table of what built-in cards said), reading one record file
safely and upgraded (``io``), the one check of a record of any version (``check``), the schema
files (frozen for older versions, generated from the model for the current one) and the frozen
hyperparameters that old records' identities are read with (``legacy_params``). Nothing here
imports torch, numpy or a method: the results layer reads records through this package alone."""
