"""The error family. Messages name the file, line or key and say what to do.

The CLI maps `SplitplanError` subclasses to exit codes: 2 for bad input, 3 for an
infeasible request. Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations


class SplitplanError(Exception):
    """Base of every error a user can cause; `exit_code` is what the CLI returns."""

    exit_code = 2
    details = ""  # the whole story behind a short message (`--debug` prints it; with_details sets it)


class SpecError(SplitplanError):
    """A hardware, model, engine or SLO spec (or a CLI value naming one) is wrong."""


class TraceError(SplitplanError):
    """A request trace cannot be read or holds invalid rows."""


class InfeasibleError(SplitplanError):
    """The request cannot be met by any hardware in reach (exit code 3)."""

    exit_code = 3


class SolverError(SplitplanError):
    """The ILP solver failed for a reason other than infeasibility."""

    exit_code = 3


class InputWarning(UserWarning):
    """Input that reads but is likely not what the user meant (a trace whose times look like
    milliseconds read as seconds): the library warns, the CLI prints one `warning: ...` line."""


def listed(items: list[str], hint: str = "--debug lists them all") -> tuple[str, str]:
    """A list in a one-line message: its first item (the closest candidate, when sorted so) and a
    count of the rest; and the whole list, for `SplitplanError.details` (--debug prints it)."""
    unique = list(dict.fromkeys(items))
    short = unique[0] if unique else "none"
    if len(unique) > 1:
        short += f"; and {len(unique) - 1} more ({hint})"
    return short, "\n".join(unique)


def with_details(exc: SplitplanError, details: str) -> SplitplanError:
    exc.details = details
    return exc
