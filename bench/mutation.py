"""Mutation testing of the model's core: do the tests notice when the code is broken?

    python bench/mutation.py [--sample N] [--seed S] [--named-only | --sampled-only] [--only TEXT|TEXT...] [--timeout SECONDS]

Two sets of mutants, each applied to a scratch copy of the repository (never to this
checkout) and judged by the core tests (tests/capacity, tests/search, tests/sim,
tests/perf; `pytest -x`): a mutant is killed when a test fails or the run times out.

- Named: the one-line breakages a code review found surviving the suite (issue 14), each
  spelled out below, and the input guards of issue 16 (judged by tests/test_hardening.py and
  tests/workload), and the plan, export, catalog and bound guards of issue 26 (judged by
  tests/test_plan_document.py, tests/test_hostile_inputs.py, tests/export, tests/test_robustness.py),
  and those of issues 27 and 28 (judged by the tests written for them). Every one must be killed.
- Sampled: `--sample` mutants drawn with `--seed` from every operator swap (+ -, * /,
  < <=, > >=, == !=, and or), constant change (n -> n + 1, 0 <-> 1, True <-> False) and
  dropped `not` in splitplan/capacity, search, sim and perf, written back with ast.unparse.
  The score (killed / sampled) estimates the suite's mutation score for those packages.
  Some mutants are equivalent (no behaviour changes) and count as survivors, so the
  estimate is a lower bound.

The same packages are configured for mutmut in pyproject.toml ([tool.mutmut]) for a full
run where hours are available. About 30 s per mutant on 2 cores.
"""

from __future__ import annotations

import argparse
import ast
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ["splitplan/capacity", "splitplan/search", "splitplan/sim", "splitplan/perf"]
TESTS = ["tests/capacity", "tests/search", "tests/sim", "tests/perf"]

# (name, file, original text, mutated text): each original occurs exactly once in its file.
NAMED = [
    ("KV-memory peak in capacity sizing set to 0", "splitplan/capacity/pools.py",
     "peak = core.running_peak(times, weights, np.argsort(times)) / instances", "peak = 0.0"),
    ("KV transfer dropped from predicted TBT", "splitplan/search/evaluation.py",
     "decode_s = transfer + np.maximum(o - 1, 0) * result.step_s", "decode_s = np.maximum(o - 1, 0) * result.step_s"),
    ("repair picks the worst move per dollar", "splitplan/search/repair.py",
     "if gain > 0 and (best is None or gain > best[0]):", "if gain > 0 and (best is None or gain < best[0]):"),
    ("decode concurrency halved", "splitplan/capacity/pools.py",
     "batch = np.maximum(active / instances, 1.0)", "batch = np.maximum(active / instances / 2, 1.0)"),
    ("NIC contention removed", "core/splitplan_core.pyx",
     "busy_until = 0.0 if local else max(self.clock[k, LINK_FREE], self.clock[tok, LINK_FREE])", "busy_until = 0.0"),
    ("heterogeneous token split sent to one type", "splitplan/search/evaluation.py",
     "return np.minimum(np.searchsorted(cut, (np.arange(requests) * 0.6180339887498949) % 1.0, side=\"right\"), len(token_parts) - 1)",
     "return np.zeros(requests, dtype=int)"),
    ("energy: prefill at decode power", "splitplan/sim/metrics.py",
     'prefill_s * watts["prefill"] + decode_s * watts["decode"]', 'prefill_s * watts["decode"] + decode_s * watts["decode"]'),
    ("co-located decodes never preempted", "core/splitplan_core.pyx",
     "        while (role == MIXED and self.inst[k, BATCH] > 1", "        while (False and self.inst[k, BATCH] > 1"),
    ("prefill at the datasheet clock", "splitplan/perf/roofline.py",
     "clock_slowdown=1.0 / (hw.cap_clock_fraction if self._measured[\"GEMMs\"] else hw.prefill_clock_fraction),",
     "clock_slowdown=1.0 / hw.cap_clock_fraction,"),
    # parallel layouts (issue 17)
    ("pipeline stages hold all the weights", "splitplan/perf/roofline.py",
     "m.routed_params / lay.stage_gpus) / lay.pp", "m.routed_params / lay.stage_gpus)"),
    ("attention not split over DP groups", "core/splitplan_core.pyx",
     "    cdef double a_tok = n_tok / groups\n", "    cdef double a_tok = n_tok\n"),
    ("one prompt spread over every DP group", "core/splitplan_core.pyx",
     "groups[0] = 1.0 if dp == 1 else min(dp, max((prefill_seqs + decode_seqs) * micro[0], 1.0))",
     "groups[0] = dp"),
    ("a lone decode request split into micro-batches", "core/splitplan_core.pyx",
     "(pp - min(max(decode_seqs, 1.0), pp)) * (1 - has_prefill)", "0.0"),
    ("all-to-all on NVLink beyond the NVLink domain", "splitplan/perf/roofline.py",
     "        if gpus <= hw.nvlink_domain:\n            return nvlink", "        return nvlink"),
    ("an instance over two machines counted on one", "splitplan/specs/layout.py",
     "return machines // unit_machines * unit_instances", "return machines * unit_instances"),
    ("the ILP counts half-instances of multi-machine layouts", "splitplan/search/solve.py",
     "return option.inst.unit_instances / option.instances if option.role == role else 0.0",
     "return option.inst.unit_instances / option.inst.unit_machines / option.instances if option.role == role else 0.0"),
    ("repair adds one machine of a two-machine instance", "splitplan/search/repair.py",
     "unit = option.inst.unit_machines\n", "unit = 1\n"),
]

