"""The GPU clock counters' reader: what a real NVIDIA driver's `nvidia-smi -q -x` states idle and under load, what
counts against the box, and what a hostile or partial document becomes."""

import time
from types import SimpleNamespace
from xml.sax.saxutils import quoteattr

from hypothesis import given
from hypothesis import strategies as st

from sparkgate import gpuclocks

from .helpers import ROOT

# The real H200 (driver 580.159.04) idle, then 20 s into a bf16 matmul loop at its 700 W limit (shared/hosts).
RECORDED = ROOT / "selftest" / "data" / "hosts" / "h200-vm" / "under-load"
IDLE, LOAD = ((RECORDED / f"{name}-q.xml").read_text() for name in ("idle", "load"))
BUS = "00000000:00:06.0"


def with_counter(document: str, name: str, us: int) -> str:
    tag = f"clocks_event_reasons_counters_{name}"
    start = document.index(f"<{tag}>") + len(tag) + 2
    return document[:start] + f"{us} us" + document[document.index(f"</{tag}>"):]


def test_the_recorded_documents_state_each_counter_and_the_sm_clock():
    idle, load = gpuclocks.parse(IDLE), gpuclocks.parse(LOAD)
    assert not idle.refused and not load.refused
    assert idle.counters[BUS]["sw_power_cap"] == 0 and load.counters[BUS]["sw_power_cap"] == 18_423_027
    assert (idle.sm_mhz[BUS], load.sm_mhz[BUS]) == ((375, 1980), (1455, 1980))
    assert gpuclocks.sm_clocks(load) == "SM clock 1455 of 1980 MHz"


def test_a_gpu_at_its_power_limit_is_counted_and_not_judged():
    """Under load the H200 ran 18.4 s at its power cap: how a GPU under full load is meant to run."""
    slowed = gpuclocks.slowdowns(gpuclocks.parse(IDLE), gpuclocks.parse(LOAD))
    assert not slowed.any
    assert str(slowed) == "no thermal or power-brake slowdown (counted, not judged: SW power cap 18.4 s)"


def test_heat_and_the_power_brake_are_judged_on_what_grew_during_the_run():
    start = gpuclocks.parse(with_counter(IDLE, "sw_therm_slowdown", 2_000_000))  # before the run: not the run's
    end = gpuclocks.parse(with_counter(with_counter(LOAD, "sw_therm_slowdown", 5_500_000), "hw_power_brake", 250_000))
    slowed = gpuclocks.slowdowns(start, end)
    assert slowed.any
    assert str(slowed).startswith("SW thermal slowdown 3.5 s, HW power brake slowdown 0.2 s (counted")


def test_a_counter_that_went_down_means_the_driver_reloaded_and_counts_whole():
    start = gpuclocks.parse(with_counter(IDLE, "hw_therm_slowdown", 9_000_000))
    end = gpuclocks.parse(with_counter(LOAD, "hw_therm_slowdown", 1_000_000))
    assert gpuclocks.slowdowns(start, end).judged == {BUS: {"HW thermal slowdown": 1.0}}


def test_a_document_without_counters_or_gpus_or_xml_is_refused_with_the_reason():
    start, end = IDLE.index("<clocks_event_reasons_counters>"), IDLE.index("</clocks_event_reasons_counters>")
    no_counters = IDLE[:start] + IDLE[end + len("</clocks_event_reasons_counters>"):]
    assert "states no clock event reason counters" in gpuclocks.parse(no_counters).refused
    assert "listed no GPU" in gpuclocks.parse("<nvidia_smi_log></nvidia_smi_log>").refused
    assert "no readable XML" in gpuclocks.parse("Failed to initialize NVML").refused
    failed = SimpleNamespace(rc=9, stdout="NVIDIA-SMI has failed because\x1b[31m it couldn't communicate", stderr="")
    assert gpuclocks.read(lambda _: failed).refused == ("`nvidia-smi -q -x` exited 9: NVIDIA-SMI has failed "
                                                       "because?[31m it couldn't communicate")


@given(st.text(max_size=400))
def test_any_text_parses_without_raising(text):
    gpuclocks.parse(text)
    gpuclocks.parse(f"<nvidia_smi_log><gpu id={text!r}>{text}</gpu></nvidia_smi_log>")


def counters_document(gpus: dict[str, dict[str, int]]) -> str:
    return "<nvidia_smi_log>" + "".join(
        f"<gpu id={quoteattr(bus)}>" + "".join(f"<clocks_event_reasons_counters_{k}>{v} us"
                                              f"</clocks_event_reasons_counters_{k}>" for k, v in counters.items())
        + "</gpu>" for bus, counters in gpus.items()) + "</nvidia_smi_log>"


REASONS = sorted({**gpuclocks.JUDGED, **gpuclocks.COUNTED})


@given(st.dictionaries(st.text(st.characters(exclude_categories=("Cc", "Cs")), max_size=40),
                       st.dictionaries(st.sampled_from(REASONS), st.integers(0, 10**18)), min_size=1, max_size=3))
def test_any_counters_and_bus_ids_make_a_printable_verdict_judged_on_what_grew(gpus):
    """Two reads of any GPUs (any bus id XML can carry; control characters it cannot), the second with every counter
    grown by its own value: printable, and failing exactly when a judged counter grew."""
    start = gpuclocks.parse(counters_document(gpus))
    end = gpuclocks.parse(counters_document({b: {k: 2 * v for k, v in c.items()} for b, c in gpus.items()}))
    slowed = gpuclocks.slowdowns(start, end)
    assert str(slowed).isascii() and str(slowed).isprintable()
    assert slowed.any == any(c.get(k) for c in gpus.values() for k in gpuclocks.JUDGED)


def test_a_counter_only_the_end_states_is_not_blamed_on_the_run():
    """A GPU or counter the start did not state holds time from before the run: not judged."""
    end = gpuclocks.parse(with_counter(LOAD, "hw_power_brake", 9_000_000))
    assert not gpuclocks.slowdowns(gpuclocks.GpuClocks(), end).any
    assert str(gpuclocks.slowdowns(gpuclocks.parse(IDLE), gpuclocks.parse(with_counter(LOAD, "hw_power_brake", 40_000)))
               ).startswith("HW power brake slowdown 40 ms")


def test_sampled_while_a_figure_is_measured_the_h200_under_load_holds_the_floor_and_idle_clocks_would_not():
    """The sampler reads the real documents through `run` as it would over ssh; half of 1980 MHz is the floor."""
    reads = iter([LOAD, LOAD, "not XML", IDLE] + [LOAD] * 100)
    with gpuclocks.Sampler(lambda _cmd: SimpleNamespace(rc=0, stdout=next(reads), stderr=""), every=0.01) as s:
        deadline = time.monotonic() + 10
        while len(s.samples) < 4 and time.monotonic() < deadline:
            time.sleep(0.01)
    assert s.samples[:3] == [(1455, 1980), (1455, 1980), (375, 1980)]  # the unreadable read left out
    assert gpuclocks.below_floor(s.samples[:2], None) == (1455, 990, False)
    assert gpuclocks.below_floor([(375, 1980)] * 3 + [(1455, 1980)], None) == (375, 990, True)
    assert gpuclocks.below_floor([(1455, 1980)], 1500) == (1455, 1500, True)  # a profile's own floor
