"""Registries: decorator registration, clear lookup errors, and discovery through entry points
(built-ins and a third-party plugin package installed only via a ``.dist-info`` folder)."""

from __future__ import annotations

import importlib
import importlib.metadata
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hfl_bench.registry import (
    AGGREGATORS,
    METHODS,
    PARTITIONERS,
    POOLS,
    REGISTRIES,
    TASKS,
    Registry,
    RegistryError,
)
from hfl_bench.testing import builtin_names, is_builtin

from helpers import write_dist

# --------------------------------------------------------------------------- Registry basics


def test_decorator_registration_and_lookup():
    reg = Registry("thing")

    @reg.register("alpha")
    def alpha():
        """The alpha thing."""

    reg.register("beta", 42)
    assert reg.get("alpha") is alpha  # the decorator returns the object unchanged
    assert reg.get("beta") == 42
    assert reg.names() == ["alpha", "beta"]
    assert "alpha" in reg and "gamma" not in reg
    assert len(reg) == 2
    assert dict(reg.items()) == {"alpha": alpha, "beta": 42}
    assert reg.origin("alpha") == __name__
    # Re-registering the very same object is harmless.
    reg.register("alpha", alpha)
    assert reg.get("alpha") is alpha


def test_duplicate_name_rejected():
    reg = Registry("thing")
    reg.register("alpha", object(), origin="first-plugin")
    with pytest.raises(RegistryError, match="already registered") as e:
        reg.register("alpha", object())
    assert "first-plugin" in str(e.value)
    with pytest.raises(RegistryError):
        reg.register("  ", object())


def test_unknown_name_lists_available_and_suggests():
    reg = Registry("thing")
    for name in ("crad", "local", "fedavg"):
        reg.register(name, name)
    with pytest.raises(RegistryError) as e:
        reg.get("crda")
    msg = str(e.value)
    assert "unknown thing 'crda'" in msg
    assert "Did you mean 'crad'?" in msg
    for name in ("crad", "local", "fedavg"):
        assert name in msg
    # Nothing close: no suggestion, still the list.
    with pytest.raises(RegistryError) as e:
        reg.get("zzzzzzzz")
    assert "Did you mean" not in str(e.value)
    assert "Available: crad, fedavg, local" in str(e.value)
    assert isinstance(e.value, LookupError)


def test_empty_registry_message():
    with pytest.raises(RegistryError, match=r"\(none\)"):
        Registry("thing").get("x")


# --------------------------------------------------------------------------- built-ins


# A few names each registry must hold (methods: every module of methods/ registers one, below).
BUILTINS = {
    "tasks": {"digits", "mnist1d", "cifar10", "cifar100", "pathmnist"},
    "pools": {"paper", "cpu", "cpu-cnn", "paper-resnet18"},
    "partitioners": {"dirichlet", "classes", "iid"},
    "aggregators": {"uniform", "entropy", "crad", "crad-accuracy", "crad-support", "crad-softmax",
                    "crad-lcb", "crad-inv-sigma", "crad-ce", "crad-stage1", "crad-no-agreement-filter",
                    "crad-support-filter-only"},
}


@pytest.mark.parametrize("group, module", [
    ("hfl_bench.methods", "hfl_bench.methods"),
    ("hfl_bench.tasks", "hfl_bench.tasks"),
    ("hfl_bench.pools", "hfl_bench.pools"),
    ("hfl_bench.partitioners", "hfl_bench.partition"),
    ("hfl_bench.aggregators", "hfl_bench.aggregation"),
])
def test_builtins_declared_as_entry_points(group, module):
    eps = {ep.name: ep.value for ep in importlib.metadata.entry_points(group=group)}
    assert eps.get("builtin") == module


@pytest.mark.parametrize("kind", sorted(BUILTINS))
def test_builtin_names_registered(kind):
    registry = REGISTRIES[kind]
    assert BUILTINS[kind] <= set(builtin_names(registry))
    assert registry is {"methods": METHODS, "tasks": TASKS, "pools": POOLS, "partitioners": PARTITIONERS,
                        "aggregators": AGGREGATORS}[kind]