# The input guards of issue 16, judged by the hardening tests: each breakage must be noticed.
HARDENING_TESTS = ["tests/test_hardening.py", "tests/workload"]
HARDENING = [
    ("a FIFO or device opened as a file", "splitplan/base/inputs.py", "    if not stat.S_ISREG(mode):", "    if False:"),
    ("files read whole without a size bound", "splitplan/base/inputs.py", "    if len(data) > limit:", "    if False:"),
    ("a CSV row longer than its header accepted", "splitplan/base/inputs.py", "    if longer.any():", "    if False:"),
    ("duplicate JSON keys accepted", "splitplan/base/inputs.py", "json.loads(text, object_pairs_hook=_no_duplicates)",
     "json.loads(text)"),
    ("duplicate YAML keys accepted", "splitplan/base/inputs.py", "                if key in seen:", "                if False:"),
    ("YAML aliases accepted", "splitplan/base/inputs.py", "            if id(item) in seen:", "            if False:"),
    ("inf accepted in a perf-db", "splitplan/base/inputs.py", "        bad = ~np.isfinite(values.to_numpy(float))",
     "        bad = values.isna().to_numpy()"),
    ("option bounds not checked", "splitplan/cli/common.py", "            check_bounds(command, kwargs)\n", ""),
    ("--hardware '' means the whole catalog", "splitplan/cli/common.py", "    if not names:\n",
     "    if not names and False:\n"),
    ("pools of any size", "splitplan/cli/common.py", "    if not 1 <= machines <= limits.MAX_MACHINES:",
     "    if not 1 <= machines:"),
    ("Ctrl-C silent", "splitplan/cli/common.py", '            echo_error("interrupted")\n', ""),
    ("two machines under one name", "splitplan/specs/hardware.py",
     "        if other != given and machines[other] != hw:", "        if False:"),
    ("an output set renamed file by file", "splitplan/io/report.py",
     "                temps[path] = _write_temp(path, content, path.name in executable)",
     "                temps[path] = _write_temp(path, content, path.name in executable)\n"
     "                os.replace(temps.pop(path), path)"),
    ("output folders not locked", "splitplan/io/report.py", "        fcntl.flock(fd, fcntl.LOCK_EX)\n", ""),
    ("token counts unbounded", "splitplan/workload/trace.py", " | (values > MAX_REQUEST_TOKENS)", ""),
    ("trace span unbounded", "splitplan/workload/trace.py",
     "        far = arrival - origin > MAX_TRACE_SPAN_S", "        far = arrival - origin > 1e308"),
    ("trace rows unbounded", "splitplan/workload/trace.py", "        if rows > MAX_TRACE_REQUESTS:", "        if False:"),
]

# The guards of issue 26 (plans, exports, catalogs, bounds), judged by their tests.
# (tests/sim/test_compiled.py: the simulator's rules are in the Python loop and the compiled run, held
# equal by its property tests, so a mutant of either shows there; issue 31)
COMPILED_TESTS = ["tests/sim/test_compiled.py"]
ISSUE_26_TESTS = ["tests/test_plan_document.py", "tests/test_hostile_inputs.py", "tests/export", "tests/test_robustness.py",
                  *COMPILED_TESTS]
