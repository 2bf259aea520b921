"""The errors meant for the user (one line, exit 2), in a module that imports nothing heavy, so the
command line can name them before torch is loaded. ``RegistryError`` lives with the registries;
``ConfigError`` is defined here (so a module the config's checks import, ``capacity``, can raise it
without importing the config back) and re-exported by ``config``; ``DatasetError`` and
``PartitionError`` are re-exported by ``data`` and ``partition``."""


class ConfigError(ValueError):
    """Bad configuration; the message is meant for the user."""


class DatasetError(RuntimeError):
    """A dataset is missing or unreadable; the message names the path and what to do."""


class PartitionError(ValueError):
    """The partition cannot be made with these settings; the message says why."""
