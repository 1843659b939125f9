"""One loader for every spec file: YAML or JSON in, a frozen pydantic model out.

Errors become one `SpecError` line naming the file and the key, with a
"did you mean" for misspelt keys.
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from splitplan.base.errors import SpecError
from splitplan.base.inputs import excerpt, key_text, parse_document, read_text
from splitplan.base.limits import MAX_SPEC_BYTES
from splitplan.specs.catalog import is_path, pinned, resolve

M = TypeVar("M", bound=BaseModel)


def read_mapping(path: Path) -> dict[str, Any]:
    """A spec file's top-level mapping, read within the bounds of `splitplan.base.inputs`."""
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
        return f"unknown key {key_text(key)}{hint}"
    if err["type"] == "missing":
        return f"missing key '{key}'; add it"
    more = f" (and {exc.error_count() - 1} more problem(s))" if exc.error_count() > 1 else ""
    message = err["msg"].removeprefix("Value error, ")
    return f"key '{key}': {message}{more}" if loc else f"{message}{more}"


def load_spec(model: type[M], path: Path, data: dict[str, Any] | None = None) -> M:
    raw = read_mapping(path) if data is None else data
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        raise SpecError(f"{path}: {validation_message(model, exc)}") from None


def load_named(model: type[M], kind: str, name_or_path: str, what: str) -> tuple[M, Path]:
    """A spec a plan carries (Catalog.pinned), a catalog entry (by name, from the `kind` folder;
    its `name`, where written, is its file's) or a user file (by path, named after its file
    unless it names itself); returns the spec and its path."""
    held = pinned(kind, name_or_path)
    if held is not None:
        return load_spec(model, Path(held[1]), dict(held[0])), Path(held[1])
    path, data = read_entry(kind, name_or_path, what)
    of_kind(model, path, data, what)
    return load_spec(model, path, data), path


def read_entry(kind: str, name_or_path: str, what: str) -> tuple[Path, dict[str, Any]]:
    """The path and mapping of a catalog entry or user file, named (see load_named)."""
    path = resolve(kind, name_or_path, what)
    data = read_mapping(path)
    if not is_path(name_or_path) and "name" in data and data["name"] != path.stem:
        raise SpecError(f"{path}: names itself '{excerpt(data['name'])}', but a catalog entry is named after its file "
                        f"('{excerpt(path.stem)}'): rename the file or the name")
    data.setdefault("name", path.stem)
    return path, data


def of_kind(model: type[BaseModel], path: Path, data: dict[str, Any], what: str) -> None:
    """SpecError, showing nothing of the file, when no key of `data` is one a `what` spec has, or
    close to one (a misspelt spec is still a spec): the file is something else (a system file,
    another kind of spec)."""
    fields = [k for k in model.model_fields if k != "name"]
    keys = [str(k) for k in data if k != "name"]
    if not any(k in fields or difflib.get_close_matches(k, fields, n=1, cutoff=0.75) for k in keys):
        some = ", ".join([k for k in fields if model.model_fields[k].is_required()] or fields)
        article = "an" if what[0].lower() in "aeiou" or what.startswith("SLO") else "a"
        raise SpecError(f"{path}: not {article} {what} file: none of its keys is one of {excerpt(some, 100)}; "
                        "is this the right file?")
