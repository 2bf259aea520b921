"""Built-in method plugins, one module per method family (installed as ``hfl_bench.methods``)."""

# Importing a module runs its @register_method decorators; the entry point loads this package.
# The import order is the registration order, kept as written: not for import sorting.
# isort: skip_file
from hfl_bench.methods import crad, dfml, fedavg, fedmkd, fedsocket, fml, local  # noqa: F401
from hfl_bench.methods import fedcc, msfkd  # noqa: F401
from hfl_bench.methods import ds_fl  # noqa: F401
from hfl_bench.methods import fedgd, fedmd  # noqa: F401
from hfl_bench.methods import naive_shared  # noqa: F401
from hfl_bench.methods import fedkd, fedmrl, fedl2g  # noqa: F401
from hfl_bench.methods import fd, fedproto, fedtgp  # noqa: F401
from hfl_bench.methods import lg_fedavg  # noqa: F401
from hfl_bench.methods import fedgh  # noqa: F401
from hfl_bench.methods import fedgen  # noqa: F401
from hfl_bench.methods import feddf  # noqa: F401
from hfl_bench.methods import heterofl, fedrolex  # noqa: F401
from hfl_bench.methods import depthfl  # noqa: F401
from hfl_bench.methods import fjord  # noqa: F401
