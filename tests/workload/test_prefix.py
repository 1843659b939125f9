"""Issue 29, item 1: shared prefixes read from traces, and the reuse a cache that never evicts sees."""

import gzip
import json

import numpy as np
import pytest
from typer.testing import CliRunner

from splitplan.base.errors import TraceError
from splitplan.cli import app
from splitplan.workload.prefix import MOONCAKE_BLOCK_TOKENS, infinite_cache_reuse
from splitplan.workload.trace import load_trace, peak_window, resample_poisson, summarize
from tests.conftest import DATA

runner = CliRunner()


def _hits(trace):
    return infinite_cache_reuse(trace.prefix, trace.prompt_tokens, trace.output_tokens)["hit_tokens"].tolist()


def test_prefix_id_rows_share_their_prefix_after_its_first_use(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("arrival_s,prompt_tokens,output_tokens,prefix_id,prefix_tokens\n"
                    "0,500,10,sys-a,100\n1,600,10,sys-b,200\n2,700,10,sys-a,100\n3,800,10,,\n4,150,10,sys-b,150\n")
    with pytest.raises(TraceError):  # (one id, two lengths: see the error test below)
        load_trace(path)
    path.write_text(path.read_text().replace("4,150,10,sys-b,150", "4,150,10,sys-b,200"))
    with pytest.raises(TraceError):  # 200 shared tokens in a 150-token prompt
        load_trace(path)
    path.write_text(path.read_text().replace("4,150,10,sys-b,200", "4,250,10,sys-b,200"))
    trace = load_trace(path)
    assert trace.prefix.shared_tokens(trace.prompt_tokens).tolist() == [100, 200, 100, 0, 200]
    assert _hits(trace) == [0, 0, 100, 0, 200]
    s = summarize(trace)["prefix_reuse"]
    assert s["infinite_cache_hit_rate"] == pytest.approx(300 / 2850)
    assert s["requests_with_a_hit"] == pytest.approx(2 / 5)


def test_a_sessions_next_turn_reuses_its_previous_prompt_and_answer(tmp_path):
    path = tmp_path / "t.csv"
    # turn 1: 300 prompt + 50 out; turn 2 holds both (350) and adds 100; a turn that cut its
    # context (200 < 300) shares what it keeps of the first prompt; a new session shares nothing.
    path.write_text("arrival_s,prompt_tokens,output_tokens,session_id\n"
                    "0,300,50,s1\n1,400,20,s2\n5,450,40,s1\n6,200,10,s1\n7,90,10,s3\n")
    trace = load_trace(path)
    assert _hits(trace) == [0, 0, 350, 199, 0]


def test_rows_without_a_prefix_may_say_so_with_empty_cells_or_zero_tokens(tmp_path):
    """Issue 54, item 11: `prefix_tokens` 0 with no prefix_id is what users write for no prefix; an
    empty session_id is a request of its own, not one session every such row shares."""
    path = tmp_path / "t.csv"
    path.write_text("arrival_s,prompt_tokens,output_tokens,prefix_id,prefix_tokens\n0,500,10,,0\n1,500,10,a,100\n"
                    "2,500,10,,0.0\n3,500,10,a,100\n")
    assert _hits(load_trace(path)) == [0, 0, 0, 100]
    path.write_text("arrival_s,prompt_tokens,output_tokens,session_id\n0,300,50,\n1,400,20,\n2,450,40,\n")
    trace = load_trace(path)
    assert _hits(trace) == [0, 0, 0] and summarize(trace)["prefix_reuse"]["infinite_cache_hit_rate"] == 0


def test_mooncake_hash_ids_are_chains_of_512_token_blocks(tmp_path):
    path = tmp_path / "m.jsonl"
    rows = [{"timestamp": 0, "input_length": 1500, "output_length": 5, "hash_ids": [1, 2, 3]},
            {"timestamp": 1, "input_length": 1100, "output_length": 5, "hash_ids": [1, 2, 4]},
            {"timestamp": 2, "input_length": 1024, "output_length": 5, "hash_ids": [1, 2]},
            {"timestamp": 3, "input_length": 900, "output_length": 5, "hash_ids": [5, 2]}]  # block 2 behind another
    path.write_text("\n".join(json.dumps(r) for r in rows))
    trace = load_trace(path)
    assert _hits(trace) == [0, 2 * MOONCAKE_BLOCK_TOKENS, 1023, 0]


def _leading_block_hits(rows) -> float:
    """Brute force: a block is a hit when the whole chain up to it was seen before."""
    seen, hits, blocks = set(), 0, 0
    for row in rows:
        chain, leading = (), True
        for block in row["hash_ids"]:
            chain += (block,)
            blocks += 1
            leading = leading and chain in seen
            hits += leading
            seen.add(chain)
    return hits / blocks


def test_mooncake_reuse_agrees_with_a_brute_force_replay():
    """The issue's figure: 37 % of the Mooncake conversation trace's prompt blocks could come
    from an unbounded cache (leading-block chains); by tokens (each request's last token always
    computed) within a point."""
    with gzip.open(DATA / "mooncake_conversation.jsonl.gz") as f:
        rows = [json.loads(line) for line in f]
    reuse = summarize(load_trace(DATA / "mooncake_conversation.jsonl.gz"))["prefix_reuse"]
    assert _leading_block_hits(rows) == pytest.approx(0.37, abs=0.01)
    assert reuse["infinite_cache_hit_rate"] == pytest.approx(_leading_block_hits(rows), abs=0.01)
    assert reuse["requests_with_a_hit"] > 0.99


def test_resampling_and_windows_keep_each_requests_prefix():
    trace = load_trace(DATA / "mooncake_conversation.jsonl.gz")
    rows = set(zip(trace.prompt_tokens.tolist(), trace.output_tokens.tolist(), trace.prefix.request_node.tolist(), strict=True))
    resampled = resample_poisson(trace, 5.0, 60.0, np.random.default_rng(1))
    assert len(resampled) > 200 and set(zip(resampled.prompt_tokens.tolist(), resampled.output_tokens.tolist(),
                                            resampled.prefix.request_node.tolist(), strict=True)) <= rows
    window, info = peak_window(trace, 100)
    start = int(np.searchsorted(trace.arrival_s, info["start_s"]))
    assert window.prefix.request_node.tolist() == trace.prefix.request_node[start:start + 100].tolist()


def test_shared_prefix_options_give_inference_perfs_groups():
    out = runner.invoke(app, ["trace", "summarize", "azure-code", "--shared-prefix-tokens", "100", "--prefix-groups", "9",
                              "--format", "json"])
    assert out.exit_code == 0, out.output
    reuse = json.loads(out.output)["prefix_reuse"]
    assert reuse["distinct_prefix_nodes"] == 9
    assert reuse["hit_tokens_p50"] == 100
    assert reuse["requests_with_a_hit"] == pytest.approx(1 - 9 / 8819)


@pytest.mark.parametrize("text, needle", [
    ("arrival_s,prompt_tokens,output_tokens,prefix_id,prefix_tokens\n0,100,5,a,101\n", "line 2: prefix_tokens 101 is above"),
    ("arrival_s,prompt_tokens,output_tokens,prefix_id\n0,100,5,a\n", "prefix_id without a prefix_tokens column"),
    ("arrival_s,prompt_tokens,output_tokens,prefix_tokens\n0,100,5,50\n", "prefix_tokens without a prefix_id column"),
    ("arrival_s,prompt_tokens,output_tokens,prefix_id,prefix_tokens\n0,100,5,a,50\n1,100,5,a,\n", "line 3: a prefix_id needs"),
    ("arrival_s,prompt_tokens,output_tokens,prefix_id,prefix_tokens\n0,100,5,a,-3\n", "line 2: prefix_tokens '-3' is not"),
    ("arrival_s,prompt_tokens,output_tokens,prefix_id,prefix_tokens\n0,100,5,a,inf\n", "line 2: prefix_tokens 'inf' is not"),
    ("arrival_s,prompt_tokens,output_tokens,prefix_id,prefix_tokens\n0,100,5,,5\n", "line 2: a prefix_id needs"),
    ("arrival_s,prompt_tokens,output_tokens,prefix_id,prefix_tokens\n0,100,5,a,50\n1,100,5,a,60\n",
     "line 3: prefix_id 'a' has prefix_tokens 60, line 2 gave it 50"),
    ('{"timestamp": 0, "input_length": 10, "output_length": 2, "hash_ids": [1, "x"]}\n', "line 1: hash_ids"),
    ('{"timestamp": 0, "input_length": 10, "output_length": 2, "hash_ids": 7}\n', "is not a list of integers"),
])
def test_bad_prefix_columns_exit_2_naming_the_line(tmp_path, text, needle):
    path = tmp_path / ("t.jsonl" if text.startswith("{") else "t.csv")
    path.write_text(text)
    out = runner.invoke(app, ["trace", "summarize", str(path)])
    assert out.exit_code == 2, out.output
    assert out.output.startswith("error: ") and needle in out.output and "Traceback" not in out.output


@pytest.mark.parametrize("args, needle", [
    (["--shared-prefix-tokens", "100"], "go together"),
    (["--prefix-groups", "3"], "go together"),
    (["--shared-prefix-tokens", "0", "--prefix-groups", "3"], "--shared-prefix-tokens 0"),
    (["--shared-prefix-tokens", "10", "--prefix-groups", "0"], "--prefix-groups 0"),
])
def test_bad_shared_prefix_options_exit_2(args, needle):
    out = runner.invoke(app, ["trace", "summarize", "azure-code", *args])
    assert out.exit_code == 2 and needle in out.output, out.output


def test_a_subset_of_a_trace_keeps_each_requests_prefix():
    """Trace.take (peak windows, --window, the planner's servable requests): every per-request
    field follows the requests picked; --window plans size each window with its own prefixes."""
    trace = load_trace(DATA / "mooncake_conversation.jsonl.gz")
    keep = np.zeros(len(trace), bool)
    keep[10:400:3] = True
    part = trace.take(keep)
    assert part.arrival_s[0] == 0 and np.allclose(part.arrival_s, trace.arrival_s[keep] - trace.arrival_s[keep][0])
    assert np.array_equal(part.prefix.request_node, trace.prefix.request_node[keep])
    assert np.array_equal(part.prompt_tokens, trace.prompt_tokens[keep])
    from splitplan.workflows.studies import plan_windows
    windows = plan_windows(30.0, trace.take(slice(0, 300)), "llama3.1-8b", "chat", hardware=["h100-80gb"])
    plans = [p for p in windows.plans if p is not None]
    assert len(plans) > 1
    assert all(pool.prefix_hit_rate is not None for p in plans for pool in p.prompt_pools + p.mixed_pools)
