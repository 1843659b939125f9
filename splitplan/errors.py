"""The error family. Messages name the file, line or key and say what to do.

The CLI maps `SplitplanError` subclasses to exit codes: 2 for bad input, 3 for an
infeasible request. Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations


class SplitplanError(Exception):
    """Base of every error a user can cause; `exit_code` is what the CLI returns."""

    exit_code = 2


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
