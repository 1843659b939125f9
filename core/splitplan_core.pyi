# The compiled engine core's interface (core/splitplan_core.pyx), for mypy.
from typing import Any

import numpy as np

SOURCE_SHA256: str
FIELDS: tuple[str, ...]
ROLES: tuple[str, ...]
# per-request integer rows
NEXT: int
PREV: int
AFTER: int
FINISH_ITER: int
DEFERRED_AT: int
DEFERRED_TO: int
PLEN: int
BASE: int
DONE: int
RESUMED: int
JOIN_ITER: int
P_INST: int
T_INST: int
REJECTED: int
REFUSED: int
CACHED: int
LOOKED: int
PINNED: int
PREFIX_NODE: int
REQUEST_ROWS: int
# per-request float rows
TTFT: int
E2E: int
STALL: int
PREEMPTED_AT: int
REJOINED: int
PREFILL_START: int
KV_READY: int
JOIN_TIME: int
TIME_ROWS: int
# per-instance integer columns
QUEUE: int
WAITING: int
DEFERRED: int
RUN: int
MEMBERS_HEAD: int
MEMBERS_TAIL: int
BATCH: int
CTX: int
KV_USED: int
KV_COMMITTED: int
ITERS: int
RUNNING: int
FIXED: int
LAUNCH: int
NEXT_FINISH: int
ROLE: int
POOL: int
P_POS: int
T_POS: int
NODE: int
INSTANCE_COLUMNS: int
# per-instance float columns
PREFILL_S: int
DECODE_S: int
INTEGRAL: int
LINK_FREE: int
HOST_FREE: int
CLOCK_COLUMNS: int
# per-pool settings, run-wide settings, counters
KV_CAP: int
MAX_REQUEST: int
CHUNKED: int
DEFERRING: int
LAYERWISE_MIN: int
MEASURED: int
LINK_BPS: int
KV_LATENCY_S: int
CPU_TOKENS: int
LOAD_S_PER_TOKEN: int
MIXED_FACTOR: int
TOKENS_LO: int
TOKENS_HI: int
BATCH_LO: int
BATCH_HI: int
CONTEXT_LO: int
CONTEXT_HI: int
PREFILL_QUERIES: int
PREFILL_OUTSIDE: int
DECODE_QUERIES: int
DECODE_OUTSIDE: int
MEASURED_COUNTS: int
MAX_BATCH_TOKENS: int
CAP: int
MAX_ITERATIONS: int
CONTEXT: int
LAYERS: int
ROUND_ROBIN: int
CLOSED: int
LOG: int
CACHING: int
BLOCK: int
PREFIX_AWARE: int
RECORD: int
BORROW: int
SETTINGS: int
ITERATIONS: int
TOKENS_OUT: int
PREEMPTIONS: int
EVENTS: int
ENDS: int
SEQ: int
TURN_P: int
TURN_T: int
RELEASED: int
LOGGED: int
RECORDED: int
COUNTERS: int
# events (sim.types.Event's values), roles and statuses
ARRIVAL: int
KV_ARRIVED: int
ITERATION_END: int
PREFIX_LOADED: int
PROMPT: int
TOKEN: int
MIXED: int
OK: int
TOO_MANY_ITERATIONS: int
BATCH_PAST_TABLE: int

def pass_shares(c: np.ndarray, prefill_seqs: float, decode_seqs: float, has_prefill: float) -> tuple[float, float]: ...
def pass_terms(c: np.ndarray, prefill_seqs: float, prefill_tokens: float, prefill_sq_tokens: float, decode_seqs: float,
               decode_context_tokens: float) -> tuple[float, float, float, float, float, float]: ...
def pass_time_s(c: np.ndarray, prefill_seqs: float, prefill_tokens: float, prefill_sq_tokens: float, decode_seqs: float,
                decode_context_tokens: float) -> float: ...
def pass_terms_array(c: np.ndarray, prefill_seqs: np.ndarray, prefill_tokens: np.ndarray, prefill_sq_tokens: np.ndarray,
                     decode_seqs: np.ndarray, decode_context_tokens: np.ndarray) -> np.ndarray: ...
def pass_shares_array(c: np.ndarray, prefill_seqs: np.ndarray, decode_seqs: np.ndarray, has_prefill: float) -> np.ndarray: ...
def prompt_replay(arrival_s: np.ndarray, tokens: np.ndarray, vectors: np.ndarray, kind: np.ndarray, decode: np.ndarray,
                  max_batch_tokens: int, chunked: bool, cap: int, deferring: bool, release_s: np.ndarray,
                  heap_past: int, prefix: tuple | None = None, measured: tuple | None = None) -> tuple: ...
def ranks(sorted_values: np.ndarray, queries: np.ndarray, order: np.ndarray, right: bool) -> np.ndarray: ...
def running_peak(times: np.ndarray, weights: np.ndarray, order: np.ndarray) -> float: ...
def initial_state(prompt: np.ndarray, cached: Any, prefix_node: Any, roles: list[str], pool: list[int], p_pos: list[int],
                  t_pos: list[int], node: list[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]: ...
def run(arrival: np.ndarray, front_s: float, prompt: np.ndarray, out: np.ndarray, req: np.ndarray, times: np.ndarray,
        inst: np.ndarray, pools: np.ndarray, pools_s: np.ndarray, local_bps: np.ndarray, settings: np.ndarray, kv_bytes: float,
        vectors: np.ndarray, lines: np.ndarray, single: np.ndarray, measured: np.ndarray,
        tree: tuple | None) -> tuple[int, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, list,
                                     np.ndarray, np.ndarray]: ...

class PrefixCache:
    def __init__(self, parent: np.ndarray, tokens: np.ndarray, depth: np.ndarray, block_tokens: int = 1,
                 cpu_tokens: float = 0.0) -> None: ...
    def insert(self, node: int, now: float) -> None: ...
    def match(self, node: int, prompt_tokens: int) -> tuple[int, int]: ...
    def peek(self, node: int, prompt_tokens: int) -> int: ...
    def resident(self, node: int, prompt_tokens: int) -> int: ...
    def pin(self, node: int) -> None: ...
    def unpin(self, node: int, now: float) -> None: ...
    def evict(self, limit_tokens: int) -> None: ...
    def state(self) -> tuple: ...
