"""splitplan's engine core (core/splitplan_core.pyx), compiled when the package is installed: the
one place the package imports it, so that a checkout run without an install says what to do."""

try:
    import splitplan_core as core
except ModuleNotFoundError as exc:
    if exc.name != "splitplan_core":
        raise
    raise ModuleNotFoundError("splitplan's engine core (the module splitplan_core) is not built: install splitplan "
                              "with `pip install .` (or `pip install -e .` in a checkout), which compiles it",
                              name="splitplan_core") from None

__all__ = ["core"]