ISSUE_26 = [
    ("a shell word holding $ left to the shell", "splitplan/deploy/__init__.py",
     "    return \" \".join(f'\"{w}\"' if isinstance(w, Expand) else literal(w) for w in cmd)",
     "    return \" \".join(f'\"{w}\"' if \"$\" in w else literal(w) for w in cmd)"),
    ("any text served as the model", "splitplan/deploy/__init__.py", "    if not ok:\n        raise SpecError(f\"{field}",
     "    if False:\n        raise SpecError(f\"{field}"),
    ("any text as the image", "splitplan/deploy/__init__.py", "    if len(value) > 255 or not _IMAGE.match(value):",
     "    if False:"),
    ("names not slugged", "splitplan/deploy/__init__.py",
     '        return slug(f"{ROLE_NAMES[self.role]}-{self.hardware.name}-{self.layout.spec}{shared}")',
     '        return f"{ROLE_NAMES[self.role]}-{self.hardware.name}-{self.layout.spec}{shared}"'),
    ("slugs without their hash", "splitplan/deploy/__init__.py",
     "    if base and base == text and len(base) <= limit:", "    if base:"),
    ("launch.sh not executable", "splitplan/deploy/__init__.py", 'executable=frozenset({"launch.sh"})', "executable=frozenset()"),
    ("plan integers truncated", "splitplan/io/plan_document.py",
     '_STRICT = ConfigDict(extra="forbid", frozen=True, strict=True)', '_STRICT = ConfigDict(extra="forbid", frozen=True)'),
    ("a pool listed twice accepted", "splitplan/io/plan_document.py", "            if key in seen:", "            if False:"),
    ("a layout beside other degrees accepted", "splitplan/io/plan_document.py", "            if written != layout:",
     "            if False:"),
    ("an edited spec copy accepted", "splitplan/io/plan_document.py",
     '            if digest(copy["spec"]) != copy["sha256"]:', "            if False:"),
    ("a catalog entry that cannot be read skipped", "splitplan/specs/catalog.py",
     "            if os.path.lexists(candidate):", "            if candidate.is_file():"),
    ("a catalog entry named unlike its file", "splitplan/specs/_load.py",
     '    if not is_path(name_or_path) and "name" in data and data["name"] != path.stem:', "    if False:"),
    ("a file that is no spec shown", "splitplan/specs/_load.py",
     "    if not any(k in fields or difflib.get_close_matches(k, fields, n=1, cutoff=0.75) for k in keys):", "    if False:"),
    ("control characters reach the terminal", "splitplan/base/inputs.py",
     "    return _CONTROL.sub(", "    return text or _CONTROL.sub("),
    ("an MLA config missing a key planned as plain attention", "splitplan/specs/model.py",
     "    if given and len(given) < len(_MLA_KEYS):", "    if False:"),
    ("requests beyond the context served", "core/splitplan_core.pyx",
     "        if self.settings[CONTEXT] > 0 and self.prompt[i] + self.out[i] > self.settings[CONTEXT]:", "        if False:"),
    ("no decode-iteration bound", "core/splitplan_core.pyx",
     "            if self.counters[ITERATIONS] > self.settings[MAX_ITERATIONS]:", "            if False:"),
    ("the refused counted in the SLO", "splitplan/sim/metrics.py",
     "    served = result.measured  # (past a closed loop's warm-up)\n", "    served = None\n"),
    ("infeasibility lists every option", "splitplan/base/errors.py", "    short = unique[0] if unique else \"none\"",
     "    short = \"; \".join(unique) if unique else \"none\""),
]

