"""What a pool of machines does in a plan, a simulation or a report, and a pool as a user or a plan names it."""

from __future__ import annotations

from enum import StrEnum
from typing import NamedTuple

from splitplan.specs.layout import Layout


class Role(StrEnum):
    """A pool's role. Members are strings ("prompt", ...), so JSON, CSV and option text
    carry them unchanged."""

    PROMPT = "prompt"  # prefill only; the KV cache goes to a token machine
    TOKEN = "token"  # decode only
    MIXED = "mixed"  # co-located: prefill and decode on the same machines


SPLIT = (Role.PROMPT, Role.TOKEN)


class Pool(NamedTuple):
    """The one pool type: `machines` machines of `hardware` in `role`, instances in `layout`; on
    machines shared with the other role's pool of the same `shared` number, `instances` of them
    (None: every instance the machines hold). What `--prompt-pool` and plan.json give, a plan's
    pools are (`SizedPool.pool`), the simulator runs (`simulation.pool_specs` resolves each to a
    `sim.PoolSpec` with its timing) and exports deploy (`deploy.Group` places it on machines)."""

    role: Role
    hardware: str
    layout: Layout
    machines: int
    instances: int | None = None
    shared: int | None = None


def pool_label(role: Role, hardware: str, layout: Layout, shared: int | None = None) -> str:
    """A pool as a schedule names it, its column in schedule.csv: `prompt h100-80gb TP 8` (a part
    of shared machines: `... shared 0`)."""
    return f"{role} {hardware} {layout}" + (f" shared {shared}" if shared is not None else "")
