"""Adversarial inputs, each in a fresh `splitplan` process under a memory cap and a time limit.

Every case must end with its expected exit code (2 for bad input) and, on failure, exactly one
stderr line `error: ...` of at most 400 characters, no traceback; the run's peak RSS is shown
so the bounded readers can be seen to stay bounded (a reader that loads /dev/zero or a gzip
bomb whole would hit the cap and fail the case).

    python bench/adversarial.py [--only SUBSTRING] [--cap-mb 2048] [--timeout-s 60]

It writes its inputs into a temporary folder and prints one row per case, then `N passed,
M failed`; it exits 1 if any case failed.
"""

from __future__ import annotations

import argparse
import gzip
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SIM = ["--prompt-pool", "h100-80gb:8:1", "--token-pool", "h100-80gb:8:1"]
QUICK = ["--hardware", "h100-80gb", "--tp", "8"]


def _files(d: Path) -> dict[str, str]:
    """The malformed inputs, by name."""
    f = {}

    def put(name: str, text: str | bytes) -> None:
        path = d / name
        path.write_bytes(text if isinstance(text, bytes) else text.encode())
        f[name] = str(path)

    head = "arrival_timestamp,prompt_size,token_size\n"
    put("huge_tokens.csv", head + "0,100000000000000000000,10\n1,100,10\n")
    put("int64_edge.csv", head + "0,9223372036854775807,10\n1,100,10\n")
    put("extra_fields.csv", head + "0,100,10\n1,100,10,7\n")
    put("far_future.csv", head + "0,100,10\n1e300,100,10\n")
    put("ns_as_s.csv", head + "1700000000000000000,100,10\n1700000001000000000,100,10\n")
    put("mixed_offsets.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900+00:00,100,10\n"
        "2023-11-16 23:15:50.0000000+05:00,100,10\n")  # 3.3 s later
    put("big_cell.csv", head + "0,100,10\n1," + "9" * 5_000_000 + "x,10\n")
    put("bad_line.jsonl", '{"timestamp": 0, "input_length": 10, "output_length": 5}\n{"timestamp": 1, "input_length": \n')
    bomb = d / "bomb.csv.gz"
    with gzip.open(bomb, "wb", compresslevel=9) as z:
        z.write(head.encode())
        row = b"1,100,10\n" * 100_000
        for _ in range(2_000):  # 1.8 GB of rows, a few MB compressed
            z.write(row)
    f["bomb.csv.gz"] = str(bomb)
    fifo = d / "fifo.csv"
    os.mkfifo(fifo)
    f["fifo"] = str(fifo)
    spec = (ROOT / "hardware_specs" / "h100-80gb.yaml").read_text()
    put("my-h100.yaml", spec.replace("description:", "name: h100-80gb\ndescription:", 1).replace("price_usd_per_hour: 38.0",
                                                                                                 "price_usd_per_hour: 30.0"))
    put("seven.yaml", spec.replace("gpus_per_machine: 8", "gpus_per_machine: 7"))
    put("dup.yaml", spec + "price_usd_per_hour: 1.0\n")
    put("deep.yaml", "description: x\nttft: " + "[" * 100_000 + "]" * 100_000 + "\n")
    put("deep.json", '{"description": "x", "ttft": ' + "[" * 100_000 + "]" * 100_000 + "}")
    put("dup.json", '{"description": "a", "description": "b", "ttft": {"p50": {"max_ms": 500}}}')
    put("secret.yaml", "password: hunter2-" + "x" * 300 + "\n")
    put("inf_db.csv", (ROOT / "tests" / "data" / "splitwise_perf_model.csv").read_text().replace(",196.2532191537321,", ",inf,", 1))
    put("tp_text.csv", (ROOT / "tests" / "data" / "splitwise_perf_model.csv").read_text().replace(",2\n", ",two\n", 1))
    put("spec_at_bound.yaml", "ttft: [" + ", ".join(["1"] * 349_000) + "]\n")  # just under 1 MiB
    laughs = ["a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    put("laughs.yaml", "\n".join(laughs + [f"a{k}: &a{k} [" + ", ".join([f"*a{k - 1}"] * 9) + "]" for k in range(1, 10)]))
    db = (ROOT / "tests" / "data" / "splitwise_perf_model.csv").read_text()
    head, rows = db.split("\n", 1)
    put("db_at_bound.csv", head + "\n" + rows * ((63 << 20) // len(rows)))  # just under 64 MiB
    put("deep_plan.json", '{"plan": ' + "[" * 100_000 + "]" * 100_000 + "}")
    put("huge_plan.json", '{"plan": {"prompt_pools": [{"hardware": "h100-80gb", "tp": 8, "machines": 100000000}], '
        '"token_pools": [{"hardware": "h100-80gb", "tp": 8, "machines": 1}]}}')
    put("a_file", "x")
    _issue_26_files(d, f, put)
    (d / "ro").mkdir()
    os.chmod(d / "ro", 0o500)
    (d / "candir").mkdir()
    (d / "candir" / "candidates.csv").mkdir()
    return f


def _plan_doc(pools: dict, inputs: dict | None = None) -> dict:
    """A plan.json of schema 2 (no specs: resolved from the catalog) with these pools."""
    doc = {"schema_version": 2, "inputs": inputs if inputs is not None else
           {"model": "deepseek-v3", "slo": "chat", "engine": "vllm-fp8", "max_batch_tokens": 2048},
           "plan": {**pools, "machines": sum(p["machines"] for ps in pools.values() for p in ps),
                    "cost_usd_per_hour": 0.0, "power_kw": 0.0, "predicted": {}, "slo": [], "binding": ""}}
    return doc


def _issue_26_files(d: Path, f: dict, put) -> None:
    """Plans, catalogs and configs that try to smuggle a command, a bad value or a huge size in."""
    import json

    import yaml
    prompt = {"hardware": "h200-141gb", "tp": 8, "machines": 2}
    token = {"hardware": "h200-141gb", "tp": 1, "dp": 16, "ep": 16, "layout": "dp16ep16", "machines": 2}
    plans = {
        "plan_ok": _plan_doc({"prompt_pools": [prompt], "token_pools": [token]}),
        "plan_machines_float": _plan_doc({"prompt_pools": [{**prompt, "machines": 2.7}], "token_pools": [token]}),
        "plan_machines_bool": _plan_doc({"prompt_pools": [{**prompt, "machines": True}], "token_pools": [token]}),
        "plan_tp_float": _plan_doc({"prompt_pools": [{**prompt, "tp": 8.5}], "token_pools": [token]}),
        "plan_layout_mismatch": _plan_doc({"prompt_pools": [{**prompt, "layout": "dp16ep16"}], "token_pools": [token]}),
        "plan_pool_twice": _plan_doc({"prompt_pools": [prompt, {**prompt, "machines": 3}], "token_pools": [token]}),
        "plan_split_and_mixed": _plan_doc({"prompt_pools": [prompt], "token_pools": [token], "mixed_pools": [prompt]}),
        "plan_prompt_only": _plan_doc({"prompt_pools": [prompt]}),
        "plan_mbt_text": _plan_doc({"prompt_pools": [prompt], "token_pools": [token]},
                                   {"model": "deepseek-v3", "slo": "chat", "engine": "vllm-fp8", "max_batch_tokens": "abc"}),
        "plan_mbt_negative": _plan_doc({"prompt_pools": [prompt], "token_pools": [token]},
                                       {"model": "deepseek-v3", "slo": "chat", "engine": "vllm-fp8", "max_batch_tokens": -5}),
        "plan_200_pools": _plan_doc({"prompt_pools": [{"hardware": f"h{k}", "tp": 8, "machines": 100_000} for k in range(200)],
                                     "token_pools": [token]}),
        "plan_800k_workers": _plan_doc({"prompt_pools": [{"hardware": "h100-80gb", "tp": 1, "machines": 99_999}],
                                        "token_pools": [{"hardware": "h100-80gb", "tp": 8, "machines": 1}]},
                                       {"model": "llama3.1-8b", "slo": "chat", "engine": "vllm-fp8"}),
    }
    for name, doc in plans.items():
        put(f"{name}.json", json.dumps(doc))
    no_inputs = _plan_doc({"prompt_pools": [prompt], "token_pools": [token]})
    no_inputs.pop("inputs")
    put("plan_no_inputs.json", json.dumps(no_inputs))
    put("plan_mbt_huge.json", json.dumps(plans["plan_ok"]).replace('"max_batch_tokens": 2048', '"max_batch_tokens": 1e400'))
    # catalogs: an hf_repo that is a command, a hardware name that is a case pattern, a link to a device
    model = yaml.safe_load((ROOT / "model_specs" / "deepseek-v3.yaml").read_text())
    hardware = yaml.safe_load((ROOT / "hardware_specs" / "h200-141gb.yaml").read_text())
    for cat, kind, name, data in [("cat_repo", "model_specs", "deepseek-v3", {**model, "hf_repo": "org/m$(touch pwned)"}),
                                  ("cat_flag", "model_specs", "deepseek-v3", {**model, "hf_repo": "--trust-remote-code"}),
                                  ("cat_case", "hardware_specs", "x|*) touch pwned;; y", {**hardware, "name": "x|*) touch pwned;; y"}),
                                  ("cat_misnamed", "hardware_specs", "zz", {**hardware, "name": "a100-80gb"})]:
        (d / cat / kind).mkdir(parents=True, exist_ok=True)
        (d / cat / kind / f"{name}.yaml").write_text(yaml.safe_dump(data))
        f[cat] = str(d / cat)
    put("plan_case.json", json.dumps(_plan_doc({"prompt_pools": [{**prompt, "hardware": "x|*) touch pwned;; y"}],
                                                "token_pools": [{**token, "hardware": "x|*) touch pwned;; y"}]})))
    (d / "cat_zero" / "hardware_specs").mkdir(parents=True)
    (d / "cat_zero" / "hardware_specs" / "h100-80gb.yaml").symlink_to("/dev/zero")
    f["cat_zero"] = str(d / "cat_zero")
    (d / "cat_fifo" / "hardware_specs").mkdir(parents=True)
    os.mkfifo(d / "cat_fifo" / "hardware_specs" / "myfifo.yaml")
    f["cat_fifo"] = str(d / "cat_fifo")
    put("shadow", "root:$6$SECRETHASH:20228:0:99999:7:::\ndaemon: SECRETVALUE\n")
    ds = {k: v for k, v in model.items() if k not in ("name", "kv_lora_rank")}
    put("mla_partial.yaml", yaml.safe_dump(ds))
    put("experts_twice.yaml", yaml.safe_dump({**{k: v for k, v in model.items() if k != "name"}, "num_local_experts": 128}))
    huge = yaml.safe_load((ROOT / "model_specs" / "llama3.1-405b.yaml").read_text())
    put("huge_model.yaml", yaml.safe_dump({**huge, "name": "huge_model", "num_hidden_layers": 5000}))
    lean = yaml.safe_load((ROOT / "engine_profiles" / "lean.yaml").read_text())
    put("reserve.yaml", yaml.safe_dump({**lean, "activation_reserve_gb_per_gpu": 1000}))


def _issue_26_cases(f: dict[str, str]) -> list[tuple]:
    """(name, arguments, exit code, {"stdout": path, "forbid": [text never in stderr], "max_chars": n})."""
    plan = f["plan_ok.json"]
    out = [(f"plan: {name}", ["export", f[f"plan_{name}.json"], "--to", "dynamo", "--backend", "vllm"], 2, {})
           for name in ("machines_float", "machines_bool", "tp_float", "layout_mismatch", "pool_twice", "split_and_mixed",
                        "prompt_only", "mbt_text", "mbt_negative", "mbt_huge", "no_inputs", "200_pools")]
    out += [(f"simulate --plan {name}", ["simulate", "--plan", f[f"plan_{name}.json"]], 2, {})
            for name in ("machines_float", "split_and_mixed", "no_inputs")]
    pwned = {"forbid": ["pwned'"]}
    out += [
        ("export 800k workers to vllm", ["export", f["plan_800k_workers.json"], "--to", "vllm"], 2, {}),
        ("export 800k workers to dynamo", ["export", f["plan_800k_workers.json"], "--to", "dynamo", "--backend", "vllm"], 0, {}),
        ("export --model-id $(touch pwned)", ["export", plan, "--to", "vllm", "--model-id", "org/m$(touch pwned)"], 2, {}),
        ("export --model-id newline", ["export", plan, "--to", "sglang", "--model-id", "org/m\ntouch pwned"], 2, {}),
        ("export --model-id leading dash", ["export", plan, "--to", "vllm", "--model-id", "--trust-remote-code"], 2, {}),
        ("export --image with a command", ["export", plan, "--to", "vllm", "--image", "x:$(touch pwned)"], 2, {}),
        ("export hf_repo $(touch pwned)", ["--catalog", f["cat_repo"], "export", plan, "--to", "llm-d"], 2, {}),
        ("export hf_repo a flag", ["--catalog", f["cat_flag"], "export", plan, "--to", "vllm"], 2, {}),
        ("export a case-pattern name", ["--catalog", f["cat_case"], "export", f["plan_case.json"], "--to", "vllm"], 0, pwned),
        ("export a case-pattern name, llm-d", ["--catalog", f["cat_case"], "export", f["plan_case.json"], "--to", "llm-d"], 0, {}),
        ("catalog entry -> /dev/zero", ["--catalog", f["cat_zero"], "perf", "--hardware", "h100-80gb"], 2, {}),
        ("catalog FIFO entry", ["--catalog", f["cat_fifo"], "hardware", "list"], 2, {}),
        ("catalog entry misnamed", ["--catalog", f["cat_misnamed"], "hardware", "list"], 2, {}),
        ("system file as --hardware", ["perf", "--hardware", f["shadow"]], 2, {"forbid": ["SECRET", "root:"]}),
        ("system file as --slo", ["optimize", "--slo", f["shadow"], *QUICK], 2, {"forbid": ["SECRET", "root:"]}),
        ("escape sequence in --hardware", ["perf", "--hardware", "h100\x1b[2J"], 2, {"forbid": ["\x1b"]}),
        ("MLA config without kv_lora_rank", ["perf", "--model", f["mla_partial.yaml"], "--hardware", "h200-141gb"], 2, {}),
        ("two expert counts", ["perf", "--model", f["experts_twice.yaml"], "--hardware", "h200-141gb"], 2, {}),
        ("--layout tp99999999999999999999", ["perf", "--layout", "tp99999999999999999999"], 2, {"forbid": ["--tp"]}),
        ("engine precision twice", ["perf", "--engine", "lean@weights=fp4,weights=fp8"], 2, {}),
        ("model too big for the catalog", ["optimize", "--model", f["huge_model.yaml"]], 3, {"max_chars": 300}),
        ("co-located, model too big", ["optimize", "--model", f["huge_model.yaml"], "--no-split"], 3, {"max_chars": 300}),
        ("reserve above the GPU", ["optimize", "--engine", f["reserve.yaml"]], 2, {"max_chars": 300}),
        ("export to a full stdout", ["export", plan, "--to", "vllm"], 2, {"stdout": "/dev/full"}),
        ("optimize json to a full stdout", ["optimize", "--format", "json", "--rate", "2", "--duration", "20", *QUICK], 2,
         {"stdout": "/dev/full"}),
        ("simulate --concurrency 100000 (bound)", ["simulate", *SIM, "--concurrency", "100000"], 0, {}),
        ("simulate --concurrency 100001", ["simulate", *SIM, "--concurrency", "100001"], 2, {}),
        ("simulate 1 client, 1M requests (bound)", ["simulate", *SIM, "--concurrency", "1", "--num-requests", "1000000",
                                                    "--isl", "1", "--osl", "1"], 0, {}),
        ("simulate 1 client, 20M requests", ["simulate", *SIM, "--concurrency", "1", "--num-requests", "20000000",
                                             "--isl", "1", "--osl", "1"], 2, {}),
        ("simulate 100 x 1M-token outputs", ["simulate", "--prompt-pool", "h200-141gb:8:1", "--token-pool", "h200-141gb:8:1",
                                             "--model", "llama4-maverick", "--engine", "lean-fp8", "--concurrency", "1",
                                             "--num-requests", "100", "--isl", "1", "--osl", "1000000"], 2, {}),
        ("simulate --isl 8192 on a 4k model", ["simulate", *SIM, "--concurrency", "2", "--isl", "8192"], 2, {}),
        ("optimize --concurrency 512 (bound)", ["optimize", "--concurrency", "512"], 0, {}),
        ("optimize --concurrency 100000", ["optimize", "--concurrency", "100000", "--isl", "1", "--osl", "1"], 2, {}),
        ("optimize 512 clients x 10k requests (bound)", ["optimize", "--concurrency", "512", "--num-requests", "10000",
                                                         "--isl", "1", "--osl", "1"], 0, {}),
    ]
    return out


def cases(f: dict[str, str], d: Path) -> list[tuple[str, list[str], int]]:
    """(name, splitplan arguments, expected exit code)."""
    out = [(f"optimize --rate {v}", ["optimize", "--rate", v, *QUICK], 2) for v in ("nan", "inf", "-inf", "1e12", "0")]
    out += [(f"optimize --duration {v}", ["optimize", "--rate", "3", "--duration", v, *QUICK], 2) for v in ("nan", "1e15")]
    out += [
        ("optimize --seed -1", ["optimize", "--rate", "3", "--duration", "20", "--seed", "-1", *QUICK], 2),
        ("optimize --seed 2**70", ["optimize", "--rate", "3", "--duration", "20", "--seed", str(2 ** 70), *QUICK], 2),
        ("optimize --max-power-kw nan", ["optimize", "--max-power-kw", "nan", *QUICK], 2),
        ("optimize --max-cost-per-hour -5", ["optimize", "--max-cost-per-hour", "-5", *QUICK], 2),
        ("optimize --max-machines h100-80gb=10**9", ["optimize", "--max-machines", "h100-80gb=1000000000", *QUICK], 2),
        ("optimize --max-batch-tokens 0", ["optimize", "--max-batch-tokens", "0", *QUICK], 2),
        ("optimize --max-requests 0", ["optimize", "--max-requests", "0", *QUICK], 2),
        ("optimize --jobs -3", ["optimize", "--jobs", "-3", *QUICK], 2),
        ("optimize --concurrency 10**9", ["optimize", "--concurrency", "1000000000", *QUICK], 2),
        ("optimize --hardware ''", ["optimize", "--hardware", "", "--tp", "8"], 2),
        ("optimize --hardware ','", ["optimize", "--hardware", ",", "--tp", "8"], 2),
        ("optimize --tp 3", ["optimize", "--hardware", "h100-80gb", "--tp", "3"], 2),
        ("optimize 7-GPU machine --tp 8", ["optimize", "--hardware", f["seven.yaml"], "--tp", "8"], 2),
        ("optimize same name twice", ["optimize", "--hardware", f"h100-80gb,{f['my-h100.yaml']}", "--tp", "8"], 2),
        ("optimize same entry twice", ["optimize", "--hardware", "h100-80gb,h100-80gb", "--tp", "8"], 0),  # counted once
        ("sweep --rates nan", ["sweep", "--rates", "nan", *SIM], 2),
        ("sweep --rates 1e12", ["sweep", "--rates", "1e12", *SIM], 2),
        ("sweep --rates 1:2:10**9", ["sweep", "--rates", "1:2:1000000000", *SIM], 2),
        ("simulate pool of 1e8 machines", ["simulate", "--prompt-pool", "h100-80gb:8:100000000", "--token-pool",
                                           "h100-80gb:8:1"], 2),
        ("simulate --plan with 1e8 machines", ["simulate", "--plan", f["huge_plan.json"]], 2),
        ("simulate --plan deeply nested", ["simulate", "--plan", f["deep_plan.json"]], 2),
        ("simulate --rate inf", ["simulate", "--rate", "inf", *SIM], 2),
        ("perf --prefill 1e9x1e9", ["perf", "--prefill", "1000000000x1000000000"], 2),
        ("perf --decode 1e9x1e9", ["perf", "--decode", "1000000000x1000000000"], 2),
        ("compare --max-power-kw nan", ["compare", "--scenario", "iso-power", "--max-power-kw", "nan"], 2),
        ("trace: tokens beyond int64", ["trace", "summarize", f["huge_tokens.csv"]], 2),
        ("trace: tokens at int64 max", ["trace", "summarize", f["int64_edge.csv"]], 2),
        ("trace: row with extra fields", ["trace", "summarize", f["extra_fields.csv"]], 2),
        ("trace: time 1e300 s", ["trace", "summarize", f["far_future.csv"]], 2),
        ("trace: nanoseconds as seconds", ["trace", "summarize", f["ns_as_s.csv"]], 2),
        ("trace: mixed UTC offsets", ["trace", "summarize", f["mixed_offsets.csv"]], 0),
        ("trace: 5 MB cell", ["trace", "summarize", f["big_cell.csv"]], 2),
        ("trace: malformed JSONL line", ["trace", "summarize", f["bad_line.jsonl"]], 2),
        ("trace: gzip bomb", ["trace", "summarize", f["bomb.csv.gz"]], 2),
        ("trace: FIFO", ["trace", "summarize", f["fifo"]], 2),
        ("trace: /dev/zero", ["trace", "summarize", "/dev/zero"], 2),
        ("optimize --trace FIFO", ["optimize", "--trace", f["fifo"], *QUICK], 2),
        ("hardware /dev/zero", ["perf", "--hardware", "/dev/zero"], 2),
        ("slo FIFO", ["optimize", "--slo", f["fifo"], *QUICK], 2),
        ("slo deeply nested YAML", ["optimize", "--slo", f["deep.yaml"], *QUICK], 2),
        ("slo deeply nested JSON", ["optimize", "--slo", f["deep.json"], *QUICK], 2),
        ("slo of 1 MiB (the bound)", ["optimize", "--slo", f["spec_at_bound.yaml"], *QUICK], 2),
        ("slo: YAML alias bomb", ["optimize", "--slo", f["laughs.yaml"], *QUICK], 2),
        ("perf-db of 63 MiB (the bound is 64)", ["perf", "--model", "llama2-70b", "--hardware", "a100-80gb",
                                                 "--perf-db", f["db_at_bound.csv"]], 0),
        ("slo duplicate keys JSON", ["optimize", "--slo", f["dup.json"], *QUICK], 2),
        ("hardware duplicate keys YAML", ["perf", "--hardware", f["dup.yaml"]], 2),
        ("slo: file content not echoed", ["optimize", "--slo", f["secret.yaml"], *QUICK], 2),
        ("perf-db with inf", ["perf", "--model", "llama2-70b", "--hardware", "a100-80gb", "--perf-db", f["inf_db.csv"]], 2),
        ("perf-db with TP 'two'", ["perf", "--model", "llama2-70b", "--hardware", "a100-80gb", "--perf-db", f["tp_text.csv"]], 2),
        ("output-dir is a file", ["optimize", "--rate", "3", "--duration", "20", *QUICK, "--output-dir", f["a_file"]], 2),
        *([] if os.geteuid() == 0 else  # (root writes anywhere)
          [("output-dir unwritable", ["optimize", "--rate", "3", "--duration", "20", *QUICK, "--output-dir", str(d / "ro" / "x")], 2)]),
        ("output-dir under a file", ["optimize", "--rate", "3", "--duration", "20", *QUICK, "--output-dir", f["a_file"] + "/x"], 2),
        ("output-dir under /proc", ["optimize", "--rate", "3", "--duration", "20", *QUICK, "--output-dir", "/proc/splitplan"], 2),
        ("output-dir candidates.csv a dir", ["optimize", "--rate", "3", "--duration", "20", *QUICK, "--output-dir",
                                             str(d / "candir")], 2),
        ("sweep --output a directory", ["sweep", "--rates", "2", "--duration", "20", *SIM, "--output", str(d)], 2),
        ("sweep --output in a new folder", ["sweep", "--rates", "2", "--duration", "20", *SIM, "--output",
                                            str(d / "new" / "s.csv")], 0),  # made, as --output-dir is
        ("--plot under /proc", ["sweep", "--rates", "2", "--duration", "20", *SIM, "--plot", "/proc/x.png"], 2),
    ]
    return out + _issue_26_cases(f)


def run_case(args: list[str], cap_mb: int, timeout_s: float, cwd: Path, stdout: str | None = None) -> tuple[int | None, str, float, float]:
    """(exit code or None on timeout, stderr, seconds, peak RSS MB of that process)."""
    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (cap_mb << 20, cap_mb << 20))
    start = time.monotonic()
    with tempfile.TemporaryFile() as err, open(stdout or os.devnull, "w") as out:
        proc = subprocess.Popen([sys.executable, "-c", "from splitplan.cli import main; main()", *args], cwd=cwd,
                                stdout=out, stderr=err, stdin=subprocess.DEVNULL, preexec_fn=limit,
                                env={**os.environ, "PYTHONPATH": str(ROOT)})
        timer = threading.Timer(timeout_s, proc.kill)
        timer.start()
        _, status, usage = os.wait4(proc.pid, 0)
        timed_out = not timer.is_alive()
        timer.cancel()
        proc.returncode = os.waitstatus_to_exitcode(status)
        err.seek(0)
        text = err.read().decode(errors="replace")
    return (None if timed_out else proc.returncode), text, time.monotonic() - start, usage.ru_maxrss / 1024


def verdict(expected: int, code: int | None, err: str, forbid: tuple = (), max_chars: int = 400) -> str:
    if code is None:
        return "timed out"
    leaked = [x for x in forbid if x in err]
    if leaked:
        return f"stderr shows {leaked[0]!r}"
    if code != expected:
        last = err.strip().splitlines()[-1][:120] if err.strip() else ""
        return f"exit {code}, expected {expected}: {last}"
    if expected != 0:
        lines = [x for x in err.splitlines() if x.strip() and not x.startswith("warning:")]
        if len(lines) != 1 or not lines[0].startswith("error: ") or len(lines[0]) > max_chars:
            return f"stderr is not one short error line ({len(lines)} lines, {len(err)} chars)"
    return "ok"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="")
    parser.add_argument("--cap-mb", type=int, default=2048)
    parser.add_argument("--timeout-s", type=float, default=60.0)
    opts = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="splitplan-adversarial-"))
    try:
        todo = [c for c in cases(_files(folder), folder) if opts.only in c[0]]
        failed = 0
        print(f"{'case':<40} {'exit':>4} {'s':>6} {'RSS MB':>7}  verdict")
        for name, args, expected, *extra in todo:
            extra = extra[0] if extra else {}
            code, err, seconds, rss_mb = run_case(args, opts.cap_mb, opts.timeout_s, folder, extra.get("stdout"))
            v = verdict(expected, code, err, tuple(extra.get("forbid", ())), extra.get("max_chars", 400))
            if v == "ok" and (folder / "pwned").exists():
                v = "an injected command ran (pwned exists)"
            failed += v != "ok"
            print(f"{name:<40} {str(code):>4} {seconds:6.1f} {rss_mb:7.0f}  {v}")
        print(f"{len(todo) - failed} passed, {failed} failed")
        return 1 if failed else 0
    finally:
        os.chmod(folder / "ro", 0o700)
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