# Issue 27 (what a plan buys, one rule for what fits, the power cap, optimize on the simulator's
# terms, presentation), judged by the tests written for it.
ISSUE_27_TESTS = [
    "tests/search/test_plan.py::test_a_plan_says_what_it_buys",
    "tests/test_cli.py::test_planner_and_simulator_refuse_the_same_prompt_too_long_for_a_prompt_instance",
    "tests/perf/test_roofline.py::test_power_cap_slows_prefill_only",
    "tests/sim/test_cluster.py::test_validation_with_the_mixed_pool_trims_what_lending_makes_spare",
    *COMPILED_TESTS,
    "tests/test_cli.py::test_optimize_plans_and_validates_on_the_simulators_terms",
    "tests/test_cli.py::test_a_caption_breaks_between_clauses_never_inside_a_figure",
    "tests/test_cli.py::test_one_number_format_per_column",
]
ISSUE_27 = [
    ("busy time not shared among instances", "splitplan/capacity/pools.py",
     "np.sum(np.minimum(open_, instances) * np.diff(times[order]))", "np.sum(open_ * np.diff(times[order]))"),
    ("prompt-side KV unchecked in the simulator", "core/splitplan_core.pyx",
     "if self.inst[src, ROLE] == PROMPT and self.prompt[i] > self.pools[self.inst[src, POOL], MAX_REQUEST]:", "if False:"),
    ("prompt-side KV unchecked in the planner", "splitplan/search/sizing.py",
     "if role == Role.PROMPT and int(np.max(t.prompt_tokens)) > inst.max_request_tokens:", "if False:"),
    ("the power cap slows only compute", "core/splitplan_core.pyx",
     "memory_s, network_s = memory_s * capped, network_s * capped", "pass"),
    ("the mixed pool's plan never trimmed", "splitplan/workflows/simulation.py",
     "if setup.borrow_threshold_tokens is not None and not added and all(", "if False and all("),
    ("--validate reads the perf-db its own way", "splitplan/workflows/simulation.py",
     "borrow_threshold_tokens=self.borrow_threshold_tokens, perf_interp=self.perf_interp,",
     "borrow_threshold_tokens=self.borrow_threshold_tokens,"),
    ("a caption wrapped between words", "splitplan/io/report.py",
     'for clause in re.split(r"(?<=[;,]) ", paragraph):', 'for clause in paragraph.split(" "):'),
    ("a column's decimals dropped where zeros", "splitplan/io/report.py",
     'spec = f",.{decimals}f"', 'spec = ".3g"'),
]

# Issue 28 so far (the engine's scheduler, inter-token latency), judged by the tests written for it.
ISSUE_28_TESTS = [
    "tests/sim/test_cluster.py::test_planner_prompt_replay_schedules_as_the_simulator_chunked_and_capped",
    "tests/sim/test_cluster.py::test_at_most_max_num_seqs_requests_run_and_the_rest_wait",
    "tests/sim/test_cluster.py::test_inter_token_gaps_are_every_gap_and_add_up_to_each_decode",
    "tests/search/test_plan.py::test_a_sequence_cap_sizes_the_token_pool",
    "tests/perf/test_slo.py::test_gaps_read_as_their_expanded_sample",
    "tests/perf/test_slo.py::test_an_itl_line_sees_the_stalls_a_per_request_tbt_hides",
    "tests/perf/test_slo.py::test_a_split_plans_predicted_gaps_are_the_simulators_within_10_percent",
    "tests/sim/test_cluster.py::test_a_cached_prefix_is_not_prefilled_but_its_kv_is_read",
    "tests/sim/test_cluster.py::test_async_scheduling_puts_a_request_that_arrives_mid_iteration_one_iteration_later",
    "tests/sim/test_cluster.py::test_the_front_end_latency_is_added_to_every_request",
    "tests/sim/test_cluster.py::test_planner_prompt_replay_defers_as_the_simulator_under_async_scheduling",
    "tests/perf/test_roofline.py::test_moe_efficiency_slows_the_expert_gemms_of_a_prefill_not_a_decode",
    *COMPILED_TESTS,
]
ISSUE_28 = [
    ("a co-located instance runs past max_num_seqs", "core/splitplan_core.pyx",
     "or self.inst[k, BATCH] + self.inst[k, QUEUE + 2] + self.inst[k, RUN + 2] >= cap):", "or False):"),
    ("the planner's chunked pass splits no prompt", "splitplan/capacity/pools.py",
     "            c = min(size - d, room)\n", "            c = size - d\n"),
    ("a token pool sized past its sequence cap", "splitplan/search/sizing.py",
     'return "max_num_seqs" if problem.max_num_seqs and res.batch_p99 > problem.max_num_seqs else None', "return None"),
    ("every iteration one gap, whatever its batch", "splitplan/sim/gaps.py",
     "np.insert(np.repeat(durations, counts), starts[base], gap0)", "np.insert(np.repeat(durations, counts > 0), starts[base], gap0)"),
    ("weighted gaps read unweighted", "splitplan/perf/slo.py", "return v[order], np.cumsum(w[order])",
     "return v[order], np.cumsum(np.ones(len(w)))"),
    ("the first gap never waits for the running iteration", "splitplan/search/evaluation.py",
     "    first = decode_s - np.maximum(o - 2, 0) * step_s + waits", "    first = decode_s - np.maximum(o - 2, 0) * step_s"),
    ("co-located sizing blind to ITL lines", "splitplan/search/sizing.py",
     '    for metric in METRICS:\n        line = first_failing(problem, metric, values.of(metric))',
     '    for metric in ("ttft", "tbt", "e2e"):\n        line = first_failing(problem, metric, values.of(metric))'),
    ("a cached prefix prefilled all the same", "core/splitplan_core.pyx",
     "req[PLEN], req[BASE], req[DONE], req[CACHED] = prompt, 1, cached, cached",
     "req[PLEN], req[BASE], req[DONE], req[CACHED] = prompt, 1, 0, cached"),
    ("async scheduling never defers an arrival", "core/splitplan_core.pyx",
     "        if self.inst[src, RUNNING] and self.inst[src, FIXED]:", "        if False:"),
    ("the planner's replay joins the next batch under async scheduling", "splitplan/capacity/pools.py",
     "            tag[i] = launch[j] if running[j] is not None and fixed[j] else launch[j] - 1",
     "            tag[i] = launch[j] - 1"),
    ("the front end left out of the simulation", "splitplan/sim/cluster.py",
     "        self.front = self.pools[0].perf.engine.frontend_latency_s", "        self.front = 0.0"),
    ("expert GEMMs at a dense GEMM's efficiency", "core/splitplan_core.pyx",
     "gemm_peak * _gemm_efficiency(c, rows) * c[MOE_EFF]", "gemm_peak * _gemm_efficiency(c, rows)"),
]

