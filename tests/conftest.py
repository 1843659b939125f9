from pathlib import Path

# Vendored (licenses in NOTICE): the tests need no ../shared.
DATA = Path(__file__).resolve().parent / "data"
PERF_DB = DATA / "splitwise_perf_model.csv"
