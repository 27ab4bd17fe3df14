"""The results file: every measurement with the facts needed to compare two boxes, written as the run goes
so a crash keeps what was measured."""

from __future__ import annotations

import datetime as dt
import os
from pathlib import Path

from pydantic import BaseModel, Field

from . import __version__
from .hostfacts import HostFacts
from .measure import Figure
from .recipes import Recipe

SCHEMA_VERSION = 1


class RecipeRun(BaseModel):
    """One recipe as it served: what a contributor needs to say two runs served the same thing."""

    recipe: str
    recipe_digest: str = Field(description="hash of the recipe's content: equal digests, equal configuration")
    model: str
    image: str | None
    server: dict[str, str] = Field({}, description="what the server said of itself: vllm_version, image digest")


class Measurement(Figure):
    recipe: str
    check: str = Field(description="the check ID that measured it")


class Results(BaseModel):
    """A sparkgate results file (--results-json). Figures are per request unless their name says aggregate."""

    schema_version: int = SCHEMA_VERSION
    sparkgate_version: str = __version__
    started: str = Field(description="UTC, ISO 8601")
    system: HostFacts | None = Field(None, description="the host's facts, read once per run")
    recipes: list[RecipeRun] = []
    measurements: list[Measurement] = []


class ResultsFile:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.data = Results(started=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"))

    def set_system(self, facts: HostFacts) -> None:
        self.data.system = facts
        self._write()

    def add_recipe(self, recipe: Recipe, server: dict[str, str] | None = None) -> None:
        self.data.recipes.append(RecipeRun(recipe=recipe.name, recipe_digest=recipe.digest, model=recipe.model.id,
                                           image=recipe.image, server=server or {}))
        self._write()

    def add(self, figure: Figure, recipe: Recipe, check: str) -> None:
        self.data.measurements.append(Measurement(**figure.model_dump(), recipe=recipe.name, check=check))
        self._write()

    def _write(self) -> None:
        # Write beside, then rename: a crash mid-write never leaves half a file.
        tmp = self.path.with_suffix(self.path.suffix + ".tmp")
        tmp.write_text(self.data.model_dump_json(indent=2))
        os.replace(tmp, self.path)