# Issue 32: the survivors a review found, judged by the tests written for them.
ISSUE_32_TESTS = [
    "tests/export/test_export.py::test_sglang_prefill_workers_on_one_machine_take_their_own_bootstrap_ports",
    "tests/export/test_export.py::test_a_vllm_instance_whose_ranks_span_nodes_runs_on_a_ray_cluster_of_its_nodes",
    "tests/sim/test_cluster.py::test_conservation_every_request_once_and_tokens",
    *COMPILED_TESTS,
    "tests/perf/test_layouts.py::test_expert_all_to_all_time_by_hand_and_no_pipeline_hop_without_stages",
    "tests/perf/test_layouts.py::test_decode_attention_flops_by_hand",
]
# Issue 31: the simulator's compiled run (the engine core's `run`), judged by the property tests that
# hold it to the Python loop and their edge cases. (Admitting waiting requests on every arrival, not
# only on a co-located one, is equivalent: nothing an admission reads changes between iterations.)
ISSUE_31 = [(f"compiled run: {name}", "core/splitplan_core.pyx", old, new) for name, old, new in [
    ("whole prompts past the budget", "total + self.req[PLEN, h] - self.req[DONE, h] > max_batch_tokens",
     "total + self.req[PLEN, h] - self.req[DONE, h] >= max_batch_tokens"),
    ("a chunk's attention over itself alone",
     "sq += (d + c) * (d + c) - d * d  # causal attention of c new tokens over d + c\n            self.req[DONE, i] = d + c",
     "sq += c * c\n            self.req[DONE, i] = d + c"),
    ("one request past the sequence cap", "self.inst[k, QUEUE + 2] + self.inst[k, RUN + 2] >= cap",
     "self.inst[k, QUEUE + 2] + self.inst[k, RUN + 2] > cap"),
    ("a preempted request to the back", "        self.push_front(k, WAITING, v)", "        self.push(k, WAITING, v)"),
    ("the context never grows", "            self.inst[k, CTX] += self.inst[k, BATCH]\n", "            self.inst[k, CTX] += 0\n"),
    ("prefills fix no next iteration", "or (self.inst[k, RUN + 2] > 0 and role == MIXED))", ")"),
    ("the last stall kept", "self.times[STALL, i] = max(self.times[STALL, i], now - self.times[PREEMPTED_AT, i])",
     "self.times[STALL, i] = now - self.times[PREEMPTED_AT, i]"),
    ("a join's finish not watched",
     "        self.inst[k, NEXT_FINISH] = min(self.inst[k, NEXT_FINISH], self.req[FINISH_ITER, i])\n", ""),
    ("a held request not counted", "self.p_load[self.inst[src, P_POS]] += self.prompt[i] + (self.inst[src, ROLE] == MIXED)",
     "self.p_load[self.inst[src, P_POS]] += self.prompt[i]"),
    ("the deferred of this iteration released", "self.req[DEFERRED_AT, self.inst[k, DEFERRED]] < before",
     "self.req[DEFERRED_AT, self.inst[k, DEFERRED]] <= before"),
    ("a rejected prompt left pending", "                    self.p_load[self.inst[k, P_POS]] -= self.prompt[i]\n",
     "                    pass\n"),
    ("a prompt at the threshold serialized", "if self.prompt[i] < self.pools[source, LAYERWISE_MIN]:",
     "if self.prompt[i] <= self.pools[source, LAYERWISE_MIN]:"),
    ("the token instance's link never busy",
     "        self.clock[k, LINK_FREE] = self.clock[tok, LINK_FREE] = begin + duration\n",
     "        self.clock[k, LINK_FREE] = begin + duration\n"),
    ("layer-wise transfers end with the prefill", "now + duration / self.settings[LAYERS]", "now"),
    ("a KV that fills the instance refused",
     "if self.inst[k, KV_USED] + need > kv_cap or self.inst[k, BATCH] >= cap:",
     "if self.inst[k, KV_USED] + need >= kv_cap or self.inst[k, BATCH] >= cap:"),
    ("a token load never returned", "            self.t_load[self.inst[k, T_POS]] -= self.out[i]\n",
     "            self.t_load[self.inst[k, T_POS]] -= 0\n"),
    ("a KV arrival never deferred", "        if self.inst[k, RUNNING] and self.inst[k, FIXED]:  # async scheduling: "
     "the next iteration is already scheduled\n            self.defer(k, i, WAITING)\n            return False",
     "        if False:\n            return False"),
    ("a token instance's KV freed but the output's", "                    self.inst[k, KV_USED] -= self.prompt[i] + self.out[i]\n",
     "                    self.inst[k, KV_USED] -= self.prompt[i]\n"),
    ("a prompt past the prompt instance's KV taken",
     "if self.inst[src, ROLE] == PROMPT and self.prompt[i] > self.pools[self.inst[src, POOL], MAX_REQUEST]:",
     "if self.inst[src, ROLE] == PROMPT and self.prompt[i] > 10 * self.pools[self.inst[src, POOL], MAX_REQUEST]:"),
    ("a prompt instance's deferred to its wait for KV",
     "cdef int line = WAITING if self.inst[src, ROLE] == MIXED else QUEUE", "cdef int line = WAITING"),
    ("an arrival before an iteration ending with it",
     "if r < n and (not self.heap.size or self.arrival[r] + front_s < self.heap.items[0].t):",
     "if r < n and (not self.heap.size or self.arrival[r] + front_s <= self.heap.items[0].t):"),
    ("the deferred never joined when nothing was scheduled",
     "                if how != AFTER_ITERATION or self.inst[k, RUNNING] or not self.inst[k, DEFERRED + 2]:\n"
     "                    break",
     "                break"),
]]

