"""Where the catalogs live, and name-or-path resolution with suggestions.

A catalog kind (`hardware_specs`, `model_specs`, `engine_profiles`, `slo_profiles`,
`designs`) is searched in the user's catalog folders first, then in the shipped one. A user
folder has the shipped layout (`DIR/hardware_specs/my-gpu.yaml`, ...) and comes from
`--catalog DIR` and the `SPLITPLAN_PATH` environment variable (folders separated by the OS path
separator, `:` on Linux), in that order; a user entry with a shipped entry's name takes its place.
Specs a plan carries (plan_document) are used in place of entries of the same names.

A `Catalog` is a value: its folders and the plan's specs. The loaders read the one in effect
(`current()`: the one a block made active, else the folders of SPLITPLAN_PATH), each caching
what it loaded per catalog; nothing is set process-wide.
"""

from __future__ import annotations

import difflib
import functools
import json
import os
import stat
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path

from pydantic import BaseModel

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


@dataclass(frozen=True)
class Catalog:
    """Where specs come from: user folders searched in order before the shipped ones, and the
    specs a plan carries (`pins`: kind, name, the spec as JSON, where it comes from), used in
    place of entries of the same names. Made by `Catalog.of` and `with_pins`; in effect inside
    `with catalog.active():`."""

    folders: tuple[Path, ...] = ()
    pins: tuple[tuple[str, str, str, str], ...] = ()

    @classmethod
    def of(cls, folders: Sequence[str | Path] = ()) -> Catalog:
        """`folders` (`--catalog`), then SPLITPLAN_PATH's."""
        for d in folders:
            if not Path(d).is_dir():
                raise SpecError(f"--catalog {d}: not a folder; give a folder holding hardware_specs/, model_specs/, ...")
        return cls(tuple(Path(d) for d in folders) + _env_folders(os.environ.get("SPLITPLAN_PATH", "")))

    def with_pins(self, held: Sequence[tuple[str, str, dict, str]]) -> Catalog:
        """This catalog with specs (kind, name, spec, origin) used in place of its entries."""
        kept = {(k, n): (k, n, j, o) for k, n, j, o in self.pins}
        kept.update({(k, n): (k, n, json.dumps(spec, sort_keys=True), o) for k, n, spec, o in held})
        return replace(self, pins=tuple(kept.values()))

    def search_dirs(self, kind: str) -> list[Path]:
        """Where entries of `kind` are looked up, first match wins."""
        return [d / kind for d in self.folders if _is_dir(d / kind)] + [data_dir(kind)]

    def pinned(self, kind: str, name: str) -> tuple[dict, str] | None:
        """A plan's copy of the `kind` entry `name` (its spec, where it comes from), or None."""
        return next(((json.loads(spec), origin) for k, n, spec, origin in self.pins if (k, n) == (kind, name)), None)

    def names(self, kind: str) -> list[str]:
        return sorted({p.stem for folder in self.search_dirs(kind) for p in _entries(folder)}
                      | {n for k, n, _, _ in self.pins if k == kind})

    @contextmanager
    def active(self) -> Iterator[Catalog]:
        """This catalog in effect inside the block (in this thread or task), the one before after it."""
        token = _CURRENT.set(self)
        try:
            yield self
        finally:
            _CURRENT.reset(token)


_CURRENT: ContextVar[Catalog | None] = ContextVar("splitplan_catalog", default=None)


@functools.lru_cache(maxsize=8)
def _env_folders(value: str) -> tuple[Path, ...]:
    return tuple(Path(d) for d in value.split(os.pathsep) if d)


@functools.lru_cache(maxsize=8)
def _default(value: str) -> Catalog:
    return Catalog(_env_folders(value))


def current() -> Catalog:
    """The catalog in effect: the one made active, else SPLITPLAN_PATH's folders and the shipped ones."""
    active = _CURRENT.get()
    return active if active is not None else _default(os.environ.get("SPLITPLAN_PATH", ""))


def per_catalog(maxsize: int) -> Callable:
    """A loader of specs by name or path, cached per catalog in effect (the name resolves to
    another entry in another catalog); a spec already loaded is taken as it is."""
    def wrap(load: Callable) -> Callable:
        cached = functools.lru_cache(maxsize)(lambda catalog, name: load(name))

        @functools.wraps(load)
        def loader(name_or_path):
            if isinstance(name_or_path, BaseModel):  # (a spec, loaded)
                return name_or_path
            return cached(current(), name_or_path)
        return loader
    return wrap


def activate(catalog: Catalog) -> None:
    """`catalog` in effect until the innermost `active()` block around this call ends (where
    that block began, the catalog before it is restored); the CLI runs each command in one."""
    _CURRENT.set(catalog)


def search_dirs(kind: str) -> list[Path]:
    """Where entries of `kind` are looked up in the catalog in effect."""
    return current().search_dirs(kind)


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
    return current().names(kind)


def is_path(name_or_path: str) -> bool:
    """Whether a spec argument names a file (it has a spec suffix or a folder) rather than a
    catalog entry."""
    path = Path(name_or_path)
    return path.suffix in _SUFFIXES or path.parent != Path(".")


def pinned(kind: str, name: str) -> tuple[dict, str] | None:
    """A plan's copy of an entry in the catalog in effect (Catalog.pinned)."""
    return current().pinned(kind, name)


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
