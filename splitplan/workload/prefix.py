"""Shared prompt prefixes of a trace, as a tree (a radix tree of token runs, as SGLang's cache keeps).

A node is a run of tokens that follows its parent's (`parent`, -1 for the root); a request's
prompt starts with the path from the root to its node (`request_node`, -1: nothing it could
share), clipped to the prompt. Requests whose paths meet share those tokens, and an engine's
prefix cache that still holds them need not prefill them again. Where a trace says so, a request's
output is a node too (`output_node`, below its prompt's): a conversation's next turn starts with
the previous turn's prompt and answer.

Built from what traces record:
- a generic CSV's `prefix_id` and `prefix_tokens` (requests of one id share that many leading
  tokens: one node per id);
- Mooncake's `hash_ids` (each a 512-token block, identified by its whole chain: one node per
  distinct leading chain, so a block is shared only behind the same blocks, as engines hash them);
- a `session_id` (each turn's prompt the previous turn's prompt and output, then its own);
- `--shared-prefix-tokens N --prefix-groups K` (inference-perf's `shared_prefix` data: K system
  prompts of N tokens, request i in group i mod K).
Pure data and functions: the simulator's cache and the planner read it, nothing here runs a cache.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

MOONCAKE_BLOCK_TOKENS = 512  # the Mooncake traces' hash_ids block (kvcache-ai/Mooncake, FAST'25 traces README)


@dataclass(frozen=True)
class PrefixTree:
    parent: np.ndarray  # per node, its parent node (-1: the root)
    tokens: np.ndarray  # per node, the tokens it adds to its parent's
    request_node: np.ndarray  # per request, the node its prompt's shared prefix ends at (-1: none)
    output_node: np.ndarray  # per request, the node of its output that a later turn shares (-1: none)

    @cached_property
    def depth(self) -> np.ndarray:
        """Per node, the tokens from the root to its end (parents come before their children);
        computed once per tree."""
        depth = self.tokens.astype(np.int64).copy()
        for node in range(len(depth)):
            if self.parent[node] >= 0:
                depth[node] += depth[self.parent[node]]
        return depth

    def __getstate__(self) -> dict:  # (what is computed from the fields is not pickled: made again where used)
        return {k: self.__dict__[k] for k in ("parent", "tokens", "request_node", "output_node")}

    def take(self, index) -> PrefixTree:
        """The tree for a subset or reordering of the requests (the nodes are kept)."""
        return PrefixTree(self.parent, self.tokens, self.request_node[index], self.output_node[index])

    def shared_tokens(self, prompt_tokens: np.ndarray) -> np.ndarray:
        """Per request, the leading prompt tokens its node's path covers (at most the prompt)."""
        depth = self.depth
        node = self.request_node
        return np.where(node >= 0, np.minimum(depth[np.maximum(node, 0)], prompt_tokens), 0)


class _Builder:
    def __init__(self):
        self.parent: list[int] = []
        self.tokens: list[int] = []

    def node(self, parent: int, tokens: int) -> int:
        self.parent.append(parent)
        self.tokens.append(tokens)
        return len(self.parent) - 1

    def tree(self, request_node, output_node=None) -> PrefixTree:
        n = len(request_node)
        return PrefixTree(np.asarray(self.parent, np.int64), np.asarray(self.tokens, np.int64),
                          np.asarray(request_node, np.int64),
                          np.full(n, -1, np.int64) if output_node is None else np.asarray(output_node, np.int64))


def from_columns(prompt_tokens: np.ndarray, output_tokens: np.ndarray, prefix_id=None, prefix_tokens=None,
                 session_id=None, hash_ids=None, block_tokens: int = MOONCAKE_BLOCK_TOKENS) -> PrefixTree:
    """The tree of a trace's prefix columns (each a sequence per request, or None); the columns
    are checked by the reader, which names their lines. A session's first turn hangs below its
    prefix (`prefix_id` or `hash_ids`); a later turn below the previous turn's output when its
    prompt holds that whole turn, else below the previous prompt when it holds that, else it
    shares what it keeps of the previous prompt."""
    b = _Builder()
    n = len(prompt_tokens)
    request_node = [-1] * n
    output_node = [-1] * n
    by_id: dict = {}
    chains: dict = {}
    last_turn: dict = {}  # session -> (prompt node, output node, prompt tokens, prompt + output tokens)
    for i in range(n):
        node = -1
        if prefix_id is not None and prefix_tokens[i] > 0:
            key = prefix_id[i]
            if key not in by_id:
                by_id[key] = b.node(-1, int(prefix_tokens[i]))
            node = by_id[key]
        if hash_ids is not None:
            for h in hash_ids[i]:
                key = (node, h)
                if key not in chains:
                    chains[key] = b.node(node, block_tokens)
                node = chains[key]
        p, o = int(prompt_tokens[i]), int(output_tokens[i])
        session = None if session_id is None else session_id[i]
        if session is not None:  # (a row without one is a request of its own, as without the column)
            previous = last_turn.get(session)
            if previous is None:  # a first turn: its own tokens below its prefix
                covered = _depth_of(b, node)
                node = b.node(node, p - covered) if p > covered else node
            else:
                prompt_node, answer_node, before, after = previous
                node = (b.node(answer_node, p - after) if p > after
                        else b.node(prompt_node, p - before) if p > before else prompt_node)
            output_node[i] = b.node(node, o)
            last_turn[session] = (node, output_node[i], p, p + o)
        request_node[i] = node
    return b.tree(request_node, output_node)


def _depth_of(b: _Builder, node: int) -> int:
    total = 0
    while node >= 0:
        total += b.tokens[node]
        node = b.parent[node]
    return total


def synthetic(n_requests: int, shared_tokens: int, groups: int) -> PrefixTree:
    """inference-perf's `shared_prefix` data: `groups` system prompts of `shared_tokens` tokens,
    request i in group i mod `groups`."""
    b = _Builder()
    nodes = [b.node(-1, shared_tokens) for _ in range(groups)]
    return b.tree(np.asarray(nodes, np.int64)[np.arange(n_requests) % groups])


def infinite_cache_reuse(tree: PrefixTree, prompt_tokens: np.ndarray, output_tokens: np.ndarray) -> dict:
    """What a cache that never evicts would hold, requests in order, each cached once it
    arrives (its prompt) and its output with it: per request, the leading prompt tokens
    already computed (at most the prompt less one token, which the engine always computes)."""
    depth = tree.depth
    seen = np.zeros(len(depth), bool)
    hit = np.zeros(len(prompt_tokens), np.int64)
    parent = tree.parent
    for i, node in enumerate(tree.request_node.tolist()):
        path = []
        while node >= 0 and not seen[node]:
            path.append(node)
            node = parent[node]
        if node >= 0:
            hit[i] = min(int(depth[node]), int(prompt_tokens[i]) - 1)
        seen[path] = True
        if tree.output_node[i] >= 0:
            seen[tree.output_node[i]] = True
    prompt = float(np.sum(prompt_tokens))
    return {
        "infinite_cache_hit_rate": float(hit.sum() / prompt) if prompt else 0.0,
        "requests_with_a_hit": float(np.mean(hit > 0)) if len(hit) else 0.0,
        "hit_tokens": hit,
    }
