"""Where the catalogs live, and name-or-path resolution with suggestions.

A catalog kind (`hardware_specs`, `model_specs`, `engine_profiles`, `slo_profiles`,
`designs`) is searched in the user's catalog folders first, then in the shipped one. A user
folder has the shipped layout (`DIR/hardware_specs/my-gpu.yaml`, ...) and comes from
`--catalog DIR` (set_user_catalogs) and the `SPLITPLAN_PATH` environment variable (folders
separated by the OS path separator, `:` on Linux), in that order; a user entry with a shipped
entry's name takes its place.
"""

from __future__ import annotations

import difflib
import os
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


_USER_DIRS: list[Path] = []  # from --catalog


def set_user_catalogs(dirs: list[str | Path]) -> None:
    """Catalog folders searched before SPLITPLAN_PATH's and the shipped ones (`--catalog`)."""
    for d in dirs:
        if not Path(d).is_dir():
            raise SpecError(f"--catalog {d}: not a folder; give a folder holding hardware_specs/, model_specs/, ...")
    _USER_DIRS[:] = [Path(d) for d in dirs]
    from splitplan.specs import design, engine, hardware, model, slo
    for loader in (hardware.load_hardware, model.load_model, engine.load_engine, slo.load_slo, design.load_designs):
        loader.cache_clear()


def search_dirs(kind: str) -> list[Path]:
    """Where entries of `kind` are looked up, first match wins."""
    env = [Path(d) for d in os.environ.get("SPLITPLAN_PATH", "").split(os.pathsep) if d]
    return [d / kind for d in _USER_DIRS + env if (d / kind).is_dir()] + [data_dir(kind)]


def catalog_names(kind: str) -> list[str]:
    return sorted({p.stem for folder in search_dirs(kind) for p in folder.iterdir() if p.suffix in _SUFFIXES})


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
    for folder in search_dirs(kind):
        for suffix in _SUFFIXES:
            candidate = folder / f"{name_or_path}{suffix}"
            if candidate.is_file():
                return candidate
    raise SpecError(f"unknown {what} '{name_or_path}': {suggest(name_or_path, catalog_names(kind))}")
