"""The results file (--results-json): what a run measured and found, with what it takes to compare two runs or two
boxes, written as the run goes so a crash keeps what was measured.

Schema version 3 (docs/results.schema.json, `sparkgate results-schema`): the suite's version and commit, who ran it,
a system block, every recipe as it served (a digest of what changes the serving apart from the recipe file's),
every check's outcome with the floor it was held to, every figure with n, mean, std, p50/p90/p99, raw values,
a typed shape and its method, and (since version 3) every quality probe's answer, right or wrong, with its generated
tokens' top-k log-probabilities. Files of versions 1 and 2 are still read (they have no answers). Every string goes
through the masking formatter (and --redact's placeholders).
"""

from __future__ import annotations

import datetime as dt
import json
import os
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, Field

from . import __version__, commit
from .hostfacts import HostFacts
from .levels import LEVELS
from .measure import METHOD, METHOD_TOKENIZER, Figure
from .recipes import FLOOR_CHECKS, Recipe
from .redact import mask_json
from .units import GIB

SCHEMA_VERSION = 3
METHODS = (METHOD, METHOD_TOKENIZER)  # the measurement methods this version of the suite writes and reads


class Suite(BaseModel):
    version: str = Field(description="sparkgate's version (0.1.devN+g<commit> for a build of a commit)")
    commit: str = Field(description="the commit of the suite that measured (git describe, -dirty when modified)")


class Submitter(BaseModel):
    name: str | None = Field(None, description="who ran it (--submitter)")
    notes: str | None = Field(None, description="anything a reader should know (--notes)")


class System(BaseModel):
    """The box, in the terms two boxes are compared by."""

    hostname: str
    arch: str
    cpu: str
    cpus: int
    memory_gib: float
    os: str
    kernel: str
    gpus: list[str] = Field(description="name (compute capability) of each NVIDIA GPU")
    driver: str | None = Field(description="the userspace NVIDIA driver")

    @classmethod
    def of(cls, f: HostFacts) -> System:
        return cls(hostname=f.hostname, arch=f.arch, cpu=f.cpu_model or "unknown", cpus=f.cpus,
                   memory_gib=round(f.mem_total_bytes / GIB, 2), os=f.os, kernel=f.kernel,
                   gpus=[f"{g.name} (cc {g.compute_cap})" for g in f.gpus], driver=f.driver_version)


class RecipeRun(BaseModel):
    """One recipe as it served: what a contributor needs to say two runs served the same thing."""

    recipe: str
    recipe_digest: str = Field(description="hash of the recipe file's content (floors and comments included)")
    serving_digest: str = Field(description="hash of only what changes the serving: model, image, entrypoint, mods, "
                                "env, serve args. Equal serving digests, the same serving setup")
    model: str
    image: str | None = Field(description="the image reference; None for a process")
    image_id: str | None = None
    image_digest: str | None = None
    vllm_version: str | None = None
    floors: dict[str, float] = Field({}, description="the floors the recipe declares (name: minimum): what a complete "
                                     "run of it measures")
    server: dict[str, str] = Field({}, description="everything else the server said of itself (its startup log's "
                                   "facts: KV cache, graph mode, ...)")


class CheckResult(BaseModel):
    id: str
    test: str = Field(description="the test that ran it (a check with cases has one test per case)")
    recipe: str | None
    outcome: Literal["passed", "failed", "skipped"]
    floors: dict[str, float] = Field({}, description="the floors a perf check held its figures to, by the recipe's "
                                     "floor name (natural_decode, ...): the minimum")
    message: str = Field("", description="the failure message, or the skip reason")


class Measurement(Figure):
    recipe: str
    check: str = Field(description="the check ID that measured it")
    test: str = Field("", description="the test that measured it")
    floor: float | None = Field(None, description="the minimum the check held this figure to; None: recorded only")
    floor_name: str | None = Field(None, description="which of the recipe's floors (natural_decode, ...)")


LogProb = Annotated[float, Field(ge=-9999, le=0, allow_inf_nan=False)]


class Step(BaseModel):
    """One generated token of an answer (keys avoid the word the masking formatter hides)."""

    text: str
    logprob: LogProb
    top: list[tuple[str, LogProb]] = Field([], description="the top-k next-token candidates, with log-probabilities")


