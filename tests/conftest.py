import os
from pathlib import Path

from hypothesis import settings

# Vendored (licenses in NOTICE): the tests need no ../shared.
DATA = Path(__file__).resolve().parent / "data"
PERF_DB = DATA / "splitwise_perf_model.csv"

# CI (CI=true) draws the same examples every run, so a landing never hangs on a new random
# draw; local runs keep exploring (hypothesis' default), and what they find becomes a test.
settings.register_profile("ci", derandomize=True)
if os.environ.get("CI"):
    settings.load_profile("ci")
