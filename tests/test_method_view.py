"""What a method may read during a round is ``RoundView`` (hfl_bench.federation): every hook a
built-in method overrides is annotated as ``Method`` declares it (``fed: RoundView``, ``rnd: int``,
``active: list[int]``, the return type), and the method modules read nothing of ``fed`` or of its
clients that the views do not offer: no data tensors, no partition indices. Read from the source
with ``ast`` (and from the registered classes), so a new method cannot slip past it."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

import hfl_bench.methods  # noqa: F401  (registers the built-in methods)
from hfl_bench.federation import CLIENT_VIEW, ROUND_VIEW, Client, Federation
from hfl_bench.method_api import Method
from hfl_bench.registry import METHODS
from hfl_bench.testing import tiny_federation

METHOD_FILES = sorted((Path(__file__).resolve().parent.parent / "methods").glob("*.py"))
HOOKS = sorted(name for name, f in vars(Method).items() if inspect.isfunction(f) and not name.startswith("_"))
BUILT_IN = ("hfl_bench.methods", "hfl_bench.families")


def _text(annotation) -> str | None:
    """An annotation as written (``from __future__ import annotations`` keeps them as text)."""
    if annotation is inspect.Parameter.empty:
        return None
    return str(annotation).strip("'\"")


def declared(function) -> dict[str, str | None]:
    sig = inspect.signature(function)
    return {**{n: _text(p.annotation) for n, p in sig.parameters.items() if n != "self"},
            "return": _text(sig.return_annotation)}


def unannotated_hooks(cls: type) -> list[str]:
    """The hooks ``cls`` itself defines whose signature differs from ``Method``'s declaration."""
    found = []
    for name in HOOKS:
        if name in vars(cls):
            want, got = declared(getattr(Method, name)), declared(vars(cls)[name])
            if got != want:
                found.append(f"{cls.__module__}.{cls.__qualname__}.{name}: {got} (Method declares {want})")
    return found


def _client_names(function: ast.AST) -> set[str]:
    """Names a function binds to one of ``fed.clients``: ``c = fed.clients[k]``, ``for c in fed.clients``
    (comprehensions too), ``for k, c in enumerate(fed.clients)``, ``for c, x in zip(fed.clients, ...)``,
    also through an alias ``clients = fed.clients``."""
    aliases = {t.id for node in ast.walk(function) if isinstance(node, ast.Assign)
               and isinstance(node.value, ast.Attribute) and node.value.attr == "clients"
               and isinstance(node.value.value, ast.Name) and node.value.value.id == "fed"
               for t in node.targets if isinstance(t, ast.Name)}

    def is_clients(node) -> bool:
        return (isinstance(node, ast.Attribute) and node.attr == "clients" and isinstance(node.value, ast.Name)
                and node.value.id == "fed") or (isinstance(node, ast.Name) and node.id in aliases)

    names: set[str] = set()
    for node in ast.walk(function):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Subscript) and is_clients(node.value.value):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        if isinstance(node, (ast.For, ast.comprehension)):
            it, target = node.iter, node.target
            if is_clients(it) and isinstance(target, ast.Name):
                names.add(target.id)
            if isinstance(it, ast.Call) and isinstance(it.func, ast.Name) and isinstance(target, ast.Tuple):
                sources = it.args if it.func.id == "zip" else [None, *it.args[:1]] if it.func.id == "enumerate" else []
                for source, bound in zip(sources, target.elts):
                    if source is not None and is_clients(source) and isinstance(bound, ast.Name):
                        names.add(bound.id)
    return names


def view_violations(source: str, filename: str) -> list[str]:
    """Every read of ``fed`` or of one of its clients outside RoundView / ClientView, and every
    reach around the view (``engine_side``, ``getattr(fed, ...)``)."""
    tree = ast.parse(source, filename=filename)
    found: set[tuple[int, str]] = set()

    def report(node: ast.AST, what: str) -> None:
        found.add((node.lineno, what))

    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "fed":
            if node.attr not in ROUND_VIEW:
                report(node, f"fed.{node.attr} is not in RoundView")
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Subscript)
                and isinstance(node.value.value, ast.Attribute) and node.value.value.attr == "clients"
                and isinstance(node.value.value.value, ast.Name) and node.value.value.value.id == "fed"
                and node.attr not in CLIENT_VIEW):
            report(node, f"fed.clients[...].{node.attr} is not in ClientView")
        if isinstance(node, ast.Name) and node.id == "engine_side" or (
                isinstance(node, ast.alias) and node.name == "engine_side"):
            report(node, "engine_side is for the building blocks, not for methods")
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr"
                and node.args and isinstance(node.args[0], ast.Name) and node.args[0].id == "fed"):
            report(node, "getattr(fed, ...) reads around RoundView")
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            clients = _client_names(node)
            for sub in ast.walk(node):
                if (isinstance(sub, ast.Attribute) and isinstance(sub.value, ast.Name) and sub.value.id in clients
                        and sub.attr not in CLIENT_VIEW):
                    report(sub, f"{sub.value.id}.{sub.attr} (a client) is not in ClientView")
    return [f"{filename}:{line}: {what}" for line, what in sorted(found)]