class Answer(BaseModel):
    """One quality probe's answer (QUAL-ANSWERS, sparkgate.quality) or one agent episode's outcome (QUAL-AGENT-*,
    sparkgate.agent): what the gate pairs, per check and probe, with the baseline's."""

    recipe: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
    check: str
    probe: str = Field(pattern=r"^[a-z]+-[0-9]{1,6}$", description="the probe's stable id (family-number)")
    prompt_digest: str = Field(pattern=r"^[0-9a-f]{16}$",
                               description="hash of the prompt: a probe of the same id asked differently does not pair")
    right: bool
    text: str = Field(description="the answer's content (an agent episode: its calls and answer), at most 400 "
                                  "characters")
    rerun: bool = Field(False, description="the same run's second answer to the probe: the engine's own rerun noise")
    steps: list[Step] = Field([], description="the first generated tokens (at most 32: where answers part), each with "
                              "its top-k")


class Downtime(BaseModel):
    """What a --take-over run set aside (production) and how long it was down: from its stop to serving again."""

    container: str
    served: list[str] = Field([], description="the models it served on its port before it was set aside")
    seconds: float | None = Field(None, description="from its stop to serving again (a real answer); None: not back")
    outcome: str = Field(description="what the run saw at the end")


class Results(BaseModel):
    """A sparkgate results file (--results-json). Figures are per request unless their name says aggregate."""

    schema_version: int = Field(SCHEMA_VERSION, ge=1, le=SCHEMA_VERSION,
                                description="the file's schema; a newer one than this sparkgate reads is refused")
    suite: Suite
    started: str = Field(description="UTC, ISO 8601")
    finished: str | None = Field(None, description="UTC, ISO 8601; None: the run did not finish")
    submitter: Submitter = Submitter()
    level: Literal["quick", "standard", "extended"] | None = Field(
        None, description="the --level it ran at; None: written before levels, with the standard level's repetitions")
    selection: str | None = Field(None, description="what was selected to run (-m and -k, as given); None: all")
    system: System | None = Field(None, description="the box, summarised")
    host: HostFacts | None = Field(None, description="every fact the host layer read, once per run")
    recipes: list[RecipeRun] = []
    checks: list[CheckResult] = []
    measurements: list[Measurement] = []
    downtime: list[Downtime] = Field([], description="production set aside by --take-over, and its time down")
    answers: list[Answer] = Field([], description="the quality probes' answers and agent episodes' outcomes (schema 3)")

    @property
    def measured_level(self) -> str:
        return self.level or "standard"


# A full extended run of three recipes writes a few MB, most of it the quality probes' tokens (325 answers of up to 32
# tokens with their top 5, per recipe).
MAX_BYTES = 64 * 2**20


def load(path: Path) -> Results:
    """A results file, validated against the schema (pydantic's ValidationError says what and where). Larger than
    MAX_BYTES, or not UTF-8: ValueError saying so (a contributor's file is untrusted input)."""
    path = Path(path)
    if (size := path.stat().st_size) > MAX_BYTES:
        raise ValueError(f"{size / 2**20:.0f} MB, larger than any results file ({MAX_BYTES // 2**20} MB at most)")
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"not UTF-8 text (byte {exc.start})") from None
    return Results.model_validate_json(text)


