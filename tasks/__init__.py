"""Built-in task plugins, one module per dataset family (installed as ``hfl_bench.tasks``)."""

# Importing a module runs its @register_task decorator; the entry point loads this package.
# The import order is the registration order, kept as written: not for import sorting.
# isort: skip_file
from hfl_bench.tasks import digits  # noqa: E402,F401
from hfl_bench.tasks import cifar, imagefolder, mnist1d, pathmnist, pfl_npz, synthetic  # noqa: E402,F401
from hfl_bench.tasks import hapt  # noqa: E402,F401
from hfl_bench.tasks import uci_har  # noqa: E402,F401
from hfl_bench.tasks import rotten_tomatoes  # noqa: E402,F401
from hfl_bench.tasks import fashion_mnist  # noqa: E402,F401
from hfl_bench.tasks import digits_mnist1d  # noqa: E402,F401  (after digits and mnist1d: it pairs them)
