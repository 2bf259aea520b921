"""The errors meant for the user (one line, exit 2), in a module that imports nothing heavy, so the
command line can name them before torch is loaded. ``ConfigError`` and ``RegistryError`` live
with the config and the registries; these two are re-exported by ``data`` and ``partition``."""


class DatasetError(RuntimeError):
    """A dataset is missing or unreadable; the message names the path and what to do."""


class PartitionError(ValueError):
    """The partition cannot be made with these settings; the message says why."""
