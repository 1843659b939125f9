"""Defaults named once: what a command or function uses when the user says nothing."""

DEFAULT_ENGINE = "vllm"  # vLLM v0.15.1 as measured (bench/fit_vllm.py)
CALIBRATION_START = "lean"  # calibrate --perf-db starts from the datasheet-only profile (single passes, no scheduler)
DEFAULT_MODEL = "llama2-70b"
DEFAULT_SLO = "chat"  # absolute limits in ms: needs no reference machine
STUDY_SLO = "splitwise"  # Splitwise's slowdown profile, the default of its provisioning study (compare)
MAX_BATCH_TOKENS = 2048  # prompt tokens per prefill batch (Splitwise's prompt machines)
SCHEMA_VERSION = 3  # of every JSON document; 3: plans carry their specs; 2: SLO targets are numbers with a unit (plans of 2 still read)