def problems(r: Results) -> list[str]:
    """What stops a valid file from being a complete, comparable submission: a run that did not finish, a method
    this version of the suite does not know, a floor of a recipe that no figure was held to (of the checks that
    measure at the file's level and were selected: a file is complete for what it selected)."""
    found = []
    if r.schema_version != SCHEMA_VERSION:
        found.append(f"schema version {r.schema_version}; this sparkgate reads {SCHEMA_VERSION}")
    if r.finished is None:
        found.append("the run did not finish (no `finished`): a crash or an interrupt cut it short; run it again")
    for m in r.measurements:
        if m.method not in METHODS:
            found.append(f"{m.recipe} [{m.check}] {m.name}: method {m.method!r} is not one this sparkgate measures "
                         f"with ({'; '.join(METHODS)}): measured by another version, its numbers do not compare")
    level = LEVELS.get(r.measured_level)
    if level is None:
        found.append(f"level {r.measured_level!r} is not one this sparkgate runs ({', '.join(LEVELS)})")
    for run in r.recipes:
        held = {m.floor_name for m in r.measurements if m.recipe == run.recipe and m.floor_name}
        selected = {c.id for c in r.checks if c.recipe == run.recipe}
        for name in run.floors:
            if FLOOR_CHECKS.get(name) not in selected and r.checks:
                continue  # not selected (-m, -k): the file does not claim it
            if name not in held and (level is None or level.runs(FLOOR_CHECKS.get(name, ""))):
                check = FLOOR_CHECKS.get(name, "?")
                ended = next((c for c in r.checks if c.id == check and c.recipe == run.recipe), None)
                if ended is None:
                    why = f"{check} did not run"
                else:
                    why = f"{check} {ended.outcome}" + (f": {ended.message.splitlines()[0]}" if ended.message else "")
                found.append(f"{run.recipe}: no figure for its {name} floor ({why})")
    return found


def now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


class ResultsFile:
    """A run's results, kept as it goes; written to `path` after every change when there is one."""

    def __init__(self, path: Path | None, submitter: Submitter | None = None, level: str = "standard",
                 selection: str | None = None) -> None:
        self.path = path
        self.data = Results(suite=Suite(version=__version__, commit=commit()), started=now(),
                            submitter=submitter or Submitter(), level=level, selection=selection)

    def set_system(self, facts: HostFacts) -> None:
        self.data.system = System.of(facts)
        self.data.host = facts
        self._write()

    def add_recipe(self, recipe: Recipe, server: dict[str, str] | None = None) -> None:
        server = dict(server or {})
        self.data.recipes.append(RecipeRun(
            recipe=recipe.name, recipe_digest=recipe.digest, serving_digest=recipe.serving_digest,
            model=recipe.model.id, image=recipe.image, image_id=server.pop("image_id", None) or None,
            image_digest=server.pop("image_digest", None) or None, vllm_version=server.pop("vllm_version", None),
            floors={name: f.min for name, f in recipe.floors.items()},
            server={k: v for k, v in server.items() if k not in ("image",)}))
        self._write()

    def note(self, recipe: str, key: str, value: str) -> None:
        """A fact a check learned of a recipe's server (the field its thinking arrives in), kept with the recipe."""
        for run in self.data.recipes:
            if run.recipe == recipe:
                run.server[key] = value
        self._write()

    def add(self, figure: Figure, recipe: Recipe, check: str, test: str, floor: float | None = None,
            floor_name: str | None = None) -> Measurement:
        m = Measurement(**figure.model_dump(), recipe=recipe.name, check=check, test=test, floor=floor,
                        floor_name=floor_name)
        self.data.measurements.append(m)
        self._write()
        return m

    def check(self, test: str) -> CheckResult | None:
        return next((c for c in self.data.checks if c.test == test), None)

    def set_check(self, result: CheckResult) -> None:
        """How a check ended; its floors are those its figures were held to."""
        result.floors = {m.floor_name: m.floor for m in self.data.measurements
                         if m.test == result.test and m.floor_name and m.floor is not None}
        self.data.checks = [c for c in self.data.checks if c.test != result.test] + [result]
        self._write()

    def add_answers(self, answers: list[Answer]) -> None:
        self.data.answers += answers
        self._write()

    def add_downtime(self, downtime: Downtime) -> None:
        self.data.downtime.append(downtime)
        self._write()

    def finish(self) -> None:
        self.data.finished = now()
        self._write()

    def _write(self) -> None:
        if self.path is None:
            return
        # Masked (secrets, --redact) string by string before it is serialised, written beside, then renamed: a crash
        # mid-write never leaves half a file.
        tmp = self.path.with_suffix(self.path.suffix + ".tmp")
        tmp.write_text(self.masked_json(), encoding="utf-8")
        os.replace(tmp, self.path)

    def masked_json(self) -> str:
        """The results as the file holds them: every string masked (secrets, --redact)."""
        return json.dumps(mask_json(self.data.model_dump(mode="json")), indent=2)
