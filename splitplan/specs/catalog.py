"""Where the shipped catalogs live, and name-or-path resolution with suggestions."""

from __future__ import annotations

import difflib
from importlib import resources
from pathlib import Path

from splitplan.errors import SpecError

_SUFFIXES = (".yaml", ".yml", ".json")


def data_dir(kind: str) -> Path:
    """The folder of a shipped catalog (`hardware_specs`, `model_specs`, ...).

    Installed wheels carry the catalogs under `splitplan/_data/`; a source checkout
    has them at the repository top level.
    """
    packaged = Path(str(resources.files("splitplan"))) / "_data" / kind
    if packaged.is_dir():
        return packaged
    return Path(__file__).resolve().parents[2] / kind


def catalog_names(kind: str) -> list[str]:
    folder = data_dir(kind)
    return sorted(p.stem for p in folder.iterdir() if p.suffix in _SUFFIXES)


def suggest(name: str, choices: list[str]) -> str:
    close = difflib.get_close_matches(name, choices, n=3, cutoff=0.5)
    if close:
        return f"did you mean {', '.join(repr(c) for c in close)}?"
    return f"choose one of: {', '.join(choices)}"


def resolve(kind: str, name_or_path: str, what: str) -> Path:
    """A catalog entry by name, or a user file by path."""
    path = Path(name_or_path)
    if path.suffix in _SUFFIXES or path.parent != Path("."):
        if not path.exists():
            raise SpecError(f"{what} file {name_or_path} does not exist")
        if path.is_dir():
            raise SpecError(f"{what} file {name_or_path} is a directory; pass a YAML or JSON file")
        return path
    folder = data_dir(kind)
    for suffix in _SUFFIXES:
        candidate = folder / f"{name_or_path}{suffix}"
        if candidate.is_file():
            return candidate
    raise SpecError(f"unknown {what} '{name_or_path}': {suggest(name_or_path, catalog_names(kind))}")
