"""Designs as data: which machine types serve which phase (and at which TP).

A design is either split (`prompt` and `token` machine types) or co-located
(`mixed`); `tp` (or `prompt_tp` / `token_tp`) restricts the TP degree, otherwise
every degree that fits is tried.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, model_validator

from splitplan.base.errors import SpecError
from splitplan.specs._load import load_named
from splitplan.specs.catalog import per_catalog
from splitplan.specs.hardware import load_hardware


class Design(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    name: str
    prompt: str | None = None
    token: str | None = None
    mixed: str | None = None
    tp: Annotated[int, Field(ge=1, le=72)] | None = None

    @model_validator(mode="after")
    def _shape(self) -> Design:
        if self.mixed is not None and (self.prompt or self.token):
            raise ValueError(f"design {self.name}: give mixed, or prompt and token, not both")
        if self.mixed is None and not (self.prompt and self.token):
            raise ValueError(f"design {self.name}: a split design needs both prompt and token")
        return self

    @property
    def split(self) -> bool:
        return self.mixed is None

    @property
    def hardware(self) -> list[str]:
        return [h for h in (self.prompt, self.token, self.mixed) if h]


class Designs(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    name: str
    description: str = ""
    designs: Annotated[list[Design], Field(min_length=1)]

    @model_validator(mode="after")
    def _unique(self) -> Designs:
        names = [d.name for d in self.designs]
        if len(set(names)) != len(names):
            raise ValueError("design names must be unique")
        return self

    def get(self, name: str) -> Design:
        for d in self.designs:
            if d.name == name:
                return d
        raise SpecError(f"design '{name}' is not in {self.name}; choose one of {', '.join(d.name for d in self.designs)}")


@per_catalog(maxsize=64)
def load_designs(name_or_path: str) -> Designs:
    designs, path = load_named(Designs, "designs", name_or_path, "designs")
    for d in designs.designs:
        for hw in d.hardware:
            try:
                load_hardware(hw)
            except SpecError as exc:
                raise SpecError(f"{path}: design {d.name}: {exc}") from None
    return designs
