"""Every bound on what a user may hand splitplan, in one place (docs/robustness.md).

A value outside its bound is bad input (exit 2) with a message naming the option, file or line,
never a wrap-around, a traceback or a read until memory runs out. The bounds are far beyond any
real deployment or trace, so they only catch mistakes (a unit off by 10^9, a pasted file)."""

from __future__ import annotations

# Files read whole: specs (hardware, model, engine, SLO, designs) and plan.json, at most 1 MiB
# (a Hugging Face config.json is a few KB; the worst 1 MiB YAML parses in about 3 s); a --perf-db
# or --deployments CSV, at most 64 MiB (aiconfigurator's 5,221 deployments are 2 MB).
MAX_SPEC_BYTES = 1 << 20
MAX_TABLE_BYTES = 64 << 20
# Nesting of a YAML or JSON document (a spec is at most 4 deep).
MAX_NESTING = 32
# How much of a user's text (a cell, a key, a value) an error message shows.
EXCERPT_CHARS = 60

# Traces: read in blocks of whole lines of at most TRACE_BLOCK_BYTES (memory stays bounded
# whatever the row count; a longer line is refused), at most MAX_TRACE_REQUESTS rows (arrays
# of 24 bytes a request: 0.5 GB), a span of at most MAX_TRACE_SPAN_S.
TRACE_BLOCK_BYTES = 16 << 20
MAX_TRACE_REQUESTS = 20_000_000
MAX_TRACE_SPAN_S = 366 * 86400.0
# Tokens of one request (prompt or output): the longest context of any public model is 10M.
MAX_REQUEST_TOKENS = 10_000_000

# Option values.
MAX_RATE_RPS = 1e5
MAX_DURATION_S = 30 * 86400.0
MAX_MACHINES = 100_000  # in one pool, a plan or an availability limit (a 100k-GPU site is 12,500 machines)
MAX_PLAN_POOLS = 256  # pools of one role in a plan.json (a catalog of 10 machine types in 4 layouts has 40)
MAX_LAUNCH_WORKERS = 4096  # workers launch.sh and docker-compose.yaml list one by one (Dynamo and llm-d count replicas)
MAX_BATCH = 100_000  # requests in one `perf` batch
MAX_RATES = 1_000  # rates in one sweep
MAX_JOBS = 1_024
MAX_CONCURRENCY = 100_000  # clients of a closed loop (simulate: 100,000 clients of 10 requests take 16 s, 1 GB)
MAX_GENERATED_REQUESTS = 20_000_000  # a resample's rate x duration
MAX_CLOSED_LOOP_REQUESTS = 1_000_000  # a closed loop's requests (as simulate's --max-requests default)
MAX_HEADROOM_PCT = 1_000.0  # optimize --headroom: a plan for 11 times the trace's load
MAX_SPARE_INSTANCES = 64  # optimize --spare: instances per pool beyond the load's need
# A simulation's decode iterations over all its instances (each one output token of each running
# request): 20M take about a minute and 0.2 GB of iteration times (bench/adversarial.py).
MAX_SIM_ITERATIONS = 20_000_000
