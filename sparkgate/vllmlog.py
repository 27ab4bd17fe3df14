"""Facts a vLLM server states about itself while it starts, read from its log (a container's or a process's).

The lines are vLLM's own (v1 engine; the patterns follow its format strings, and the selftests hold real lines):

- version: the banner "vLLM server version X, serving model M" (or the logo's "version X"), or
  "Initializing a V1 LLM engine (vX) with config: ..." (that line also carries cudagraph_mode, enforce_eager)
- free memory at start: "Free memory on device (F/T GiB) on startup." (the GPU worker's utilization error and
  summary), or "Initial free memory F GiB, reserved K GiB memory for KV Cache as specified by
  kv_cache_memory_bytes config ..." (the KV cache pinned with --kv-cache-memory)
- KV cache GiB: that "reserved K GiB" (pinned), "Available KV cache memory: K GiB" (sized from free memory),
  or on the CPU engine "Explicitly set (K/T) GiB for KV cache on node N." / "Auto set (K/T) GiB ..."
- KV cache tokens and concurrency: "GPU KV cache size: N tokens" and "Maximum concurrency for L tokens per
  request: Cx" (one line or two, by version; "CPU KV cache size" on the CPU engine)
- variables it ignores: "Unknown vLLM environment variable detected: VLLM_X" (a warning, one per variable)
- the attention backend it runs: chosen, "Using TRITON_ATTN attention backend out of potential backends: [...]";
  asked for (--attention-backend) and taken, "Using AttentionBackendEnum.TRITON_ATTN backend." (the GPU platform);
  asked for and refused by the CPU engine, "Cannot use AttentionBackendEnum.TRITON_ATTN backend on CPU." (it runs
  CPU_ATTN instead, the one it runs for every model without MLA, and names it nowhere)
- an FP8 KV cache running on unit scales: "Using KV cache scaling factor 1.0 for fp8_e4m3. If this is unintended,
  ..." (the checkpoint carries no calibrated k/v scales: the failure that took GSM8K from 0.78 to 0.025, vLLM
  PR #19292); with an FP8 KV cache, attention on uncalibrated query and probability scales: "Using uncalibrated
  q_scale 1.0 and/or prob_scale 1.0 with fp8 attention. This may cause accuracy issues." (a GB10 owner's log showed
  it, rwlove/home-ops PR #13384)
- graphs: "Capturing CUDA graphs (decode, FULL)" / "(mixed prefill-decode, PIECEWISE)" progress bars,
  "Graph capturing finished in S secs, took G GiB", "Cudagraph is disabled under eager mode"

Bytes per token are the KV cache bytes over its tokens, as vLLM sized them: never derived from the layer count
(a hybrid model's Gated DeltaNet layers hold state, not per-token KV).

A log that holds several starts (a restarted container) is read from its last start.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from itertools import pairwise

from .redact import printable
from .units import GIB

# Where one start of a server begins: the engine's config line or the server's banner, whichever is first.
_START = re.compile(r"vLLM server version \S+|Initializing a V\d LLM engine|vLLM API server version \S+"
                    r"|█\s+version\s+\S+")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_NUM = r"([0-9][0-9,]*(?:\.[0-9]+)?)"

_VERSION = [
    re.compile(r"vLLM (?:API )?server version (\S+?),?(?:\s|$)"),
    re.compile(r"Initializing a V\d LLM engine \(v([^)\s]+)\)"),
    re.compile(r"█\s+version\s+(\S+)"),  # the logo banner
]
_FREE = [
    re.compile(rf"Free memory on device(?: \S+)? \({_NUM}/{_NUM} GiB\) on startup"),
    re.compile(rf"Initial free memory:? {_NUM} GiB"),
]
_KV_PINNED = re.compile(rf"reserved {_NUM} GiB memory for KV Cache as specified by kv_cache_memory_bytes")
_KV_PROFILED = re.compile(rf"Available KV cache memory: (-?{_NUM[1:-1]}) GiB")
_KV_CPU = re.compile(rf"(Explicitly|Auto) set \({_NUM}/{_NUM}\) GiB for KV cache on node (\d+)")
_KV_TOKENS = re.compile(rf"(GPU|CPU|[A-Z]+(?: \+ host)?) KV cache size: {_NUM} tokens")
_CONCURRENCY = re.compile(rf"Maximum concurrency for {_NUM} tokens per request: {_NUM}x")
_CAPTURE = re.compile(r"Capturing CUDA graphs \(([^,)]+), ([A-Z_]+)\)")
_CAPTURE_DONE = re.compile(rf"Graph capturing finished in {_NUM} secs?, took (-?{_NUM[1:-1]}) GiB")
_EAGER_OFF = re.compile(r"Cudagraph is disabled under eager mode")
_CUDAGRAPH_MODE = [
    re.compile(r"['\"]cudagraph_mode['\"]:\s*<CUDAGraphMode\.([A-Z_]+)"),
    re.compile(r"['\"]cudagraph_mode['\"]:\s*['\"]?([A-Z_]+)"),
    re.compile(r"cudagraph_mode=(?:CUDAGraphMode\.)?([A-Z_]+)"),
]
_ENFORCE_EAGER = re.compile(r"enforce_eager=(True|False)")
_WEIGHTS = re.compile(rf"Model loading took {_NUM} GiB")
_UNKNOWN_ENV = re.compile(r"Unknown vLLM environment variable detected: (VLLM_[A-Za-z0-9_]+)")  # a name, nothing else
# chosen by the engine, asked for and taken (GPU), the CPU engine's MLA backends: every one the start names
_ATTENTION = re.compile(r"Using (\w+) attention backend out of potential backends|Using AttentionBackendEnum\.(\w+) "
                        r"backend\.|Using ((?:AMX|CPU)_MLA) backend\.")
_ATTENTION_REFUSED = re.compile(r"Cannot use AttentionBackendEnum\.(\w+) backend on CPU")
_KV_UNIT_SCALE = re.compile(r"Using KV cache scaling factor 1\.0 for (\w+)")
_FP8_ATTENTION_UNIT = re.compile(r"Using uncalibrated (q_scale [\d.]+ and/or prob_scale [\d.]+) with fp8 attention")


def _f(text: str) -> float:
    return float(text.replace(",", ""))


@dataclass
class StartupFacts:
    """What one start of a vLLM server said about itself. None: the log did not say (yet)."""

    version: str | None = None
    device: str | None = None  # "GPU", "CPU": whose KV cache the size line counts
    free_memory_gib: float | None = None  # free on the device when the engine started
    total_memory_gib: float | None = None
    kv_cache_gib: float | None = None
    kv_cache_basis: str | None = None  # "pinned" (--kv-cache-memory, VLLM_CPU_KVCACHE_SPACE) or "profiled"
    kv_tokens: int | None = None
    concurrency_len: int | None = None  # the max_model_len the concurrency figure is for
    max_concurrency: float | None = None
    weights_gib: float | None = None
    cudagraph_mode: str | None = None  # as configured: FULL_AND_PIECEWISE, PIECEWISE, NONE, ...
    enforce_eager: bool | None = None
    graph_captures: list[str] = field(default_factory=list)  # e.g. "mixed prefill-decode, PIECEWISE"
    graph_capture_gib: float | None = None
    starts: int = 0  # how many starts the log holds (a restarted container logs one per start)
    unknown_env: list[str] = field(default_factory=list)  # VLLM_ variables this vLLM does not read (ignored)
    attention_backends: list[str] = field(default_factory=list)  # the ones it runs, e.g. TRITON_ATTN, CPU_ATTN
    attention_refused: str | None = None  # the one asked for that the CPU engine would not run
    kv_unit_scale: str | None = None  # the FP8 KV cache dtype running on scales of 1.0 (no calibrated k/v scales)
    fp8_attention_unit_scales: str | None = None  # FP8 attention on uncalibrated query/probability scales

    @property
    def bytes_per_token(self) -> float | None:
        """KV cache bytes per token of context, as vLLM sized it (GiB / tokens)."""
        if self.kv_cache_gib is None or not self.kv_tokens:
            return None
        return self.kv_cache_gib * GIB / self.kv_tokens

    @property
    def graph_mode(self) -> str | None:
        """How the engine runs its steps: "eager" (no graphs), or the graph modes it captured, in order
        ("PIECEWISE", "FULL", "PIECEWISE+FULL"), else the configured cudagraph_mode."""
        if self.enforce_eager:
            return "eager"
        captured = list(dict.fromkeys(c.rsplit(", ", 1)[-1] for c in self.graph_captures))
        if captured:
            return "+".join(captured)
        return self.cudagraph_mode

    def summary(self) -> dict[str, str]:
        """Flat strings for the results file and the report."""
        out = {k: str(v) for k, v in asdict(self).items() if v not in (None, [])}
        if self.graph_captures:
            out["graph_captures"] = "; ".join(self.graph_captures)
        if self.unknown_env:
            out["unknown_env"] = ", ".join(self.unknown_env)
        if self.attention_backends:
            del out["attention_backends"]
            out["attention_backend"] = ", ".join(self.attention_backends)
        if (bpt := self.bytes_per_token) is not None:
            out["kv_bytes_per_token"] = f"{bpt:.0f}"
        if (mode := self.graph_mode) is not None:
            out["graph_mode"] = mode
        return out


def last_start(text: str) -> tuple[str, int]:
    """The part of the log from its last start, and how many starts it holds."""
    text = _ANSI.sub("", text)
    starts = [m.start() for m in _START.finditer(text)]
    # A banner and an engine config line both belong to one start: count starts as groups of those lines
    # with nothing of a finished start (a KV cache size) between them.
    groups: list[int] = []
    for pos in starts:
        if not groups or _KV_TOKENS.search(text, groups[-1], pos):
            groups.append(pos)
    if not groups:
        return text, 0
    return text[groups[-1]:], len(groups)


def parse(text: str) -> StartupFacts:
    """The startup facts of the last start in a vLLM log."""
    part, starts = last_start(text)
    facts = StartupFacts(starts=starts)
    for pattern in _VERSION:
        if m := pattern.search(part):
            facts.version = m.group(1).lstrip("v")
            break
    for pattern in _FREE:
        if m := pattern.search(part):
            facts.free_memory_gib = _f(m.group(1))
            if m.lastindex and m.lastindex >= 2:
                facts.total_memory_gib = _f(m.group(2))
            break
    if m := _KV_PINNED.search(part):
        facts.kv_cache_gib, facts.kv_cache_basis = _f(m.group(1)), "pinned"
    elif m := _KV_PROFILED.search(part):
        facts.kv_cache_gib, facts.kv_cache_basis = _f(m.group(1)), "profiled"
    else:
        nodes = {node: (how, _f(kv), _f(total)) for how, kv, total, node in _KV_CPU.findall(part)}
        if nodes:
            facts.kv_cache_gib = sum(kv for _, kv, _ in nodes.values())
            facts.total_memory_gib = facts.total_memory_gib or sum(t for _, _, t in nodes.values())
            explicit = all(how == "Explicitly" for how, _, _ in nodes.values())
            facts.kv_cache_basis = "pinned" if explicit else "profiled"
    if m := _KV_TOKENS.search(part):
        facts.device, facts.kv_tokens = m.group(1), int(_f(m.group(2)))
    if m := _CONCURRENCY.search(part):
        facts.concurrency_len, facts.max_concurrency = int(_f(m.group(1))), _f(m.group(2))
    if m := _WEIGHTS.search(part):
        facts.weights_gib = _f(m.group(1))
    for pattern in _CUDAGRAPH_MODE:
        if m := pattern.search(part):
            facts.cudagraph_mode = m.group(1)
            break
    if m := _ENFORCE_EAGER.search(part):
        facts.enforce_eager = m.group(1) == "True"
    if _EAGER_OFF.search(part):
        facts.enforce_eager = True
    facts.graph_captures = list(dict.fromkeys(f"{a}, {b}" for a, b in _CAPTURE.findall(part)))
    if m := _CAPTURE_DONE.search(part):
        facts.graph_capture_gib = _f(m.group(2))
    facts.unknown_env = list(dict.fromkeys(_UNKNOWN_ENV.findall(part)))
    facts.attention_backends = list(dict.fromkeys(next(filter(None, m.groups())) for m in _ATTENTION.finditer(part)))
    if m := _ATTENTION_REFUSED.search(part):
        facts.attention_refused = m.group(1)
    if not facts.attention_backends and facts.device == "CPU":
        # What vLLM's CPU engine runs for every model without MLA, and never logs (older CPU builds named theirs
        # TORCH_SDPA). A vision tower's own lines ("Using backend X for vit attention") are not the model's.
        facts.attention_backends = ["CPU_ATTN"]
    if m := _KV_UNIT_SCALE.search(part):
        facts.kv_unit_scale = m.group(1)
    if m := _FP8_ATTENTION_UNIT.search(part):
        facts.fp8_attention_unit_scales = m.group(1)
    return facts


_API_SERVER = "API server starting on {0}"  # a phase of the progress; the start's end where it is timed
_PHASES = [
    (re.compile(r"Initializing a V\d LLM engine \(v([^)\s]+)\)"), "engine v{0} initialising"),
    (re.compile(r"Loading safetensors checkpoint shards:\s+\d+% Completed \| (\d+)/(\d+)"),
     "loading weights: shard {0} of {1}"),
    (re.compile(rf"Model loading took {_NUM} GiB(?: memory)? and {_NUM} s"), "weights loaded: {0} GiB in {1} s"),
    (re.compile(rf"Loading weights took {_NUM} seconds"), "weights loaded in {0} s"),
    (re.compile(r"Capturing CUDA graphs \(([^,)]+), ([A-Z_]+)\)"), "capturing CUDA graphs ({0}, {1})"),
    (re.compile(rf"Graph capturing finished in {_NUM} secs?, took (-?{_NUM[1:-1]}) GiB"),
     "graphs captured in {0} s, {1} GiB"),
    (re.compile(rf"(?:GPU|CPU) KV cache size: {_NUM} tokens"), "KV cache sized: {0} tokens"),
    (re.compile(rf"init engine \(profile, create kv cache, warmup model\) took {_NUM} s"), "engine ready in {0} s"),
    (re.compile(r"Starting vLLM (?:API )?server on (\S+)"), _API_SERVER),
]


def phases(text: str) -> list[str]:
    """What a starting server has done so far, one line per phase, from its log (the last start's): for the
    progress an operator watches while a model loads for minutes."""
    part, _ = last_start(text)
    found: list[tuple[int, str]] = []
    for pattern, template in _PHASES:
        matches = list(pattern.finditer(part))
        if matches:  # a phase that repeats (shards, graph sizes) is shown at its latest
            m = matches[-1]
            found.append((matches[0].start(), template.format(*m.groups())))
    return [line for _, line in sorted(found)]


# `docker logs --timestamps`: each line prefixed with the engine's own RFC 3339 UTC time, nanoseconds included.
_DOCKER_STAMP = re.compile(r"^(\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2})(?:\.(\d{1,9}))?Z (.*)$")
_SERVING = re.compile(r"Starting vLLM (?:API )?server on |Application startup complete")


def stamp(text: str) -> datetime | None:
    """A docker time (2026-12-04T23:34:16.123456789Z, as `State.StartedAt` and `logs --timestamps` write it) in UTC;
    None for anything else (docker's 0001-01-01T00:00:00Z of a container never started included)."""
    return _when(_DOCKER_STAMP.match(f"{text} "))


def _when(m: re.Match[str] | None) -> datetime | None:
    if not m or m.group(1).startswith("0001-"):
        return None
    try:
        when = datetime.fromisoformat(m.group(1))
    except ValueError:  # a 13th month, a 30th of February
        return None
    return when.replace(microsecond=int((m.group(2) or "0").ljust(6, "0")[:6]), tzinfo=UTC)


@dataclass
class StartupTimes:
    """One start, timed from the container's start: when each phase began (seconds), and when it served."""

    phases: list[tuple[float, str]] = field(default_factory=list)  # (seconds after the start, the phase, as shown)
    serving_s: float | None = None  # None: its log does not say it serves
    first_token_s: float | None = None  # the first token of a streamed answer, where the run timed the start itself

    def __str__(self) -> str:
        served = f"serving after {self.serving_s:.0f} s" if self.serving_s is not None else "not serving yet"
        token = [f"its first streamed token after {self.first_token_s:.0f} s"] if self.first_token_s is not None else []
        return "; ".join([f"{line} at {t:.0f} s" for t, line in self.phases] + [served] + token)

    @property
    def reached_s(self) -> float | None:
        """When the start served a user: its first token where that was timed, else when its log said it serves."""
        return self.first_token_s if self.first_token_s is not None else self.serving_s

    @property
    def longest(self) -> str | None:
        """The longest wait between two things the start showed: where a slow start spent its time."""
        points = [(0.0, "the container's start"), *self.phases]
        if self.serving_s is not None:
            points.append((self.serving_s, "serving"))
        if self.first_token_s is not None:
            points.append((self.first_token_s, "its first streamed token"))
        gaps = [(b[0] - a[0], a[1], b[1]) for a, b in pairwise(sorted(points))]
        if not gaps:
            return None
        took, after, before = max(gaps)
        return f"{took:.0f} s from '{after}' to '{before}'"


def startup_times(timestamped: str, started: datetime) -> StartupTimes:
    """The start that began at `started` (the container's State.StartedAt), from `docker logs --timestamps`: each
    phase at the first line that shows it (named as its latest line shows it), and the first line that says it
    serves. Lines stamped before `started` are an earlier start's."""
    first: dict[int, float] = {}
    shown: dict[int, str] = {}
    out = StartupTimes()
    for raw in _ANSI.sub("", timestamped).splitlines():
        m = _DOCKER_STAMP.match(raw)
        when = _when(m)
        if when is None or when < started:
            continue
        seconds, line = (when - started).total_seconds(), m.group(3)
        for i, (pattern, template) in enumerate(_PHASES):
            if template is not _API_SERVER and (pm := pattern.search(line)):  # that one is serving, below
                first.setdefault(i, seconds)
                shown[i] = printable(template.format(*pm.groups()), 120)  # the server's words, quoted
        if out.serving_s is None and _SERVING.search(line):
            out.serving_s = seconds
    out.phases = sorted((first[i], shown[i]) for i in first)
    return out