def test_each_kind_is_named_as_its_entry_point_group():
    """One name per kind: ``hfl-bench list KIND`` and ``describe --kind KIND`` take the name of the
    entry-point group plugins register under (``hfl_bench.KIND``)."""
    for kind, registry in REGISTRIES.items():
        assert registry.entry_point_group == f"hfl_bench.{kind}"


def test_every_module_of_the_methods_package_registers_a_method():
    """A method module left out of methods/__init__.py would register nothing (and no suite would
    run it): every module under methods/ is the origin of at least one built-in method."""
    folder = Path(__file__).resolve().parent.parent / "methods"
    modules = {f"hfl_bench.methods.{p.stem}" for p in folder.glob("*.py") if p.stem != "__init__"}
    assert modules and {METHODS.origin(name) for name in builtin_names(METHODS)} == modules


def test_registered_methods_carry_their_names():
    assert builtin_names(METHODS)
    for name, cls in METHODS.items():
        assert cls.card.name == name


@pytest.mark.parametrize("kind", sorted(BUILTINS))
def test_builtin_names_are_those_hfl_bench_registered(kind):
    """``hfl_bench.testing.builtin_names``: what the project's tests enumerate, whatever plugins
    are installed (an entry whose origin module is not under ``hfl_bench.`` is left out)."""
    registry = REGISTRIES[kind]
    names = builtin_names(registry)
    assert BUILTINS[kind] <= set(names) and names == sorted(names)
    assert all(is_builtin(registry, n) == (n in names) for n in registry.names())


def test_builtin_origins():
    reg = Registry("thing")
    reg.register("ours", object(), origin="hfl_bench.methods.crad")
    reg.register("top", object(), origin="hfl_bench")
    reg.register("theirs", object(), origin="hfl_bench_example.method")  # a prefix is not a package
    reg.register("object-ep", object(), origin="entry point other_pkg.mod:Thing")
    reg.register("builtin-ep", object(), origin="entry point hfl_bench.pools:PAPER")
    assert builtin_names(reg) == ["builtin-ep", "ours", "top"]


# --------------------------------------------------------------------------- third-party plugins


PLUGIN_MODULE = '''
"""A third-party method plugin, found only through its entry point."""

from hfl_bench.method_api import Method, MethodCard, register_method
from hfl_bench.training import make_plan, train_on_plan


@register_method
class DemoLocal(Method):
    card = MethodCard(name="demo-local", version="1.0", fidelity="reconstructed", topology="none",
                      citation="demo", summary="Demo plugin: cross-entropy on each client's own data.")

    def run_round(self, fed, rnd, active):
        losses = [train_on_plan(fed, fed.clients[i], make_plan(fed, i, rnd)) for i in active]
        return {"train_loss": sum(losses) / len(losses)}
'''

OBJ_PLUGIN_MODULE = '''
"""A plugin whose entry point names the Method subclass itself (no @register_method)."""

from hfl_bench.method_api import Method, MethodCard
from hfl_bench.training import make_plan, train_on_plan


class ObjMethod(Method):
    card = MethodCard(name="obj-method", version="1.0", fidelity="reconstructed", topology="none",
                      citation="demo", summary="Object entry point plugin: local cross-entropy.")

    def run_round(self, fed, rnd, active):
        losses = [train_on_plan(fed, fed.clients[i], make_plan(fed, i, rnd)) for i in active]
        return {"train_loss": sum(losses) / len(losses)}
'''


