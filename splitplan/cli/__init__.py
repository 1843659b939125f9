"""The `splitplan` command: parse, make one library call, render. Thin by design.

One module per command group (catalog, optimize, simulate, studies, calibrate, export); `common`
holds the typer app, the option enums, error handling and progress."""

from splitplan.cli import calibrate, catalog, export, optimize, simulate, studies  # noqa: F401  (registers the commands)
from splitplan.cli.common import app, main

__all__ = ["app", "main"]
