"""What a pool of machines does in a plan, a simulation or a report."""

from __future__ import annotations

from enum import StrEnum


class Role(StrEnum):
    """A pool's role. Members are strings ("prompt", ...), so JSON, CSV and option text
    carry them unchanged."""

    PROMPT = "prompt"  # prefill only; the KV cache goes to a token machine
    TOKEN = "token"  # decode only
    MIXED = "mixed"  # co-located: prefill and decode on the same machines


SPLIT = (Role.PROMPT, Role.TOKEN)
