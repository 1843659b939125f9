"""From plan to deployment: a plan.json as the engines people run take it (`splitplan export`).

A plan's pools become worker groups: prompt pools prefill workers, token pools decode workers,
a co-located pool aggregated workers; each pool's machines hold `instances` model instances in
its layout (specs.layout), one worker (replica) each, over one machine or several. Every target
states the engine version it was written for and maps every plan field it uses
(`Export.mapping`); plan fields it cannot express are listed (`Export.unexpressed`), never dropped
silently; a layout the engine cannot run is an error (exit 2).

Targets: `dynamo` (export.dynamo), `llm-d` (export.llmd), `vllm` and `sglang` (export.launch).
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field

from splitplan.errors import SpecError
from splitplan.specs.engine import EngineProfile, load_engine
from splitplan.specs.hardware import HardwareSpec, load_hardware
from splitplan.specs.layout import Layout
from splitplan.specs.model import ModelSpec, load_model

TARGETS = ("dynamo", "llm-d", "vllm", "sglang")
BACKENDS = ("vllm", "sglang")
# The engine versions every target is written for: Dynamo 1.6.1 and the vLLM and SGLang it pins
# (ai-dynamo 1.6.1's extras: vllm 0.31.0, sglang 0.5.21); llm-d 0.8.0 (its guides' sidecar tag).
VERSIONS = {"dynamo": "1.6.1", "llm-d": "0.8.0", "vllm": "0.31.0", "sglang": "0.5.21"}
ROLE_NAMES = {"prompt": "prefill", "token": "decode", "mixed": "worker"}


@dataclass(frozen=True)
class Group:
    """One pool of the plan: `machines` machines of `hardware`, instances in `layout`."""

    role: str  # prompt, token or mixed
    hardware: HardwareSpec
    layout: Layout
    machines: int

    @property
    def nodes_per_instance(self) -> int:
        return self.layout.unit(self.hardware.gpus_per_machine)[0]

    @property
    def instances_per_machine(self) -> int:
        """Instances sharing a machine (1 when an instance spans machines)."""
        return self.layout.unit(self.hardware.gpus_per_machine)[1]

    @property
    def gpus_per_node(self) -> int:
        return min(self.layout.gpus, self.hardware.gpus_per_machine)

    @property
    def instances(self) -> int:
        return self.machines // self.nodes_per_instance * self.instances_per_machine

    @property
    def name(self) -> str:
        return f"{ROLE_NAMES[self.role]}-{self.hardware.name}-{self.layout.spec}"


@dataclass(frozen=True)
class Deployment:
    """What a plan asks to run: the model (and the repository to serve), the engine settings the
    plan was sized with, and the pools."""

    source: str
    model: ModelSpec
    model_id: str
    engine: EngineProfile
    max_batch_tokens: int
    groups: tuple[Group, ...]

    @property
    def name(self) -> str:
        """The deployment's Kubernetes name (and llm-d's model label): splitplan-MODEL."""
        return re.sub(r"[^a-z0-9-]+", "-", f"splitplan-{self.model.name}".lower()).strip("-")[:63]

    @property
    def split(self) -> bool:
        return any(g.role != "mixed" for g in self.groups)


@dataclass
class Export:
    target: str
    version: str  # what the files were written for
    files: dict[str, str]  # name -> text; the first is the main one
    mapping: list[tuple[str, str]] = field(default_factory=list)  # (plan field, where it went)
    unexpressed: list[str] = field(default_factory=list)  # plan facts the target cannot say, and why
    apply: str = ""  # the commands that apply the files, where they are not in the files themselves

    def report(self) -> str:
        """EXPORT.md: what was written for which version, the mapping, and what was not expressed."""
        lines = [f"# splitplan export --to {self.target}", "", f"Written for {self.version}.", "",
                 "| plan field | becomes |", "|---|---|"]
        lines += [f"| {a} | {b} |" for a, b in self.mapping]
        lines += ["", "Not expressed:" if self.unexpressed else "Every plan field used is expressed.", ""]
        lines += [f"- {u}" for u in self.unexpressed]
        if self.apply:
            lines += ["", "To apply:", "", "```bash", self.apply, "```"]
        return "\n".join(lines) + "\n"


def deployment(pools, inputs: dict, source: str, model_id: str | None = None) -> Deployment:
    """The Deployment of a plan's pools (role, hardware, layout, machines) and input echo (as
    cli.common.read_plan reads plan.json); SpecError when the model names no repository to serve
    or a pool does not hold whole instances."""
    model = load_model(str(inputs.get("model") or "llama2-70b"))
    repo = model_id or model.hf_repo
    if not repo:
        raise SpecError(f"{source}: model {model.name} names no Hugging Face repository (hf_repo); give --model-id ORG/NAME")
    engine = load_engine(str(inputs.get("engine") or "lean"))
    groups = tuple(Group(role, load_hardware(hw), layout, machines) for role, hw, layout, machines in pools)
    for g in groups:  # (read_plan has checked each pool holds at least one machine)
        g.layout.require_whole(g.machines, g.hardware.gpus_per_machine, f"{source}: {g.role} pool "
                               f"{g.hardware.name}:{g.layout.spec}:{g.machines}")
    return Deployment(source, model, repo, engine, int(inputs.get("max_batch_tokens") or 2048), groups)


def export(dep: Deployment, target: str, backend: str | None = None, image: str | None = None) -> Export:
    """The files of `target` for the deployment. `backend` (dynamo: vllm or sglang) defaults to the
    plan's engine where it is one of them; `image` replaces the target's container image."""
    if target not in TARGETS:
        raise SpecError(f"--to {target}: choose {', '.join(TARGETS)}")
    if target == "dynamo":
        from splitplan.export.dynamo import dynamo
        return dynamo(dep, backend or _backend_of(dep), image)
    runs = "vllm" if target == "llm-d" else target
    if backend not in (None, runs):
        raise SpecError(f"--backend {backend}: --to {target} runs {runs}; --backend is for --to dynamo")
    if target == "llm-d":
        from splitplan.export.llmd import llmd
        return llmd(dep, image)
    from splitplan.export.launch import launch
    return launch(dep, target, image)


def _backend_of(dep: Deployment) -> str:
    for b in BACKENDS:
        if dep.engine.name.startswith(b):
            return b
    raise SpecError(f"the plan was sized with engine {dep.engine.name}, which Dynamo does not run as such; "
                    f"give --backend {' or '.join(BACKENDS)}")


def shell_words(cmd: list[str]) -> str:
    """A command as shell words: a word holding `$` in double quotes, for the shell to expand (a
    host variable, LWS's LWS_LEADER_ADDRESS, an arithmetic rank) as one word; the rest quoted."""
    return " ".join(f'"{w}"' if "$" in w else shlex.quote(w) for w in cmd)


def common_mapping(dep: Deployment, engine: str) -> tuple[list[tuple[str, str]], list[str]]:
    """The mapping rows and the unexpressed facts every target shares (`engine`: what runs)."""
    mapping = [("inputs.model", f"the served model {dep.model_id}")]
    unexpressed = [] if dep.engine.name.startswith(engine) else [
        f"inputs.engine {dep.engine.name}: the plan was sized with that engine's timing, not {engine}'s; "
        f"re-plan with --engine {engine}-fp8 to size for {engine}"]
    for g in dep.groups:
        mapping.append((f"{g.role}_pools[{g.hardware.name}].machines, layout",
                        f"{g.instances} {ROLE_NAMES[g.role]} worker(s) of {g.layout.gpus} GPU(s) ({g.layout})"
                        + (f", each over {g.nodes_per_instance} nodes" if g.nodes_per_instance > 1 else "")))
        unexpressed.append(f"{g.role}_pools[{g.hardware.name}].hardware: the machine type is not selected; pin the "
                           f"workers to {g.hardware.gpu.name} nodes with your cluster's node labels")
    if dep.engine.weights != "bf16":
        unexpressed.append(f"inputs.engine weights={dep.engine.weights}: serve a {dep.engine.weights} checkpoint "
                           f"(--model-id); the engines read the precision from it")
    unexpressed.append("plan.cost_usd_per_hour, power_kw, predicted, slo: plan figures, not deployment settings")
    return mapping, unexpressed