# Issue 56: the prompt replay in the engine core, judged by the property tests that hold it to the
# Python replay (tests/capacity/test_replay.py).
REPLAY_TESTS = ["tests/capacity/test_replay.py"]
ISSUE_56 = [(f"compiled replay: {name}", "core/splitplan_core.pyx", old, new) for name, old, new in [
    ("a pass ending at an arrival's time after it is routed", "if s.ends.size and s.ends.items[0].t <= now:",
     "if s.ends.size and s.ends.items[0].t < now:"),
    ("one prompt past the sequence cap", "total + size - d > self.max_batch_tokens or count >= self.cap):",
     "total + size - d > self.max_batch_tokens or count > self.cap):"),
    ("held requests never released", "s.add_load(heap_pop(&held).key, -1)", "heap_pop(&held)"),
    ("a chunk's attention over itself alone",
     "sq += (d + c) * (d + c) - d * d  # causal attention of c new tokens over d + c\n                self.done[r] = d + c",
     "sq += c * c\n                self.done[r] = d + c"),
    ("async scheduling holds back nothing", "else (count and self.tag[r] >= self.launch[j])):",
     "else (count and False)):"),
    ("a completed pass's load never returned", "self.add_load(j, -self.run_whole[j])", "self.add_load(j, 0)"),
]]

