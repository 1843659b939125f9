"""From plan to deployment: a plan.json as the engines people run take it (`splitplan export`).

A plan's pools become worker groups: prompt pools prefill workers, token pools decode workers,
a co-located pool aggregated workers; each pool's machines hold `instances` model instances in
its layout (specs.layout), one worker (replica) each, over one machine or several. Every target
states the engine version it was written for and maps every plan field it uses
(`Export.mapping`); plan fields it cannot express are listed (`Export.unexpressed`), never dropped
silently; a layout the engine cannot run is an error (exit 2).

Targets: `dynamo` (deploy.dynamo), `llm-d` (deploy.llmd), `vllm` and `sglang` (deploy.launch).
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from splitplan.base.errors import SpecError
from splitplan.base.inputs import excerpt, printable
from splitplan.specs.engine import BYTES, EngineProfile, load_engine
from splitplan.specs.hardware import HardwareSpec, label_key_ok, label_value_ok, load_hardware
from splitplan.specs.layout import Layout
from splitplan.specs.model import ModelSpec, load_model
from splitplan.specs.roles import Pool, Role

TARGETS = ("dynamo", "llm-d", "vllm", "sglang")
KUBERNETES_TARGETS = ("dynamo", "llm-d")
MODEL_CACHE_PATH = "/model-cache"
BACKENDS = ("vllm", "sglang")
# The engine versions every target is written for: Dynamo 1.6.1 and the vLLM and SGLang it pins
# (ai-dynamo 1.6.1's extras: vllm 0.31.0, sglang 0.5.21); llm-d 0.8.0 (its guides' sidecar tag).
VERSIONS = {"dynamo": "1.6.1", "llm-d": "0.8.0", "vllm": "0.31.0", "sglang": "0.5.21"}
ROLE_NAMES = {"prompt": "prefill", "token": "decode", "mixed": "worker"}
CPUS_PER_GPU, MEMORY_GIB_PER_GPU = 4, 16  # (a serving pod's requests: Deployment.pod_requests)
CACHE_GIB, STORAGE_SPARE = 10, 1.1  # a pod's ephemeral storage: the engine's compile caches, the checkpoint with 10 % spare


# --- what a value must be to reach a deployment file ----------------------------------------
# Every value from a plan, a spec or an option is checked for its field here, or never written:
# names are slugs (`slug`), the served repository and the image match their registries' grammars,
# and the shell sees each word quoted (`shell_words`).

_SEGMENT = r"[A-Za-z0-9](?:[A-Za-z0-9_.-]{0,94}[A-Za-z0-9])?"
_HF_REPO = re.compile(rf"^(?:{_SEGMENT}/)?{_SEGMENT}$")
_LOCAL_MODEL = re.compile(r"^/[A-Za-z0-9_./-]{1,1023}$")
_DOMAIN = r"(?:[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)(?:\.[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)*(?::[0-9]{1,5})?"
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_IMAGE = re.compile(rf"^(?:(?=[^/]*[.:])(?:{_DOMAIN})/|localhost(?::[0-9]{{1,5}})?/)?"
                    rf"{_COMPONENT}(?:/{_COMPONENT})*(?::[A-Za-z0-9_][A-Za-z0-9_.-]{{0,127}})?"
                    r"(?:@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,})?$")


def model_id(value: str, field: str) -> str:
    """`value` if it is a Hugging Face repository id (`ORG/NAME` or `NAME`: letters, digits, `_`,
    `.` and `-`, starting and ending with a letter or digit, no `--` or `..`, at most 96 each) or
    an absolute local path of such characters; SpecError naming `field` otherwise."""
    ok = (_HF_REPO.match(value) and "--" not in value and ".." not in value and not value.endswith(".git")) or (
        _LOCAL_MODEL.match(value) and "/../" not in value + "/" and "//" not in value)
    if not ok:
        raise SpecError(f"{field} '{excerpt(value)}': not a Hugging Face repository id (ORG/NAME of letters, digits, "
                        "'_', '.', '-') nor an absolute path to a local model; give one")
    return value


def image_ref(value: str, field: str = "--image") -> str:
    """`value` if it is a container image reference ([REGISTRY/]NAME[:TAG][@DIGEST], the grammar of
    the distribution project's reference package: a registry is `localhost` or holds a `.` or `:`,
    a name is lowercase); SpecError naming `field` otherwise."""
    if len(value) > 255 or not _IMAGE.match(value):
        raise SpecError(f"{field} '{excerpt(value)}': not a container image reference ([REGISTRY/]NAME[:TAG][@DIGEST], "
                        "e.g. vllm/vllm-openai:v0.31.0)")
    return value


def slug(text: str, limit: int = 63) -> str:
    """The one rule for every name an export writes (Kubernetes `metadata.name` and label values,
    compose services, launch.sh entries): `text` lowercased, each run of other characters than
    a-z and 0-9 one '-', trimmed of '-' (an RFC 1123 label); where that is not `text` itself, or
    is longer than `limit`, it is cut to leave room for '-' and 8 hex digits of `text`'s SHA-256,
    so that two different texts never share a name."""
    base = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
    if base and base == text and len(base) <= limit:
        return base
    tag = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:8]
    return f"{base[:limit - 9].rstrip('-')}-{tag}" if base else tag


RFC1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


class Expand(str):
    """A shell word splitplan writes itself for the shell to expand (a host variable, LWS's
    LWS_LEADER_ADDRESS, an arithmetic rank): written in double quotes, one word; every other
    word is quoted by `shlex.quote` and reaches the program as written."""


@dataclass(frozen=True)
class Group:
    """One pool of the plan (`roles.Pool`) placed on its machines: `machines` machines of `hardware`,
    instances in `layout`; on machines shared with the other role (`shared`), `instances_given`
    instances, `instances_given / machines` on each after the first `first_gpu` GPUs and `first_slot`
    workers of the pool before it."""

    role: Role
    hardware: HardwareSpec
    layout: Layout
    machines: int
    instances_given: int | None = None
    shared: int | None = None
    first_gpu: int = 0
    first_slot: int = 0

    @property
    def nodes_per_instance(self) -> int:
        return self.layout.unit(self.hardware.gpus_per_machine)[0]

    @property
    def instances_per_machine(self) -> int:
        """Instances on a machine (1 when an instance spans machines)."""
        return self.instances_given // self.machines if self.instances_given else self.layout.unit(self.hardware.gpus_per_machine)[1]

    @property
    def gpus_per_node(self) -> int:
        return min(self.layout.gpus, self.hardware.gpus_per_machine)

    @property
    def instances(self) -> int:
        return self.instances_given or self.machines // self.nodes_per_instance * self.instances_per_machine

    @property
    def name(self) -> str:
        shared = "" if self.shared is None else f"-shared{self.shared}"
        return slug(f"{ROLE_NAMES[self.role]}-{self.hardware.name}-{self.layout.spec}{shared}")


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
    repo_given: bool = False  # the repository came from --model-id, not the model spec's hf_repo
    max_num_seqs: int | None = None  # the plan's sequence cap (None: the engine's default)
    node_selector: tuple[tuple[str, str], ...] | None = None  # --node-selector (None: each machine type's labels)
    model_cache_pvc: str | None = None  # --model-cache-pvc: the claim every pod reads the weights from
    quantization: str | None = None  # the engine's online quantization of the checkpoint to the plan's weights (fp8)

    @property
    def checkpoint_bytes(self) -> float:
        """The served checkpoint's weights: the plan's precision where --model-id gives the repository
        (or the model's own repository holds it), else the repository's own."""
        precision = self.engine.weights if self.repo_given else self.model.hf_repo_weights
        return self.model.total_params * BYTES[precision]

    def pod_requests(self, g: Group) -> dict[str, str]:
        """What a serving pod of `g` requests besides its GPUs: CPUs and memory per GPU as llm-d's
        P/D guide gives its decode pods (16 CPUs and 64 Gi for 4 GPUs; guides/pd-disaggregation,
        2026), and ephemeral storage for the checkpoint it downloads (10 % over its size, plus
        10 Gi for the engine's compile caches; the caches alone where --model-cache-pvc holds it)."""
        storage = CACHE_GIB + (0 if self.model_cache_pvc else math.ceil(self.checkpoint_bytes * STORAGE_SPARE / 2**30))
        return {"cpu": str(CPUS_PER_GPU * g.gpus_per_node), "memory": f"{MEMORY_GIB_PER_GPU * g.gpus_per_node}Gi",
                "ephemeral-storage": f"{storage}Gi"}

    @property
    def name(self) -> str:
        """The deployment's Kubernetes name (and llm-d's model label): splitplan-MODEL."""
        return slug(f"splitplan-{self.model.name}")

    @property
    def split(self) -> bool:
        return any(g.role != "mixed" for g in self.groups)

    def node_labels(self, g: Group) -> dict[str, str]:
        """The labels that place `g`'s pods on its machines: --node-selector, else its machine type's
        (and shape's) `kubernetes_node_labels`."""
        return dict(self.node_selector) if self.node_selector is not None else dict(g.hardware.kubernetes_node_labels)

    def pod_spec(self, g: Group) -> dict:
        """What every pod of `g` adds to its spec (Kubernetes targets): its node selector, the
        toleration of its GPUs' taint (GPU node pools are tainted with the GPU resource's name, as
        GKE's are), and the model-cache volume."""
        spec: dict = {}
        if self.node_labels(g):
            spec["nodeSelector"] = self.node_labels(g)
        spec["tolerations"] = [{"key": g.hardware.kubernetes_gpu_resource, "operator": "Exists", "effect": "NoSchedule"}]
        if self.model_cache_pvc:
            spec["volumes"] = [{"name": "model-cache", "persistentVolumeClaim": {"claimName": self.model_cache_pvc}}]
        return spec

    def container_cache(self) -> tuple[list[dict], list[dict]]:
        """(env, volumeMounts) of a serving container: the weights read from and cached in the
        model-cache volume (HF_HOME, which vLLM and SGLang download to), none without one."""
        if not self.model_cache_pvc:
            return [], []
        return [{"name": "HF_HOME", "value": MODEL_CACHE_PATH}], [{"name": "model-cache", "mountPath": MODEL_CACHE_PATH}]


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
        lines += [f"| {printable(a)} | {printable(b)} |" for a, b in self.mapping]
        lines += ["", "Not expressed:" if self.unexpressed else "Every plan field used is expressed.", ""]
        lines += [f"- {printable(u)}" for u in self.unexpressed]
        if self.apply:
            lines += ["", "To apply:", "", "```bash", self.apply, "```"]
        return "\n".join(lines) + "\n"

    def write(self, folder: Path) -> list[Path]:
        """The files and EXPORT.md written into `folder` as one set (all or none; launch.sh
        executable); the paths written."""
        from splitplan.io import report
        files: dict[Path, str | bytes] = {folder / name: text for name, text in {**self.files, "EXPORT.md": self.report()}.items()}
        report.write_set(files, executable=frozenset({"launch.sh"}))
        return list(files)


def node_selector(values: list[str] | None) -> tuple[tuple[str, str], ...] | None:
    """--node-selector KEY=VALUE (repeated) as label pairs, each checked as a Kubernetes label;
    None when none is given."""
    if not values:
        return None
    pairs = []
    for value in values:
        key, eq, label = value.partition("=")
        if not eq or not label_key_ok(key) or not label_value_ok(label):
            raise SpecError(f"--node-selector '{excerpt(value)}': not KEY=VALUE of a Kubernetes label (KEY: [PREFIX/]NAME, "
                            "VALUE: up to 63 letters, digits, '-', '_', '.'), e.g. nvidia.com/gpu.product=NVIDIA-H100-80GB-HBM3")
        pairs.append((key, label))
    return tuple(pairs)


_CLAIM = re.compile(r"^[a-z0-9](?:[-a-z0-9.]{0,251}[a-z0-9])?$")


def claim_name(value: str | None) -> str | None:
    """--model-cache-pvc NAME if it is a PersistentVolumeClaim name (a DNS subdomain)."""
    if value is not None and not _CLAIM.match(value):
        raise SpecError(f"--model-cache-pvc '{excerpt(value)}': not a PersistentVolumeClaim name (lowercase letters, "
                        "digits, '-' and '.', at most 253)")
    return value


def _require_default_exchange(source: str, engine: EngineProfile, model: ModelSpec, groups: tuple[Group, ...]) -> None:
    """Refuse a plan whose pools exchange experts on kernels the engine takes only from flags export
    does not write (`expert_all_to_all`)."""
    if engine.expert_all_to_all and any(g.layout.exchanges_experts(model.is_moe) for g in groups):
        raise SpecError(f"{printable(source)}: engine {excerpt(engine.name)} prices the expert exchange on "
                        f"{engine.expert_all_to_all}'s kernels (expert_all_to_all), whose engine flags export does not "
                        "write; re-plan with a profile without it to deploy the engines' default exchange")


def deployment(pools: list[Pool], inputs: dict, source: str, model_id_option: str | None = None,
               node_labels: list[str] | None = None, model_cache_pvc: str | None = None) -> Deployment:
    """The Deployment of a plan's pools (role, hardware, layout, machines) and inputs (as
    plan_document.read gives them), with --node-selector and --model-cache-pvc; SpecError when the
    repository to serve is not one (or the model names none), a pool does not hold whole
    instances, a label or claim name is not one, or the plan priced an expert exchange the
    export cannot set."""
    model = load_model(str(inputs["model"]))
    if model_id_option is not None:
        repo = model_id(model_id_option, "--model-id")
    elif model.hf_repo:
        repo = model_id(model.hf_repo, f"model {excerpt(model.name)}: hf_repo")
    else:
        raise SpecError(f"{printable(source)}: model {excerpt(model.name)} names no Hugging Face repository (hf_repo); "
                        "give --model-id ORG/NAME")
    engine = load_engine(str(inputs["engine"]))
    roles = {p.role for p in pools}
    if roles not in ({"prompt", "token"}, {"mixed"}):
        raise SpecError(f"{printable(source)}: pools of roles {', '.join(sorted(roles)) or 'none'}; a plan is split "
                        "(prompt and token pools) or co-located (mixed pools)")
    # (a shared machine's token instances take the GPUs after its prompt instances)
    built: list[Group] = []
    first: dict[int | None, tuple[int, int]] = {}
    for role, hw, layout, machines, count, number in sorted(pools, key=lambda p: (p.role != Role.PROMPT, p.role)):
        gpu, slot = first.get(number, (0, 0))
        built.append(Group(role, load_hardware(hw), layout, machines, count, number, gpu, slot))
        if number is not None and count is not None:  # (a plan's shared pools carry their instances)
            first[number] = (gpu + count // machines * layout.gpus, slot + count // machines)
    groups = tuple(built)
    for g in groups:
        g.layout.require_whole(g.machines, g.hardware.gpus_per_machine, f"{printable(source)}: {g.role} pool "
                               f"{excerpt(g.hardware.name)}:{g.layout.spec}:{g.machines}")
    _require_default_exchange(source, engine, model, groups)
    names = [g.name for g in groups]
    if len(set(names)) != len(names):  # (slugs carry a hash where they differ from the text: a guard)
        raise SpecError(f"{printable(source)}: two pools share the name {excerpt(max(names, key=names.count))}; "
                        "give each machine type its own name")
    # the scheduler the plan was priced with (as simulate --plan replays it): the plan's, else the profile's
    return Deployment(source, model, repo, engine, engine.batch_tokens(inputs.get("max_batch_tokens")), groups,
                      repo_given=model_id_option is not None, max_num_seqs=engine.seqs_cap(inputs.get("max_num_seqs")),
                      node_selector=node_selector(node_labels), model_cache_pvc=claim_name(model_cache_pvc),
                      quantization=None if model_id_option is not None else _online_quantization(source, model, repo, engine, groups))


def _online_quantization(source: str, model: ModelSpec, repo: str, engine: EngineProfile, groups) -> str | None:
    """How the engines serve the model's own repository at the plan's weight precision: None where
    it holds that precision (or a lower one, which loads in less memory than priced); 'fp8' where it
    holds bf16 and every instance loads those weights before quantizing them (vLLM's and SGLang's
    --quantization fp8 quantize after loading at the checkpoint's precision); else a SpecError
    naming --model-id, for the pods would crash-loop out of memory or run at another precision."""
    have, want = model.hf_repo_weights, engine.weights
    if BYTES[have] <= BYTES[want]:
        return None
    fix = (f"give --model-id with an {want} checkpoint of it (ORG/{repo.rsplit('/', 1)[-1]}-{want.upper()} or the like), "
           f"or plan with --weights {have}")
    if want != "fp8":
        raise SpecError(f"{printable(source)}: the plan runs {model.name} with {want} weights, which no engine makes "
                        f"from the {have} weights of {repo} as it loads them: {fix}")
    from splitplan.perf.roofline import Instance
    for g in groups:
        loaded = Instance(model, g.hardware, engine.model_copy(update={"weights_dtype": have}), g.layout)
        if Instance(model, g.hardware, engine, g.layout).fit.fits and not loaded.fit.fits:  # (as planned it fits; as loaded not)
            raise SpecError(f"{printable(source)}: the plan runs {model.name} with fp8 weights; {repo} holds {have} weights, "
                            f"which the engine loads before quantizing them, and at {have} they do not fit its "
                            f"{g.role} pool ({loaded.fit.reason}): {fix}")
    return "fp8"


def export_plan(plan: str | Path, target: str, backend: str | None = None, model_id: str | None = None,
                image: str | None = None, node_selector: list[str] | None = None,
                model_cache_pvc: str | None = None, option: str = "PLAN", schedule: str | Path | None = None,
                schedule_start: str = "00:00", timezone: str = "UTC", outside: str = "peak") -> tuple[Export, list[str]]:
    """A plan.json as `target`'s files (`splitplan export`), with the plan's notes (a catalog entry
    that changed since the plan was made). SpecError naming `option` for a plan that is not one.
    `schedule` (a windows.json of `optimize --window`): KEDA ScaledObjects that scale the pools
    on it (deploy.schedule), from `schedule_start` in `timezone`, running `outside` (peak, min or zero)
    in the hours no window covers; the notes then say what runs there."""
    from splitplan.io import plan_document
    read = plan_document.read(Path(plan), option)
    with read.catalog.active():  # (the plan's specs while it is exported)
        dep = deployment(read.pools, read.inputs, str(plan), model_id, node_selector, model_cache_pvc)
        out = export(dep, target, backend, image, scaled=schedule is not None)
        if schedule is None:
            return out, read.notes
        out, plan_schedule = _scheduled(dep, out, Path(schedule), schedule_start, timezone, outside)
    from splitplan.deploy.schedule import outside_text
    return out, [*read.notes, f"schedule: {outside_text(plan_schedule, outside)}"]


def _scheduled(dep: Deployment, out: Export, path: Path, start: str, timezone: str, outside: str):
    """The export (built `scaled`) with keda.yaml, the ScaledObjects that follow the schedule; and the schedule."""
    from splitplan.deploy import schedule as keda
    if out.target not in KUBERNETES_TARGETS:
        raise SpecError(f"--schedule scales Kubernetes workloads with KEDA: --to {' or '.join(KUBERNETES_TARGETS)}, "
                        f"not {out.target}")
    plan_schedule = keda.read_schedule(path)
    objects = keda.scaled_objects(dep, plan_schedule, start, timezone, out.target, dep.name, outside)
    return dataclasses.replace(out, files={**out.files, "keda.yaml": keda.keda_yaml(objects)},
                               mapping=out.mapping + keda.mapping(plan_schedule, start, timezone, out.target, outside),
                               apply=out.apply + ("\n" if out.apply else "")
                               + "kubectl apply -n NS -f keda.yaml  # needs KEDA 2 (keda.sh) in the cluster"), plan_schedule


def export(dep: Deployment, target: str, backend: str | None = None, image: str | None = None, scaled: bool = False) -> Export:
    """The files of `target` for the deployment. `backend` (dynamo: vllm or sglang) defaults to the
    plan's engine where it is one of them; `image` replaces the target's container image; `scaled`:
    an autoscaler sets the replicas (Dynamo: the worker components opt into their scaling adapters)."""
    if target not in TARGETS:
        raise SpecError(f"--to {excerpt(target)}: choose {', '.join(TARGETS)}")
    if image is not None:
        image_ref(image)
    if target == "dynamo":
        from splitplan.deploy.dynamo import dynamo
        backend = backend or _backend_of(dep)
        _require_fp4_servable(dep, backend)
        return dynamo(dep, backend, image, scaled)
    if target not in KUBERNETES_TARGETS and (dep.node_selector is not None or dep.model_cache_pvc):
        flag = "--node-selector" if dep.node_selector is not None else "--model-cache-pvc"
        raise SpecError(f"{flag}: --to {target} writes a launch script, which runs where it is started; {flag} is for "
                        f"--to {' or '.join(KUBERNETES_TARGETS)}")
    runs = "vllm" if target == "llm-d" else target
    if backend not in (None, runs):
        raise SpecError(f"--backend {excerpt(backend)}: --to {target} runs {runs}; --backend is for --to dynamo")
    _require_fp4_servable(dep, runs)
    if target == "llm-d":
        from splitplan.deploy.llmd import llmd
        return llmd(dep, image)
    from splitplan.deploy.launch import launch
    return launch(dep, target, image)


def _require_fp4_servable(dep: Deployment, engine: str) -> None:
    """fp4 weights on a GPU without fp4 tensor cores are priced weight-only, as vLLM serves them (its
    FP4 Marlin kernels, from compute capability 8.0); SGLang's NVFP4 path needs fp4 tensor cores, so
    such a plan is exported for vLLM only: SpecError for SGLang."""
    short = sorted({g.hardware.name for g in dep.groups if not g.hardware.has_tensor_cores("fp4")})
    if engine == "sglang" and dep.engine.weights == "fp4" and short:
        raise SpecError(f"the plan runs fp4 weights on {', '.join(short)}, which has no fp4 tensor cores: priced "
                        f"weight-only, as vLLM serves them, where SGLang's fp4 path needs fp4 tensor cores; export for vLLM "
                        f"(--to vllm or llm-d, or --backend vllm), or plan with --weights fp8")


def _backend_of(dep: Deployment) -> str:
    for b in BACKENDS:
        if dep.engine.name.startswith(b):
            return b
    raise SpecError(f"the plan was sized with engine {dep.engine.name}, which Dynamo does not run as such; "
                    f"give --backend {' or '.join(BACKENDS)}")


def shell_words(cmd: list[str], compose: bool = False) -> str:
    """A command as shell words: each word quoted by `shlex.quote`, so it reaches the program as
    one argument, unchanged; an `Expand` word in double quotes, for the shell to expand as one
    word. `compose`: for a compose file, which interpolates `$` itself (a literal one is `$$`)."""
    def literal(word: str) -> str:
        quoted = shlex.quote(word)
        return quoted.replace("$", "$$") if compose else quoted
    return " ".join(f'"{w}"' if isinstance(w, Expand) else literal(w) for w in cmd)


def _pinning(labels: dict[str, str]) -> str:
    """What a node selector's GPU count label means for where pods run (EXPORT.md)."""
    count = labels.get("nvidia.com/gpu.count")
    if count is None:
        return ""
    return (f". The pods run only on nodes of exactly {count} GPU(s) (GPU Feature Discovery's nvidia.com/gpu.count): the "
            "machines the plan priced; nodes with more GPUs stay unused by them unless --node-selector says otherwise")


def storage_text(dep: Deployment) -> str:
    """How a pod's ephemeral-storage request was sized (EXPORT.md)."""
    if dep.model_cache_pvc:
        return f"the engine's compile caches ({CACHE_GIB} Gi); the weights are in the claim {dep.model_cache_pvc}"
    return (f"the checkpoint {dep.model_id} downloads ({dep.checkpoint_bytes / 1e9:,.0f} GB of weights) with "
            f"{round((STORAGE_SPARE - 1) * 100)} % to spare, and {CACHE_GIB} Gi for the engine's compile caches")


def _group_mapping(dep: Deployment, g, kubernetes: bool, mapping: list, unexpressed: list) -> None:
    """`common_mapping`'s rows of one pool's workers: their count and layout, where they run."""
    mapping.append((f"{g.role}_pools[{g.hardware.name}].machines, layout",
                    f"{g.instances} {ROLE_NAMES[g.role]} worker(s) of {g.layout.gpus} GPU(s) ({g.layout})"
                    + (f", each over {g.nodes_per_instance} nodes" if g.nodes_per_instance > 1 else "")))
    if g.shared is not None and g.role == "token" and kubernetes:
        unexpressed.append(f"shared machines {g.shared}: the prefill and decode pods that share them in the plan are "
                           "placed by the scheduler (llm-d: with a preferred pod affinity to each other's node), "
                           "not pinned to one node together")
    labels = dep.node_labels(g) if kubernetes else {}
    if labels:
        mapping.append((f"{g.role}_pools[{g.hardware.name}].hardware",
                        "nodeSelector " + ", ".join(f"{k}={v}" for k, v in labels.items())
                        + (" (--node-selector)" if dep.node_selector is not None else " (the hardware file's kubernetes_node_labels)")
                        + f"; toleration of {g.hardware.kubernetes_gpu_resource}" + _pinning(labels)))
    else:
        unexpressed.append(f"{g.role}_pools[{g.hardware.name}].hardware: the machine type is not selected; pin the "
                           f"workers to {g.hardware.gpu.name} nodes with your cluster's node labels"
                           + (" (--node-selector KEY=VALUE)" if kubernetes else ""))


def common_mapping(dep: Deployment, engine: str, kubernetes: bool = False) -> tuple[list[tuple[str, str]], list[str]]:
    """The mapping rows and the unexpressed facts every target shares (`engine`: what runs;
    `kubernetes`: the target writes pods, placed by `Deployment.pod_spec`)."""
    mapping = [("inputs.model", f"the served model {dep.model_id}"
                + (" (--model-id)" if dep.repo_given else f" (model {dep.model.name}'s hf_repo; --model-id serves another)"))]
    unexpressed = [] if dep.engine.name.startswith(engine) else [
        f"inputs.engine {dep.engine.name}: the plan was sized with that engine's timing, not {engine}'s; "
        f"re-plan with --engine {engine}-fp8 to size for {engine}"]
    for g in dep.groups:
        _group_mapping(dep, g, kubernetes, mapping, unexpressed)
    if kubernetes and dep.model_cache_pvc:
        mapping.append(("--model-cache-pvc", f"every serving pod mounts the claim {dep.model_cache_pvc} at {MODEL_CACHE_PATH} "
                        "(HF_HOME): the weights download once; pods on several nodes need a ReadWriteMany claim"))
    elif kubernetes:
        unexpressed.append("the weights: every pod downloads them; give --model-cache-pvc NAME (a ReadWriteMany claim) "
                           "to share one copy")
    if dep.quantization:
        mapping.append((f"inputs.engine weights={dep.engine.weights}", f"--quantization {dep.quantization}: {dep.model_id} "
                        f"holds {dep.model.hf_repo_weights} weights, which the engine quantizes as it loads them (each "
                        f"instance holds them at {dep.model.hf_repo_weights} within its GPUs); an {dep.engine.weights} "
                        "checkpoint (--model-id) downloads less and keeps its own scales"))
    elif not dep.repo_given and dep.engine.weights != dep.model.hf_repo_weights:
        unexpressed.append(f"inputs.engine weights={dep.engine.weights}: {dep.model_id} holds {dep.model.hf_repo_weights} "
                           f"weights, which the engines serve as they are (less memory and more speed than the plan "
                           f"priced); serve a {dep.engine.weights} checkpoint (--model-id) to run what was priced")
    unexpressed.append("plan.cost_usd_per_hour, power_kw, predicted, slo: plan figures, not deployment settings")
    return mapping, unexpressed
