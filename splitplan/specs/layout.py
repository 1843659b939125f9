"""How one model instance spreads over its GPUs: its parallel layout.

    tp  tensor parallel: attention (and dense FFNs) split by heads over `tp` GPUs
    dp  data-parallel attention: `dp` such groups, each serving its own requests (their KV
        lives in their group); `tp * dp` GPUs per pipeline stage
    ep  expert parallel: the routed experts spread over `ep` of a stage's GPUs, each expert
        split over the other `tp * dp / ep` (`moe_tp`); tokens reach their experts by an
        all-to-all (dispatch and combine)
    pp  pipeline stages, each holding `1/pp` of the layers

An instance has `tp * dp * pp` GPUs and may span several machines. The notation is
aiconfigurator's and the engines' (`--tensor-parallel-size`, `--data-parallel-size` with
`--enable-expert-parallel`, `--pipeline-parallel-size`; SGLang `--tp-size --dp-size --ep-size`). A layout is
written `tp8`, `dp16ep16` or `tp8pp2` in options and files (a bare number is TP alone), and
`TP 8`, `DP 16 EP 16`, `TP 8 PP 2` in reports.
"""

from __future__ import annotations

import re
from typing import NamedTuple

from splitplan.base.errors import SpecError

MAX_GPUS = 1024  # GPUs of one instance (and so each degree)
_TEXT = re.compile(r"^(?:(\d+)|((?:(?:tp|dp|ep|pp)\d+)+))$")
_PART = re.compile(r"(tp|dp|ep|pp)(\d+)")


class Layout(NamedTuple):
    tp: int = 1
    dp: int = 1
    ep: int = 1
    pp: int = 1

    @property
    def stage_gpus(self) -> int:
        return self.tp * self.dp

    @property
    def gpus(self) -> int:
        return self.tp * self.dp * self.pp

    @property
    def moe_tp(self) -> int:
        """How many GPUs each routed expert is split over."""
        return self.stage_gpus // self.ep

    def exchanges_experts(self, moe: bool) -> bool:
        """Whether a model's MoE layers (`moe`) exchange tokens between a stage's GPUs: experts not
        split by the attention group's TP alone (EP, or DP attention)."""
        return moe and (self.ep > 1 or self.dp > 1)

    def _shown(self) -> list[tuple[str, int]]:
        """The degrees above 1, and TP whenever DP does not replace it."""
        return [(k, v) for k, v in zip(self._fields, self, strict=True) if v > 1 or (k == "tp" and self.dp == 1)]

    @property
    def spec(self) -> str:
        """The option and file form: `tp8`, `dp16ep16`, `tp8pp2`."""
        return "".join(f"{k}{v}" for k, v in self._shown())

    def __str__(self) -> str:
        return " ".join(f"{k.upper()} {v}" for k, v in self._shown())

    def unit(self, gpus_per_machine: int) -> tuple[int, int]:
        """(machines, instances) of the smallest whole unit of machines holding instances in this
        layout: one machine with one or more instances, or the machines one instance spans."""
        return max(1, self.gpus // gpus_per_machine), max(1, gpus_per_machine // self.gpus)

    def instances_on(self, machines: int, gpus_per_machine: int) -> int:
        """Whole instances on `machines` machines."""
        unit_machines, unit_instances = self.unit(gpus_per_machine)
        return machines // unit_machines * unit_instances

    def require_whole(self, machines: int, gpus_per_machine: int, where: str) -> None:
        """SpecError unless `machines` machines hold whole instances (a multiple of the unit)."""
        unit = self.unit(gpus_per_machine)[0]
        if machines % unit:
            raise SpecError(f"{where}: a {self} instance spans {unit} machines; give a multiple of {unit}")

    def problem(self) -> str:
        """Why the layout is not a layout ('' when it is)."""
        if min(self) < 1:
            return "every degree must be at least 1"
        if self.stage_gpus % self.ep:
            return f"EP {self.ep} must divide the {self.stage_gpus} GPUs of a stage (TP x DP)"
        return ""


def parse_layout(text: str, where: str) -> Layout:
    """`8` (TP 8), `tp8`, `dp16ep16`, `tp4dp2ep8`, `tp8pp2` (case and spaces ignored)."""
    compact = re.sub(r"\s+", "", str(text)).lower()
    match = _TEXT.match(compact)
    parts = _PART.findall(compact) if match and match.group(2) else []
    names = [k for k, _ in parts]
    if not match or len(set(names)) != len(names):
        raise SpecError(f"{where}: layout '{text}' is not one; write TP alone (8) or degrees like tp8, dp16ep16, tp8pp2")
    degrees = [int(match.group(1))] if match.group(1) else [int(v) for _, v in parts]
    if any(d > MAX_GPUS for d in degrees):  # (before the product: 20-digit degrees are typos, not layouts)
        raise SpecError(f"{where}: layout '{text}': a degree above {MAX_GPUS:,}; an instance has at most {MAX_GPUS:,} GPUs")
    layout = Layout(degrees[0]) if match.group(1) else Layout(**{k: int(v) for k, v in parts})
    if layout.gpus > MAX_GPUS:
        raise SpecError(f"{where}: layout '{text}' has {layout.gpus:,} GPUs; an instance has at most {MAX_GPUS:,}")
    if layout.problem():
        raise SpecError(f"{where}: layout '{text}': {layout.problem()}")
    return layout


def as_layout(value, where: str) -> Layout:
    """A Layout as given to the Python API: a Layout, a TP degree or a layout string."""
    return value if isinstance(value, Layout) else parse_layout(str(value), where)
