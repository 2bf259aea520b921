"""Dependencies point one way: no import cycle between hfl_bench modules, and nothing below the
command line imports it. Read from the source with ``ast`` (nothing is imported), over every
module of the package, including ``hfl_bench.methods`` and ``hfl_bench.tasks``, which pyproject
maps to folders of their own."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

try:
    import tomllib
except ImportError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")

REPO = Path(__file__).resolve().parent.parent
PACKAGE = "hfl_bench"
CLI = "hfl_bench.cli"


def package_folders() -> dict[str, Path]:
    """Package name -> its folder: ``hfl_bench`` and the folders ``package-dir`` maps."""
    setuptools = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    mapped = {name: REPO / folder for name, folder in setuptools.get("package-dir", {}).items()}
    return {PACKAGE: REPO / PACKAGE, **mapped}


def module_files() -> dict[str, Path]:
    """Every module's dotted name and file (a package is its ``__init__.py``)."""
    modules: dict[str, Path] = {}
    for package, folder in package_folders().items():
        for path in sorted(folder.rglob("*.py")):
            parts = list(path.relative_to(folder).with_suffix("").parts)
            if "__pycache__" in parts:
                continue
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join([package, *parts])] = path
    return modules


def _is_type_checking(test: ast.expr) -> bool:
    """``if TYPE_CHECKING:`` or ``if typing.TYPE_CHECKING:``."""
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _import_nodes(tree: ast.AST, with_type_checking: bool):
    """Every Import / ImportFrom anywhere in the tree (module level, functions, classes), leaving
    out the body of ``if TYPE_CHECKING:`` blocks unless asked for them."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        if isinstance(node, ast.If) and _is_type_checking(node.test) and not with_type_checking:
            stack.extend(node.orelse)  # the else branch runs
            continue
        stack.extend(ast.iter_child_nodes(node))


def _absolute(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    """The module an ImportFrom names, relative names resolved against ``module``."""
    if not node.level:
        return node.module or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def imported_modules(module: str, path: Path, known: set[str], with_type_checking: bool) -> set[str]:
    """The hfl_bench modules ``module`` imports: ``from a import b`` counts as ``a.b`` when that
    is a module, else as ``a``."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found: set[str] = set()
    for node in _import_nodes(tree, with_type_checking):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            source = _absolute(node, module, path.name == "__init__.py")
            names = [f"{source}.{alias.name}" if f"{source}.{alias.name}" in known else source
                     for alias in node.names]
        found |= {name for name in names if name == PACKAGE or name.startswith(PACKAGE + ".")}
    return found - {module}


def import_graph(with_type_checking: bool) -> dict[str, set[str]]:
    files = module_files()
    known = set(files)
    return {m: imported_modules(m, p, known, with_type_checking) for m, p in files.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle (as a path that returns to its start) per strongly connected component that has
    one (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    components: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.get(root, ()))))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    components.append(sorted(component))
    return [_cycle_in(graph, set(c)) for c in components]


def _cycle_in(graph: dict[str, set[str]], component: set[str]) -> list[str]:
    """A path through the component from its first module back to it (breadth first)."""
    start = min(component)
    previous: dict[str, str] = {}
    frontier = [start]
    while frontier:
        nxt = []
        for node in frontier:
            for child in sorted(graph.get(node, set()) & component):
                if child == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(previous[path[-1]])
                    return [start, *reversed(path[:-1]), start]
                if child not in previous:
                    previous[child] = node
                    nxt.append(child)
        frontier = nxt
    return sorted(component)


# ----------------------------------------------------------------------------- the tests


def test_every_module_is_found():
    modules = module_files()
    assert {"hfl_bench.cli", "hfl_bench.cli.output", "hfl_bench.recording", "hfl_bench.record.io",
            "hfl_bench.matrix.suite", "hfl_bench.engine", "hfl_bench.methods", "hfl_bench.tasks"} <= set(modules)


@pytest.mark.parametrize("with_type_checking", [False, True], ids=["runtime", "with-type-only-imports"])
def test_no_import_cycles(with_type_checking):
    # type-only imports count too: a type that needs its user's module is in the wrong module
    found = cycles(import_graph(with_type_checking=with_type_checking))
    assert not found, "import cycles:\n" + "\n".join(" -> ".join(c) for c in found)


def test_nothing_below_the_cli_imports_it():
    offenders = {m: sorted(i for i in imports if i == CLI or i.startswith(CLI + "."))
                 for m, imports in import_graph(with_type_checking=True).items()
                 if not (m == CLI or m.startswith(CLI + "."))}
    offenders = {m: i for m, i in offenders.items() if i}
    assert not offenders, f"modules outside {CLI} that import it: {offenders}"


def test_cli_output_imports_no_other_cli_module():
    path = module_files()["hfl_bench.cli.output"]
    imports = imported_modules("hfl_bench.cli.output", path, set(module_files()), with_type_checking=True)
    assert not [i for i in imports if i.startswith(CLI)]


