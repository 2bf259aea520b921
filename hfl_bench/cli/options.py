"""How commands declare their options and how ``--help`` shows them.

A run setting's option is made from its ``RunConfig`` field (``with_settings``): the help text,
the default, the type and the flag names live once, in ``hfl_bench.config``, and ``run``,
``partition`` and a config file's keys cannot drift apart. ``BenchCommand`` and
``BenchGroup`` are the command classes every command is registered with.
"""

from __future__ import annotations

import inspect
import typing
from pathlib import Path
from typing import Any, Callable, Optional

import typer
from rich.markup import escape
from typer.core import TyperCommand, TyperGroup

from hfl_bench.config import FIELDS, RunConfig, type_hints

# The RunConfig fields offered on the command line, in the field order (``--help`` keeps it).
CLI_SETTINGS = tuple(name for name, f in FIELDS.items() if f.metadata.get("flags") is not None)


def flag_names(name: str) -> tuple[str, ...]:
    """The option names of the setting ``name``: its declared flags, else ``--name-with-dashes``."""
    return FIELDS[name].metadata["flags"] or (_dashed(name),)


def _dashed(name: str) -> str:
    return f"--{name.replace('_', '-')}"


def config_help() -> str:
    """The --config option's help: a config file's keys are the settings' field names."""
    renamed = [f"{name} for {flag_names(name)[0]}" for name in CLI_SETTINGS
               if flag_names(name)[0] != _dashed(name)]
    file_only = [name for name in FIELDS if name not in CLI_SETTINGS]
    return (f"YAML file of run settings, keyed by the options' names with underscores ({', '.join(renamed)}), "
            f"also {', '.join(file_only)}; an option given overrides it.")


def option_help(name: str) -> str:
    """The setting's help text as the option shows it: rich help reads markup, so ``[1,3]`` and
    ``[@STRENGTH]`` are escaped to show as themselves."""
    return escape(FIELDS[name].metadata["help"])


def setting_parameter(name: str) -> inspect.Parameter:
    """The ``typer.Option`` parameter of one RunConfig field: its type (a path for path settings),
    its default (shown in ``--help`` unless None), its flags and its help text."""
    field = FIELDS[name]
    hint = type_hints(RunConfig)[name]
    args = typing.get_args(hint)
    optional = type(None) in args
    value_type = next(a for a in args if a is not type(None)) if optional else hint
    if field.metadata["path"]:
        value_type = Path
    option = typer.Option(field.default, *flag_names(name), help=option_help(name))
    return inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=option,
                             annotation=Optional[value_type] if optional else value_type)


def with_settings(names: tuple[str, ...]) -> Callable[[Callable], Callable]:
    """Give a command one option per named RunConfig field, ahead of its own options; it takes
    them as ``**settings`` (and, to tell which were given, ``ctx: typer.Context`` first). Typer
    reads the options from the signature this sets."""
    unknown = sorted(set(names) - set(CLI_SETTINGS))
    if unknown:
        raise ValueError(f"not command-line settings: {', '.join(unknown)}")

    def decorate(command: Callable) -> Callable:
        hints = typing.get_type_hints(command)
        own = [p.replace(annotation=hints.get(p.name, p.annotation))
               for p in inspect.signature(command).parameters.values() if p.kind is not p.VAR_KEYWORD]
        context = own[:1] if own and own[0].annotation is typer.Context else []
        options = own[len(context):]
        params = [*context, *(setting_parameter(n) for n in names), *options]
        command.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
        return command

    return decorate


def given_settings(ctx: typer.Context, settings: dict[str, Any]) -> dict[str, Any]:
    """The settings given on the command line (the others are at their defaults and must not
    override a config file), as RunConfig holds them (a path as a string)."""
    return as_config_values({name: value for name, value in settings.items() if _from_command_line(ctx, name)})


def as_config_values(settings: dict[str, Any]) -> dict[str, Any]:
    """Every setting, as RunConfig holds it (a path as a string)."""
    return {name: str(value) if isinstance(value, Path) else value for name, value in settings.items()}


def _from_command_line(ctx: typer.Context, name: str) -> bool:
    # By the source's name: ParameterSource is click's, and newer Typers carry their own click.
    return getattr(ctx.get_parameter_source(name), "name", None) == "COMMANDLINE"


class _FlagsShowNoType:
    """A flag takes no value, so ``--help`` shows no type for it (Typer 0.2x shows ``<bool>``)."""

    def get_params(self, ctx: Any) -> list:
        params = super().get_params(ctx)  # type: ignore[misc]
        for param in params:
            if getattr(param, "is_flag", False) and param.metavar is None:
                param.metavar = ""  # shown in the type column; a flag's metavar is used nowhere else
        return params


class _OneValuePerOption:
    """Click keeps the last of an option given twice (``--faults a --faults b`` runs ``b``) without a
    word; a benchmark run must be what its command line says, so a value option given more than once
    is refused in one line (exit 2). Repeatable options (``--set``, ``--task`` of ``plot``) and flags
    are not affected."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        try:
            _, _, order = self.make_parser(ctx).parse_args(args=list(args))  # type: ignore[attr-defined]
        except Exception:  # noqa: BLE001 - a malformed command line: the real parse below reports it
            order = []
        seen: set[str] = set()
        for param in order:
            if getattr(param, "multiple", True) or getattr(param, "is_flag", True) or getattr(param, "count", False):
                continue
            if param.name in seen:
                from hfl_bench.cli.output import fail

                fail(f"{max(param.opts, key=len)} is given more than once: give it once")
            seen.add(param.name)
        return super().parse_args(ctx, args)  # type: ignore[misc]


class BenchCommand(_OneValuePerOption, _FlagsShowNoType, TyperCommand):
    """Typer's command with the suite's two rules: flags shown without a type, and a value option
    given at most once (``app.command(cls=BenchCommand)``)."""


class BenchGroup(_FlagsShowNoType, TyperGroup):
    """Typer's group of commands, its flags shown without a type (``typer.Typer(cls=BenchGroup)``)."""