# ----------------------------------------------------------------------------- the rules hold


def built_in_classes() -> list[type]:
    """Every class a built-in method is made of (the method and its family mixins), once each."""
    classes: dict[type, None] = {}
    for name in METHODS.names():
        for cls in METHODS.get(name).__mro__:
            if cls.__module__.startswith(BUILT_IN):
                classes[cls] = None
    return list(classes)


def test_every_hook_a_built_in_method_overrides_is_annotated_as_method_declares_it():
    classes = built_in_classes()
    assert len(classes) >= 12 and HOOKS and "run_round" in HOOKS
    problems = [p for cls in classes for p in unannotated_hooks(cls)]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("path", METHOD_FILES, ids=[p.name for p in METHOD_FILES])
def test_a_method_reads_only_what_round_view_offers(path):
    problems = view_violations(path.read_text(), path.name)
    assert not problems, "\n".join(problems)


def test_the_engines_federation_offers_every_member_of_the_views():
    fed = tiny_federation()
    assert isinstance(fed, Federation) and isinstance(fed.clients[0], Client)
    assert not [n for n in ROUND_VIEW if not hasattr(fed, n)]
    assert not [n for n in CLIENT_VIEW if not hasattr(fed.clients[0], n)]
    assert fed.clients[0].n_train == len(fed.clients[0].train_idx) == int(fed.clients[0].train_counts.sum())
    # the data, the partition's indices and the execution choices are what the views leave out
    assert not {"data", "partition", "public_idx", "faults", "exec_path", "use_cuda_graphs"} & ROUND_VIEW
    assert not {"train_idx", "val_idx", "test_idx"} & CLIENT_VIEW


# ----------------------------------------------------------------------------- the checks can fail


BAD_METHOD = '''
class Leaky(Method):
    def run_round(self, fed: RoundView, rnd: int, active: list[int]) -> dict[str, float]:
        x = fed.data.train_x
        for c in fed.clients:
            c.train_idx
        rows = [cl.val_idx for cl in fed.clients]
        fed.clients[0].test_idx
        client = fed.clients[1]
        client.model, client.test_idx
        everyone = fed.clients
        [torch.cat([k.val_idx, m.model]) for k, m in zip(everyone, models)]
        getattr(fed, "partition")
        return {"ok": float(fed.n_clients + fed.clients[0].n_train)}
'''


def test_the_view_check_reports_each_read_around_the_view():
    problems = view_violations(BAD_METHOD, "leaky.py")
    assert [p.split(": ", 1)[1] for p in problems] == [
        "fed.data is not in RoundView",
        "c.train_idx (a client) is not in ClientView",
        "cl.val_idx (a client) is not in ClientView",
        "fed.clients[...].test_idx is not in ClientView",
        "client.test_idx (a client) is not in ClientView",
        "k.val_idx (a client) is not in ClientView",
        "getattr(fed, ...) reads around RoundView",
    ]
    assert view_violations("from hfl_bench.federation import engine_side\n", "x.py")


def test_the_hook_check_reports_an_unannotated_or_misannotated_hook():
    class Bare(Method):
        def run_round(self, fed, rnd, active):
            return {}

        def eval_models(self, fed: "Federation") -> "list[nn.Module]":  # noqa: F821 (compared as text, never resolved)
            return []

    class Typed(Method):
        def run_round(self, fed: RoundView, rnd: int, active: list[int]) -> dict[str, float]:  # noqa: F821
            return {}

    problems = unannotated_hooks(Bare)
    assert len(problems) == 2 and "run_round" in problems[1] and "eval_models" in problems[0]
    assert unannotated_hooks(Typed) == []
