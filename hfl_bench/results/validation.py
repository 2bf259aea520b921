"""Checking record files against the record JSON Schema (needs the optional ``jsonschema``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable

from hfl_bench.results.records import load_schema


def schema_validator():
    """A Draft 2020-12 validator of the record schema; ImportError without jsonschema."""
    import jsonschema

    return jsonschema.Draft202012Validator(load_schema())


def file_errors(path: Path, validator) -> list[str]:
    """Each schema error of one file as ``<json path>: <message>``; [] for a valid record."""
    try:
        record = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        return [f"not readable JSON: {e}"]
    errors = sorted(validator.iter_errors(record), key=lambda e: list(e.absolute_path))
    return [f"{'/'.join(map(str, e.absolute_path)) or '(record)'}: {e.message}" for e in errors]


def invalid_files(files: Iterable[Path], validator) -> dict[str, list[str]]:
    """The files with schema errors, each with its errors."""
    problems = {str(f): file_errors(f, validator) for f in files}
    return {f: errs for f, errs in problems.items() if errs}