ISSUE_32 = [
    ("SGLang's bootstrap port counted down per worker", "splitplan/deploy/launch.py",
     'cmd += ["--disaggregation-bootstrap-port", str(SGLANG_BOOTSTRAP_PORT + slot)]',
     'cmd += ["--disaggregation-bootstrap-port", str(SGLANG_BOOTSTRAP_PORT - slot)]'),
    ("the Ray path skips a node", "splitplan/deploy/launch.py",
     "for _ in range(1, nodes))]", "for _ in range(2, nodes))]"),
    ("the mixed pool's committed KV never fully returned", "core/splitplan_core.pyx",
     "        self.inst[k, KV_COMMITTED] -= self.prompt[i] + self.out[i]",
     "        self.inst[k, KV_COMMITTED] -= self.prompt[i]"),
    ("a pipeline hop without pipeline stages", "splitplan/perf/roofline.py",
     "/ self._link_bytes_per_s(2 * g, f, off=1.0)) if lay.pp > 1 else 0.0",
     "/ self._link_bytes_per_s(2 * g, f, off=1.0)) if lay.pp >= 1 else 0.0"),
    ("decode attention at half its FLOPs", "splitplan/perf/roofline.py",
     "2 * m.q_dim / t, 4 * m.q_dim / t,", "2 * m.q_dim / t, 2 * m.q_dim / t,"),
]

SWAPS = {ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.Div, ast.Div: ast.Mult, ast.Lt: ast.LtE, ast.LtE: ast.Lt,
         ast.Gt: ast.GtE, ast.GtE: ast.Gt, ast.Eq: ast.NotEq, ast.NotEq: ast.Eq, ast.And: ast.Or, ast.Or: ast.And}


def sites(tree: ast.AST) -> list[tuple[int, str]]:
    """(index in ast.walk order, kind) of every mutable node of a module."""
    out = []
    for k, node in enumerate(ast.walk(tree)):
        if isinstance(node, (ast.BinOp, ast.BoolOp)) and type(node.op) in SWAPS:
            out.append((k, "op"))
        elif isinstance(node, ast.Compare) and type(node.ops[0]) in SWAPS:
            out.append((k, "cmp"))
        elif isinstance(node, ast.Constant) and type(node.value) in (int, float, bool) and not isinstance(node.value, str):
            out.append((k, "const"))
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            out.append((k, "not"))
    return out


class _Mutate(ast.NodeTransformer):
    def __init__(self, target: int, nodes: list):
        self.target = nodes[target]
        self.done = ""

    def visit(self, node):
        if node is not self.target:
            return self.generic_visit(node)
        self.done = f"line {node.lineno}: " + ast.unparse(node)
        if isinstance(node, (ast.BinOp, ast.BoolOp)):
            node.op = SWAPS[type(node.op)]()
        elif isinstance(node, ast.Compare):
            node.ops[0] = SWAPS[type(node.ops[0])]()
        elif isinstance(node, ast.Constant):
            v = node.value
            node.value = (not v) if isinstance(v, bool) else (1 if v == 0 else 0 if v == 1 else v + 1)
        elif isinstance(node, ast.UnaryOp):
            return node.operand
        self.done += " -> " + ast.unparse(node)
        return node


def mutate_source(text: str, index: int) -> tuple[str, str]:
    tree = ast.parse(text)
    nodes = list(ast.walk(tree))
    m = _Mutate(index, nodes)
    new = m.visit(tree)
    return ast.unparse(ast.fix_missing_locations(new)), m.done


