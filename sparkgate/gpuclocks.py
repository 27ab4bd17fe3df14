"""The GPU's clocks over a run: how long the driver held them down, and why.

`nvidia-smi -q -x` states, per GPU, a counter of microseconds spent in each clock event reason since the driver
loaded (`clocks_event_reasons_counters`: in the XML of driver 580 already, where the CSV query has no such field).
Two reads, at a run's start and end, give the time each reason held the clocks during the run: every moment of it,
where a sampled SM clock sees only the moments it was read.
"""

from __future__ import annotations

import re
import statistics
import threading
import xml.etree.ElementTree as ET
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .redact import printable

COMMAND = "nvidia-smi -q -x"
# Counters that mean the box is not at its speed: heat (the driver's and the hardware's) and the power brake (an
# external signal: a power supply or a board in trouble). The counter's name -> what an operator calls it.
JUDGED = {
    "sw_therm_slowdown": "SW thermal slowdown",
    "hw_therm_slowdown": "HW thermal slowdown",
    "hw_power_brake": "HW power brake slowdown",
}
# Running at the power limit is how a GPU under full load is meant to run: counted, not judged.
COUNTED = {"sw_power_cap": "SW power cap", "sync_boost": "sync boost"}
_COUNTER = re.compile(r"^clocks_event_reasons_counters_(\w+)$")
_MICROSECONDS = re.compile(r"^\s*(\d{1,19})\s*us\s*$")
_MHZ = re.compile(r"^\s*(\d{1,6})\s*MHz\s*$")


@dataclass
class GpuClocks:
    """One read of every GPU: counters in microseconds per GPU (by its bus id), SM clocks in MHz."""

    counters: dict[str, dict[str, int]] = field(default_factory=dict)
    sm_mhz: dict[str, tuple[int | None, int | None]] = field(default_factory=dict)  # (current, max)
    refused: str = ""  # why nothing could be read


def read(run: Callable[[str], Any]) -> GpuClocks:
    """Read the clocks through `run` (a testinfra host's run)."""
    res = run(COMMAND)
    if res.rc != 0:
        said = ((res.stdout or "").strip() or (res.stderr or "").strip()).splitlines()
        return GpuClocks(refused=f"`{COMMAND}` exited {res.rc}: {printable(said[0]) if said else 'nothing said'}")
    return parse(res.stdout)


def parse(text: str) -> GpuClocks:
    """`nvidia-smi -q -x`'s document; what is not stated (N/A, a field this driver lacks) is left out."""
    try:
        root = ET.fromstring(text)
    except ET.ParseError as exc:
        return GpuClocks(refused=f"`{COMMAND}` printed no readable XML ({exc})")
    out = GpuClocks()
    for gpu in root.iter("gpu"):
        bus = gpu.get("id") or f"GPU {len(out.sm_mhz)}"  # as stated (two ids may clean alike): cleaned when shown
        counters = {}
        for el in gpu.iter():
            if (m := _COUNTER.match(el.tag)) and (v := _MICROSECONDS.match(el.text or "")):
                counters[m.group(1)] = int(v.group(1))
        if counters:
            out.counters[bus] = counters
        out.sm_mhz[bus] = (_mhz(gpu.find("clocks/sm_clock")), _mhz(gpu.find("max_clocks/sm_clock")))
    if not out.sm_mhz:
        out.refused = f"`{COMMAND}` listed no GPU"
    elif not out.counters:
        out.refused = f"`{COMMAND}` states no clock event reason counters (this driver or GPU does not keep them)"
    return out


def _mhz(el: ET.Element | None) -> int | None:
    m = _MHZ.match(el.text or "") if el is not None else None
    return int(m.group(1)) if m else None


@dataclass
class Slowdowns:
    """Seconds each reason held each GPU's clocks between two reads."""

    judged: dict[str, dict[str, float]]  # bus -> reason (operator's words) -> seconds, only those above 0
    counted: dict[str, dict[str, float]]

    @property
    def any(self) -> bool:
        return any(self.judged.values())

    def __str__(self) -> str:
        def part(d: dict[str, dict[str, float]]) -> str:
            named = len(d) > 1  # one GPU (a Spark): no bus id to tell apart
            return "; ".join((f"{printable(bus)}: " if named else "")
                             + ", ".join(f"{why} {_duration(s)}" for why, s in reasons.items())
                             for bus, reasons in d.items() if reasons)

        judged, counted = part(self.judged), part(self.counted)
        return (judged or "no thermal or power-brake slowdown") + (f" (counted, not judged: {counted})"
                                                                    if counted else "")


def _duration(seconds: float) -> str:
    return f"{seconds:.1f} s" if seconds >= 0.1 else f"{seconds * 1e3:.3g} ms"  # a judged 40 ms never reads "0.0 s"


def sm_clocks(clocks: GpuClocks) -> str:
    """"SM clock 1455 of 1980 MHz" per GPU that states both; "" where none does (GB10's were never recorded)."""
    named = len(clocks.sm_mhz) > 1
    return "; ".join((f"{printable(bus)}: " if named else "") + f"SM clock {now} of {top} MHz"
                     for bus, (now, top) in clocks.sm_mhz.items() if now and top)


def slowdowns(start: GpuClocks, end: GpuClocks) -> Slowdowns:
    """What each counter grew by from `start` to `end`, for each GPU and counter both reads state (one stated only at
    the end holds time from before the run). A counter that went down means the driver reloaded between the reads:
    its whole value at `end` is counted."""
    judged: dict[str, dict[str, float]] = {}
    counted: dict[str, dict[str, float]] = {}
    for bus, now in end.counters.items():
        before = start.counters.get(bus, {})
        for names, into in ((JUDGED, judged), (COUNTED, counted)):
            grown = {}
            for key, words in names.items():
                if key in now and key in before:
                    delta = now[key] - before[key]
                    if delta < 0:
                        delta = now[key]
                    if delta > 0:
                        grown[words] = delta / 1e6
            into[bus] = grown
    return Slowdowns(judged, counted)


SAMPLE_S = 2.0  # how often the SM clock is read while a perf figure is measured


class Sampler:
    """The GPUs' SM clocks read every SAMPLE_S seconds, in a thread of its own, while a figure is measured: (current,
    max) MHz of the fastest GPU that states both, per read. A read that fails is left out (a clock not read is not
    low)."""

    def __init__(self, run: Callable[[str], Any], every: float = SAMPLE_S) -> None:
        self.run, self.every = run, every
        self.samples: list[tuple[int, int]] = []
        self.reads = 0  # reads that listed a GPU, its SM clock stated or not
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="sparkgate-clocks", daemon=True)

    def _loop(self) -> None:
        while not self._stop.wait(self.every):  # the first read after one interval: the load has begun
            try:
                clocks = read(self.run)
            except Exception:  # noqa: BLE001 (a dropped ssh read is one sample fewer, never the figure's failure)
                continue
            self.reads += bool(clocks.sm_mhz)  # it listed a GPU
            stated = [(now, top) for now, top in clocks.sm_mhz.values() if now and top]
            if stated:  # the fastest GPU of the read: the one under load (a recipe on one of eight leaves seven idle)
                self.samples.append(max(stated))

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)


def below_floor(samples: list[tuple[int, int]], floor_mhz: float | None) -> tuple[float, float, bool]:
    """(median SM clock, the floor held to, whether the median is below it): the floor given, else half the highest
    maximum the driver stated."""
    median = statistics.median(now for now, _ in samples)
    floor = floor_mhz if floor_mhz is not None else max(top for _, top in samples) / 2
    return median, floor, median < floor
