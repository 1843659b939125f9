"""The engine flags `splitplan export` writes, against the engines' own argument definitions.

    python bench/export_flags.py --sglang DIR --vllm DIR

DIR: an unpacked wheel of the version the export is written for (sglang 0.5.21, vllm 0.31.0),
which the test suite cannot install (each pulls in torch and a CUDA stack):

    pip download --no-deps -d W sglang==0.5.21 vllm==0.31.0
    unzip -q W/sglang-*.whl -d SG && unzip -q W/vllm-*.whl 'vllm/engine/*' 'vllm/entrypoints/*' -d VL
    pip install --target DEPS psutil pybase64 msgspec pyzmq tqdm ipython triton torch==2.13.0
    PYTHONPATH=DEPS python bench/export_flags.py --sglang SG --vllm VL

SGLang: every launch.sh and Dynamo worker command of a set of layouts goes through SGLang's own
parser (ServerArgs.add_cli_args); a flag it does not define is an error, and an abbreviation is
reported (argparse accepts unambiguous prefixes, which a new flag can make ambiguous). vLLM's
parser cannot be imported without its whole stack, so each vLLM flag is looked up in the files
that define `vllm serve`'s arguments (SOURCES): as the literal flag or as the dataclass field
(EngineArgs, the API server's) that vLLM derives it from. Exits 1 when a flag is not found.
"""

from __future__ import annotations

import argparse
import re
import shlex
import sys
from pathlib import Path

import yaml

from splitplan.deploy import deployment, export
from splitplan.specs.layout import Layout

# where vLLM 0.31.0 defines the flags of `vllm serve` (the engine's, and the API server's)
SOURCES = ("vllm/engine/arg_utils.py", "vllm/entrypoints/cli/serve.py", "vllm/entrypoints/launchers/cli_args.py")
POOLS = [  # one machine, several per machine, DP over nodes, TP over trays, TP x PP, partial EP
    [("prompt", "h200-141gb", Layout(8), 2), ("prompt", "gb200-nvl72", Layout(8), 2), ("prompt", "h100-80gb", Layout(8, 1, 1, 2), 2),
     ("token", "h200-141gb", Layout(1, 16, 16), 2), ("token", "h200-141gb", Layout(8, 2, 16), 4)],
    [("prompt", "h100-80gb", Layout(2), 1), ("token", "h200-141gb", Layout(4, 2, 4), 1)],
    [("mixed", "h100-80gb", Layout(4), 1)],
]


PROGRAMS = (["exec"], ["python3", "-m", "sglang.launch_server"], ["vllm", "serve"])


def _args(words: list[str]) -> list[str]:
    """A command's arguments: its leading program words (`exec`, the engine's launcher) removed."""
    for program in PROGRAMS:
        if words[:len(program)] == program:
            words = words[len(program):]
    return words


def _engine_commands(engine: str) -> list[list[str]]:
    """The engine's argument lists over every target that runs it (program words removed)."""
    out = []
    for pools in POOLS:
        if engine == "vllm" and any(lay.ep not in (1, lay.tp * lay.dp) for _, _, lay, _ in pools):
            continue  # a layout vLLM cannot run is refused by the export (tests/export)
        dep = deployment(pools, {"model": "deepseek-v3", "engine": f"{engine}-fp8"}, "bench")
        script = export(dep, engine).files["launch.sh"]
        out += [shlex.split(line) for line in script.splitlines()
                if line.lstrip().startswith(("python3 -m sglang.launch_server", "vllm serve"))]
        doc = yaml.safe_load(export(dep, "dynamo", engine).files["dynamo.yaml"])
        out += [c["podTemplate"]["spec"]["containers"][0]["args"] for c in doc["spec"]["components"][1:]]
        if engine == "vllm":
            for d in list(yaml.safe_load_all(export(dep, "llm-d").files["llm-d.yaml"]))[1:]:
                group = d["spec"].get("leaderWorkerTemplate", {})
                pods = [d["spec"]["template"]] if d["kind"] == "Deployment" else [
                    group[k] for k in ("leaderTemplate", "workerTemplate") if k in group]
                out += [shlex.split(line) for pod in pods
                        for line in pod["spec"]["containers"][0]["args"][0].splitlines() if "vllm serve" in line]
    return [_args(cmd) for cmd in out]


def check_sglang(root: Path) -> list[str]:
    sys.path.insert(0, str(root))
    from sglang.srt.server_args import ServerArgs  # noqa: PLC0415 (from the unpacked wheel)

    parser = argparse.ArgumentParser(exit_on_error=False, allow_abbrev=False)
    ServerArgs.add_cli_args(parser)
    problems, flags = [], set()
    for args in _engine_commands("sglang"):
        flags |= {a for a in args if a.startswith("--")}
        try:
            unknown = parser.parse_known_args(args)[1]
        except argparse.ArgumentError as e:
            unknown = [str(e)]
        problems += [f"sglang: {u} not defined, in {' '.join(args)}" for u in unknown]
    if not problems:
        print(f"sglang: {len(flags)} flags, every command parsed by ServerArgs without abbreviations")
    return problems


def check_vllm(root: Path) -> list[str]:
    source = "".join((root / p).read_text() for p in SOURCES)
    fields = set(re.findall(r"^    (\w+): ", source, re.M))
    flags = {a for args in _engine_commands("vllm") for a in args if a.startswith("--")}
    missing = sorted(f for f in flags if f'"{f}"' not in source and f[2:].replace("-", "_") not in fields)
    print(f"vllm: {len(flags)} flags, {len(flags) - len(missing)} found in {', '.join(SOURCES)}")
    return [f"vllm: {f} not found" for f in missing]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sglang", type=Path, required=True, help="an unpacked sglang 0.5.21 wheel")
    parser.add_argument("--vllm", type=Path, required=True, help="an unpacked vllm 0.31.0 wheel")
    args = parser.parse_args()
    problems = check_sglang(args.sglang) + check_vllm(args.vllm)
    for p in problems:
        print(p)
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
