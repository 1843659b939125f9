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
import stat
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from importlib import resources
from pathlib import Path

from splitplan.base.errors import SpecError
from splitplan.base.inputs import excerpt, printable

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


def set_user_catalogs(dirs: Sequence[str | Path]) -> None:
    """Catalog folders searched before SPLITPLAN_PATH's and the shipped ones (`--catalog`)."""
    for d in dirs:
        if not Path(d).is_dir():
            raise SpecError(f"--catalog {d}: not a folder; give a folder holding hardware_specs/, model_specs/, ...")
    _USER_DIRS[:] = [Path(d) for d in dirs]
    _clear_caches()


def _clear_caches() -> None:
    from splitplan.specs import design, engine, hardware, model, slo
    for loader in (hardware.load_hardware, model.load_model, engine.load_engine, slo.load_slo, design.load_designs):
        loader.cache_clear()


def search_dirs(kind: str) -> list[Path]:
    """Where entries of `kind` are looked up, first match wins."""
    env = [Path(d) for d in os.environ.get("SPLITPLAN_PATH", "").split(os.pathsep) if d]
    return [d / kind for d in _USER_DIRS + env if _is_dir(d / kind)] + [data_dir(kind)]


def _is_dir(folder: Path) -> bool:
    try:
        return folder.is_dir()
    except OSError as exc:  # (a folder that cannot be searched: an error naming it, not a skipped catalog)
        raise _folder_error(folder, "open", exc) from None


def _folder_error(folder: Path, verb: str, exc: OSError) -> SpecError:
    return SpecError(f"{printable(str(folder))}: cannot {verb} the catalog folder ({exc.strerror or exc}); "
                     "fix its permissions or remove it from --catalog / SPLITPLAN_PATH")


def _entries(folder: Path) -> list[Path]:
    """The spec files of a catalog folder; one that cannot be read (a link to a device, a FIFO, no
    permission, a dangling link) is an error naming it, never skipped."""
    try:
        paths = sorted(p for p in folder.iterdir() if p.suffix in _SUFFIXES)
    except OSError as exc:
        raise _folder_error(folder, "list", exc) from None
    for path in paths:
        _require_readable(path)
    return paths


def _require_readable(path: Path) -> None:
    try:
        mode = os.stat(path).st_mode
    except OSError as exc:
        raise SpecError(f"{printable(str(path))}: cannot read the catalog entry ({exc.strerror or exc}); "
                        "fix or remove it") from None
    if not stat.S_ISREG(mode):
        kind = "a folder" if stat.S_ISDIR(mode) else "not a regular file (a pipe, a device or a link to one)"
        raise SpecError(f"{printable(str(path))}: the catalog entry is {kind}; a catalog entry is a YAML or JSON file")
    if not os.access(path, os.R_OK):
        raise SpecError(f"{printable(str(path))}: cannot read the catalog entry (permission denied); fix or remove it")


def catalog_names(kind: str) -> list[str]:
    return sorted({p.stem for folder in search_dirs(kind) for p in _entries(folder)} | set(_PINNED.get(kind, {})))


def is_path(name_or_path: str) -> bool:
    """Whether a spec argument names a file (it has a spec suffix or a folder) rather than a
    catalog entry."""
    path = Path(name_or_path)
    return path.suffix in _SUFFIXES or path.parent != Path(".")


# Specs a plan carries (plan_document): (data, where they come from) by kind and name, used in
# place of the catalog's entries of those names while the plan is read.
_PINNED: dict[str, dict[str, tuple[dict, str]]] = {}


def pin(kind: str, name: str, data: dict, origin: str) -> None:
    _PINNED.setdefault(kind, {})[name] = (data, origin)
    _clear_caches()


def unpin_all() -> None:
    _PINNED.clear()
    _clear_caches()


def pinned(kind: str, name: str) -> tuple[dict, str] | None:
    return _PINNED.get(kind, {}).get(name)


@contextmanager
def pins_held() -> Iterator[None]:
    """Specs pinned inside the block (a plan read there) hold until it ends; then the pins are
    those before it, so a library call that reads a plan leaves the catalog as it found it."""
    saved = {kind: dict(names) for kind, names in _PINNED.items()}
    try:
        yield
    finally:
        _PINNED.clear()
        _PINNED.update(saved)
        _clear_caches()


def suggest(name: str, choices: list[str]) -> str:
    close = difflib.get_close_matches(name, choices, n=3, cutoff=0.5)
    if close:
        return f"did you mean {', '.join(repr(excerpt(c)) for c in close)}?"
    shown = ", ".join(excerpt(c) for c in choices[:12])
    return f"choose one of: {shown}" + (f" ({len(choices) - 12} more in the catalog)" if len(choices) > 12 else "")


def resolve(kind: str, name_or_path: str, what: str) -> Path:
    """A catalog entry by name, or a user file by path."""
    path = Path(name_or_path)
    if is_path(name_or_path):
        if not path.exists():
            raise SpecError(f"{what} file {printable(name_or_path)} does not exist")
        if path.is_dir():
            raise SpecError(f"{what} file {printable(name_or_path)} is a directory; pass a YAML or JSON file")
        return path
    for folder in search_dirs(kind):
        for suffix in _SUFFIXES:
            candidate = folder / f"{name_or_path}{suffix}"
            if os.path.lexists(candidate):  # (a link to a device is this entry, refused, not skipped)
                _require_readable(candidate)
                return candidate
    raise SpecError(f"unknown {what} '{excerpt(name_or_path)}': {suggest(name_or_path, catalog_names(kind))}")