@pytest.fixture(scope="module")
def plugin_path(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("plugins")
    write_dist(root, "hflb_demo_plugin", "hflb-demo-plugin", PLUGIN_MODULE,
                "[hfl_bench.methods]\ndemo = hflb_demo_plugin\n")
    write_dist(root, "hflb_demo_plugin2", "hflb-demo-plugin2", OBJ_PLUGIN_MODULE,
                "[hfl_bench.methods]\nobj-method = hflb_demo_plugin2:ObjMethod\n")
    return root


def _cli(plugin_root: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(plugin_root), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["HF_HUB_OFFLINE"] = "1"
    env["OMP_NUM_THREADS"] = "1"
    return subprocess.run([sys.executable, "-m", "hfl_bench.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.slow  # the CLI as a process
def test_plugins_listed_through_entry_points(plugin_path, tmp_path):
    proc = _cli(plugin_path, tmp_path, "list", "methods", "--json")
    assert proc.returncode == 0, proc.stderr
    rows = {row["name"]: row for row in json.loads(proc.stdout)}
    assert set(builtin_names(METHODS)) <= set(rows)
    # Module entry point: the module's @register_method decorator ran.
    assert rows["demo-local"]["origin"] == "hflb_demo_plugin"
    assert rows["demo-local"]["fidelity"] == "reconstructed"
    assert rows["demo-local"]["description"].startswith("Demo plugin")
    # Object entry point: registered under the entry point's name.
    assert "obj-method" in rows
    assert rows["obj-method"]["origin"] == "entry point hflb_demo_plugin2:ObjMethod"
    assert "ObjMethod" not in rows


@pytest.mark.slow  # the CLI as a process
def test_plugin_method_runs_end_to_end(plugin_path, tmp_path):
    out = tmp_path / "runs"
    proc = _cli(plugin_path, tmp_path, "run", "--method", "demo-local", "--task", "digits", "--clients", "3",
                "--rounds", "1", "--out", str(out), "--json", "-q")
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["status"] == "ok"
    path = Path(summary["record"])
    assert path.parent == out and path.is_file()
    record = json.loads(path.read_text())
    assert record["method"]["name"] == "demo-local"
    assert record["method"]["fidelity"] == "reconstructed"
    assert record["method"]["plugin_dist"] == "hflb-demo-plugin"
    assert record["config"]["method"] == "demo-local"
    assert [h["round"] for h in record["history"]] == [0, 1]
    assert record["cost"]["bytes_total"] == 0


@pytest.fixture
def obj_plugin_registry(tmp_path, monkeypatch):
    """A fresh method registry discovering the object-entry-point plugin in this process."""
    import hfl_bench.method_api

    METHODS.discover()  # the global registry must not pick the plugin up
    root = tmp_path / "site"
    write_dist(root, "hflb_demo_plugin2", "hflb-demo-plugin2", OBJ_PLUGIN_MODULE,
                "[hfl_bench.methods]\nobj-method = hflb_demo_plugin2:ObjMethod\n")
    monkeypatch.syspath_prepend(str(root))
    importlib.invalidate_caches()
    fresh = Registry("method", "hfl_bench.methods")
    fresh.validate = hfl_bench.method_api.check_method_class
    monkeypatch.setattr(hfl_bench.method_api, "METHODS", fresh)
    yield fresh
    sys.modules.pop("hflb_demo_plugin2", None)


def test_object_entry_point_registered_in_fresh_registry(obj_plugin_registry):
    cls = obj_plugin_registry.get("obj-method")
    assert cls.__name__ == "ObjMethod"
    assert obj_plugin_registry.origin("obj-method") == "entry point hflb_demo_plugin2:ObjMethod"
    # Built-in modules were imported long ago and registered into the global registry: a fresh
    # registry only gains what entry points name as objects (this one, and any other installed
    # plugin's object entry points).
    assert "obj-method" in obj_plugin_registry.names()
    assert builtin_names(obj_plugin_registry) == []


def test_object_entry_point_record_names_the_method(obj_plugin_registry, tiny_cfg, tmp_path):
    from hfl_bench import engine
    from hfl_bench import recording as records

    cfg = tiny_cfg(method="obj-method", clients=3, rounds=1, out=str(tmp_path / "runs"))
    _, cfg = engine.load_task(cfg)
    result = engine.run(cfg)
    record = records.build_record(cfg, result)
    assert record["status"] == "ok"
    assert record["method"]["name"] == "obj-method"