def build_core(scratch: Path) -> None:
    """Compile the scratch copy's engine core in place (it then comes before the installed one on
    PYTHONPATH): once at the start and around each mutant of core/ (about 15 s each)."""
    subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--inplace"], cwd=scratch, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def killed(scratch: Path, timeout: float, tests: list[str] = TESTS) -> bool:
    env = {**os.environ, "PYTHONPATH": str(scratch), "PYTHONDONTWRITEBYTECODE": "1", "CI": "true"}
    try:
        run = subprocess.run([sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *tests], cwd=scratch,
                             env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=timeout)
    except subprocess.TimeoutExpired:
        return True
    return run.returncode != 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sample", type=int, default=60)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--named-only", action="store_true")
    parser.add_argument("--sampled-only", action="store_true", help="skip the named mutants (run beside --named-only)")
    parser.add_argument("--only", default="", help="named mutants whose name contains TEXT, or one of A|B|... (implies --named-only)")
    parser.add_argument("--timeout", type=float, default=600)
    args = parser.parse_args()
    named = ([(m, TESTS) for m in NAMED] + [(m, HARDENING_TESTS) for m in HARDENING]
             + [(m, ISSUE_26_TESTS) for m in ISSUE_26] + [(m, ISSUE_27_TESTS) for m in ISSUE_27]
             + [(m, ISSUE_28_TESTS) for m in ISSUE_28] + [(m, COMPILED_TESTS) for m in ISSUE_31]
             + [(m, ISSUE_32_TESTS) for m in ISSUE_32] + [(m, REPLAY_TESTS) for m in ISSUE_56])
    named = [(m, tests) for m, tests in named if any(part in m[0] for part in args.only.split("|"))]
    moved = [f"{path}: {name}" for (name, path, old, _), _ in named if (ROOT / path).read_text().count(old) != 1]
    if moved:  # (checked before the hour of trials, not at the one that moved)
        sys.exit("named mutants whose line moved (update bench/mutation.py):\n  " + "\n  ".join(moved))
    scratch = Path(tempfile.mkdtemp(prefix="mutation-")) / "repo"
    shutil.copytree(ROOT, scratch, ignore=shutil.ignore_patterns(".git", "__pycache__", "*.egg-info", ".hypothesis", "build"))
    build_core(scratch)
    assert not killed(scratch, args.timeout), "the core tests fail on the unmutated code"
    assert not killed(scratch, args.timeout, HARDENING_TESTS), "the hardening tests fail on the unmutated code"
    assert not killed(scratch, args.timeout, ISSUE_26_TESTS), "the issue-26 tests fail on the unmutated code"
    assert not killed(scratch, args.timeout, ISSUE_27_TESTS), "the issue-27 tests fail on the unmutated code"
    assert not killed(scratch, args.timeout, ISSUE_28_TESTS), "the issue-28 tests fail on the unmutated code"
    assert not killed(scratch, args.timeout, ISSUE_32_TESTS), "the issue-32 tests fail on the unmutated code"

    def trial(path: str, text: str, tests: list[str] = TESTS) -> bool:
        target = scratch / path
        original = target.read_text()
        target.write_text(text)
        try:
            if path.startswith("core/"):
                try:
                    build_core(scratch)
                except subprocess.CalledProcessError:  # (a mutant the compiler refuses tests nothing: fix it)
                    print(f"{path}: the mutant does not compile; counted as not killed", file=sys.stderr)
                    return False
            return killed(scratch, args.timeout, tests)
        finally:
            target.write_text(original)
            if path.startswith("core/"):
                build_core(scratch)

    if args.sampled_only:
        named = []
    print("| named mutation | file | killed |\n|---|---|---|")
    named_killed = 0
    for (name, path, old, new), tests in named:
        text = (scratch / path).read_text()  # (the copy: this checkout may change while the trials run)
        ok = trial(path, text.replace(old, new), tests)
        named_killed += ok
        print(f"| {name} | {path} | {'yes' if ok else 'NO'} |", flush=True)
    print(f"\nnamed: {named_killed}/{len(named)} killed")
    if args.named_only or args.only:
        return
    population = []
    for package in PACKAGES:
        for file in sorted((scratch / package).glob("*.py")):
            rel = str(file.relative_to(scratch))
            population += [(rel, k) for k, _ in sites(ast.parse(file.read_text()))]
    rng = random.Random(args.seed)
    sample = rng.sample(population, min(args.sample, len(population)))
    print("\n| sampled mutant | file | killed |\n|---|---|---|")
    score, start, by_package = 0, time.perf_counter(), {}
    for rel, index in sample:
        text, what = mutate_source((scratch / rel).read_text(), index)
        ok = trial(rel, text)
        score += ok
        package = rel.split("/")[1]
        done = by_package.setdefault(package, [0, 0])
        done[0] += ok
        done[1] += 1
        print(f"| `{what[:90]}` | {rel} | {'yes' if ok else 'no'} |", flush=True)
    print(f"\nsampled: {score}/{len(sample)} killed ({100 * score / max(len(sample), 1):.0f} %) of {len(population)} sites; "
          + ", ".join(f"{p} {k}/{n}" for p, (k, n) in sorted(by_package.items()))
          + f"; {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
