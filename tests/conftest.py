from pathlib import Path

import pytest

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"
# Vendored (MIT, see NOTICE): the tests need no ../shared for measured latencies.
PERF_DB = Path(__file__).resolve().parent / "data" / "splitwise_perf_model.csv"


@pytest.fixture
def shared_data() -> Path:
    if not SHARED.is_dir():
        pytest.skip("../shared/data is not present")
    return SHARED
