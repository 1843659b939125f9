"""One loader for every spec file: YAML or JSON in, a frozen pydantic model out.

Errors become one `SpecError` line naming the file and the key, with a
"did you mean" for misspelt keys.
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from splitplan.errors import SpecError
from splitplan.inputs import excerpt, parse_document, read_text
from splitplan.limits import MAX_SPEC_BYTES
from splitplan.specs.catalog import resolve

M = TypeVar("M", bound=BaseModel)


def read_mapping(path: Path) -> dict[str, Any]:
    """A spec file's top-level mapping, read within the bounds of `splitplan.inputs`."""
    data = parse_document(read_text(path, MAX_SPEC_BYTES, "YAML or JSON spec"), path, as_json=path.suffix == ".json")
    if not isinstance(data, dict):
        raise SpecError(f"{path}: expected a mapping of keys to values at the top level")
    return data


def _known_keys(model: type[BaseModel], loc: tuple) -> list[str]:
    """Field names valid at `loc`'s parent, for "did you mean" suggestions."""
    current: Any = model
    for part in loc[:-1]:
        field = getattr(current, "model_fields", {}).get(part)
        if field is None:
            return list(getattr(current, "model_fields", {}))
        annotation = field.annotation
        args = getattr(annotation, "__args__", ())
        current = next((a for a in (annotation, *args) if isinstance(a, type) and issubclass(a, BaseModel)), None)
        if current is None:
            return []
    return list(getattr(current, "model_fields", {}))


def validation_message(model: type[BaseModel], exc: ValidationError) -> str:
    errors = exc.errors()
    # A misspelt key also shows up as a missing one: report the misspelling, it says more.
    err = next((e for e in errors if e["type"] == "extra_forbidden"), errors[0])
    loc = tuple(err["loc"])
    key = excerpt(".".join(str(p) for p in loc)) or "(top level)"
    if err["type"] == "extra_forbidden":
        close = difflib.get_close_matches(str(loc[-1]), _known_keys(model, loc), n=1, cutoff=0.6)
        hint = f"; did you mean '{close[0]}'?" if close else "; remove it"
        return f"unknown key '{key}'{hint}"
    if err["type"] == "missing":
        return f"missing key '{key}'; add it"
    more = f" (and {exc.error_count() - 1} more problem(s))" if exc.error_count() > 1 else ""
    return f"key '{key}': {err['msg']}{more}"


def load_spec(model: type[M], path: Path, data: dict[str, Any] | None = None) -> M:
    raw = read_mapping(path) if data is None else data
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        raise SpecError(f"{path}: {validation_message(model, exc)}") from None


def load_named(model: type[M], kind: str, name_or_path: str, what: str) -> tuple[M, Path]:
    """A catalog entry (by name, from the `kind` folder) or a user file (by path),
    named after its file unless it names itself; returns the spec and its path."""

    path = resolve(kind, name_or_path, what)
    data = read_mapping(path)
    data.setdefault("name", path.stem)
    return load_spec(model, path, data), path