@pytest.mark.parametrize("source, expected", [
    ("from hfl_bench import engine\n", {"hfl_bench.engine"}),
    ("from hfl_bench.config import RunConfig\n", {"hfl_bench.config"}),
    ("import hfl_bench.paths as p\n", {"hfl_bench.paths"}),
    ("from . import output\n", {"hfl_bench.cli.output"}),
    ("from ..record.io import load_record\n", {"hfl_bench.record.io"}),
    ("def f():\n    from hfl_bench import paths\n", {"hfl_bench.paths"}),
    ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from hfl_bench import engine\n", set()),
])
def test_imports_are_read_as_python_resolves_them(tmp_path, source, expected):
    path = tmp_path / "__init__.py"  # as if it were the hfl_bench.cli package
    path.write_text(source)
    known = {"hfl_bench.engine", "hfl_bench.config", "hfl_bench.paths", "hfl_bench.cli.output",
             "hfl_bench.record.io"}
    assert imported_modules("hfl_bench.cli", path, known, with_type_checking=False) == expected


def test_a_cycle_is_reported_as_a_path():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c", "a"]]


# The layers, bottom up (README, Layout): a module imports its own layer and the ones below.
LAYERS = [
    ("config, registry and user errors", ("hfl_bench.config", "hfl_bench.confighash", "hfl_bench.registry",
                                          "hfl_bench.errors", "hfl_bench.yamlfile", "hfl_bench.stack",
                                          "hfl_bench.regularfile", "hfl_bench.capacity")),
    ("shared types, paths, provenance", ("hfl_bench.federation", "hfl_bench.paths", "hfl_bench.provenance",
                                         "hfl_bench.metadata_index", "hfl_bench.locks", "hfl_bench.record")),
    ("building blocks", ("hfl_bench.data", "hfl_bench.partition", "hfl_bench.pools", "hfl_bench.augment",
                         "hfl_bench.metering", "hfl_bench.aggregation", "hfl_bench.training", "hfl_bench.graphs",
                         "hfl_bench.checkpoint", "hfl_bench.evaluation", "hfl_bench.families", "hfl_bench.tasks",
                         "hfl_bench.faults", "hfl_bench.modalities", "hfl_bench.npzfile", "hfl_bench.cifar_jpg",
                         "hfl_bench.text_corpus", "hfl_bench.hapt", "hfl_bench.uci_har", "hfl_bench.fashion_mnist",
                         "hfl_bench.modelhead", "hfl_bench.preparing",
                         "hfl_bench.sensor_models", "hfl_bench.flops", "hfl_bench.clock", "hfl_bench.depth_models",
                         "hfl_bench.clientstate", "hfl_bench.width_models")),
    ("method API", ("hfl_bench.method_api", "hfl_bench.method_card")),
    ("methods", ("hfl_bench.methods",)),
    ("engine and the resolved run", ("hfl_bench.engine", "hfl_bench.resolved")),
    ("results, trackers, the run path and matrix", ("hfl_bench.results", "hfl_bench.trackers", "hfl_bench.runpath",
                                                    "hfl_bench.recording", "hfl_bench.reclock", "hfl_bench.matrix")),
    ("Python API", ("hfl_bench.api",)),
    ("command line", ("hfl_bench.cli",)),
    ("test helpers for plugin authors (they run the command line as a program)", ("hfl_bench.testing",)),
]


def layer_of(module: str) -> int | None:
    """The layer of ``module``: the one naming it or a package above it (``hfl_bench`` itself,
    which only holds the version, sits at the bottom)."""
    if module == PACKAGE:
        return 0
    for level, (_, prefixes) in enumerate(LAYERS):
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return level
    return None


def test_every_module_has_a_layer():
    assert not [m for m in module_files() if layer_of(m) is None], "place new modules in LAYERS"


def test_imports_point_down_the_layers():
    upward = [f"{m} ({LAYERS[layer_of(m)][0]}) imports {i} ({LAYERS[layer_of(i)][0]})"
              for m, imports in import_graph(with_type_checking=False).items()
              for i in sorted(imports) if layer_of(i) > layer_of(m)]
    assert not upward, "imports against the dependency direction:\n" + "\n".join(upward)


def test_the_package_root_re_exports_the_python_api_lazily():
    # ``hfl_bench`` sits at the bottom (every module imports it for its version) and imports nothing
    # when imported; its re-exports (PEP 562 ``__getattr__``) name modules of the API layer or below,
    # looked up on first use, so ``import hfl_bench`` neither imports torch nor climbs the layers.
    import hfl_bench

    tree = ast.parse(module_files()[PACKAGE].read_text())
    assert not [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    api = [level for level, (name, _) in enumerate(LAYERS) if name == "Python API"][0]
    for name, module in hfl_bench._API.items():
        assert module in module_files() and layer_of(module) <= api, (name, module)
        assert getattr(hfl_bench, name) is getattr(__import__(module, fromlist=[name]), name)
