import os
from pathlib import Path

import pytest
from hypothesis import settings

# Vendored (licenses in NOTICE): the tests need no ../shared.
DATA = Path(__file__).resolve().parent / "data"
PERF_DB = DATA / "splitwise_perf_model.csv"

# CI (CI=true) draws the same examples every run, so a landing never hangs on a new random
# draw; local runs keep exploring (hypothesis' default), and what they find becomes a test.
settings.register_profile("ci", derandomize=True)
if os.environ.get("CI"):
    settings.load_profile("ci")


@pytest.fixture(autouse=True)
def _shipped_catalog_after_each_test():
    """A CLI run with --catalog leaves its folders set in the process (the next CLI run resets
    them); a later test that calls the library directly must not look there."""
    yield
    from splitplan.specs.catalog import set_user_catalogs, unpin_all
    set_user_catalogs([])
    unpin_all()
