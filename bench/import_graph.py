"""Draw splitplan's import graph by layer and list every arrow that runs back up.

    python bench/import_graph.py [--dot FILE]

Reads every module of `splitplan/` with `ast` (imports at the top and inside functions alike:
a lazy import is still a dependency), maps each to its layer (LAYERS, lowest first: data flows
up, specs and traces in, plans out, reports last) and prints the edges between layers as a
table, then each import from a lower layer into a higher one. Exits 1 if there is any, so the
layering can be checked in CI or by hand. `--dot FILE` writes the layer graph for Graphviz.
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections import Counter
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "splitplan"

# Lowest first, one folder each (the facade and the package's own API aside). A module belongs
# to the layer of the longest prefix it starts with.
LAYERS = [
    ("core", ["splitplan_core"]),  # the compiled engine core (core/splitplan_core.pyx), beside the package
    ("foundations", ["splitplan.base"]),
    ("specs", ["splitplan.specs"]),
    ("workload", ["splitplan.workload"]),
    ("perf", ["splitplan.perf"]),
    ("sim", ["splitplan.sim"]),
    ("capacity", ["splitplan.capacity"]),
    ("search", ["splitplan.search"]),
    ("io", ["splitplan.io"]),
    ("deploy", ["splitplan.deploy"]),
    ("workflows", ["splitplan.workflows"]),
    ("api", ["splitplan.api", "splitplan"]),
    ("cli", ["splitplan.cli"]),
]
RANK = {name: k for k, (name, _) in enumerate(LAYERS)}


def layer(module: str) -> str:
    matches = [(len(p), name) for name, prefixes in LAYERS for p in prefixes if module == p or module.startswith(p + ".")]
    if not matches:
        raise SystemExit(f"{module}: in no layer; add it to LAYERS")
    return max(matches)[1]


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> set[str]:
    """The splitplan modules `path` imports (`from splitplan.x import y` counts as splitplan.x.y
    when y is a module, else splitplan.x)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith("splitplan")}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("splitplan") and not node.level:
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                is_module = (PACKAGE.parent / sub.replace(".", "/")).with_suffix(".py").exists() \
                    or (PACKAGE.parent / sub.replace(".", "/") / "__init__.py").exists()
                out.add(sub if is_module else node.module)
    return out


def edges() -> list[tuple[str, str]]:
    return sorted((module_name(p), target) for p in sorted(PACKAGE.rglob("*.py")) for target in imports(p)
                  if module_name(p) != target)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dot", type=Path)
    args = parser.parse_args()
    found = edges()
    between = Counter((layer(a), layer(b)) for a, b in found if layer(a) != layer(b))
    print("| from layer | to layer | imports |\n|---|---|---|")
    for (a, b), n in sorted(between.items(), key=lambda kv: (RANK[kv[0][0]], RANK[kv[0][1]])):
        print(f"| {a} | {b} | {n} |")
    upward = [(a, b) for a, b in found if RANK[layer(a)] < RANK[layer(b)]]
    print(f"\n{len(upward)} import(s) from a lower layer into a higher one" + (":" if upward else ""))
    for a, b in upward:
        print(f"- {a} ({layer(a)}) imports {b} ({layer(b)})")
    if args.dot:
        lines = ["digraph layers {", "  rankdir=BT;"]
        lines += [f'  "{a}" -> "{b}" [label={n}{", color=red" if RANK[a] < RANK[b] else ""}];' for (a, b), n in between.items()]
        args.dot.write_text("\n".join(lines + ["}"]) + "\n")
    sys.exit(1 if upward else 0)


if __name__ == "__main__":
    main()
