"""The GPU's clocks over the run: every figure the run measured was measured at the box's speed."""

import time

import pytest

from sparkgate import gpuclocks


@pytest.mark.run_end
@pytest.mark.check(
    "HOST-GPU-CLOCKS",
    why="a GPU that slows its clocks for heat (DGX Spark owners report SW thermal slowdown under load, SM clocks near "
        "700 MHz) or on a power brake serves slower than the box can: every figure measured meanwhile is of a hot or "
        "starved box, not of the image or flags under test, and a gate would blame the upgrade for it",
    fix="give the box air (its vents clear, nothing stacked on it, the room cooler) and let it cool, read `nvidia-smi "
        "-q -d PERFORMANCE,TEMPERATURE,POWER` while it serves, and run the suite again; a power brake or a low-power "
        "state that stays after a reboot is the power supply's: unplug the box from AC for a minute, then open a case "
        "with its vendor if it comes back",
)
def test_the_gpu_clocks_were_never_held_down_for_heat_or_power_during_the_run(check, target_host, host_facts, profile,
                                                                              gpu_clocks_at_start, record_property):
    """No thermal or power-brake slowdown MUST have held the GPU's clocks from the run's start to its end."""
    if profile.gpu is None:
        check.cannot_run(f"profile {profile.name} expects no NVIDIA GPU", "--profile gb10")
    if host_facts.nvidia_module_version is None or not host_facts.gpus:
        check.cannot_run("nvidia-smi lists no GPU (" + (host_facts.nvidia_smi_error or "not installed")
                         + "): HOST-NVIDIA-SMI says why")
    start, began = gpu_clocks_at_start or (None, None)
    if start is None or start.refused:
        check.cannot_run("the GPU's clock counters could not be read when the run began ("
                         + (start.refused if start else "the run never reached the box") + ")",
                         "an NVIDIA driver whose `nvidia-smi -q` lists Clocks Event Reasons Counters")
    end = gpuclocks.read(target_host.run)
    if end.refused:
        check.cannot_run(f"the GPU's clock counters could not be read at the run's end ({end.refused})")
    span = f"the run's {time.monotonic() - began:.0f} s"
    slowed = gpuclocks.slowdowns(start, end)
    clocks = gpuclocks.sm_clocks(end)  # read after the load: an idle clock says nothing of throttling, so not shown
    record_property("gpu clocks", f"over {span}: {slowed}" + (f"; after it: {clocks}" if clocks else ""))
    check.that(not slowed.any, expected=f"no thermal or power-brake slowdown over {span} (`{gpuclocks.COMMAND}`'s "
                                        "clock event reason counters)", found=str(slowed))


@pytest.mark.run_end
@pytest.mark.check(
    "HOST-GPU-CLOCK-FLOOR",
    why="a perf figure is the box's speed only if the GPU ran at its clocks while it was measured: DGX Spark owners "
        "report SM clocks near 700 MHz under load, and a low-power state that only pulling AC power cleared; a figure "
        "measured so is of a slowed GPU, and a gate would blame the image or flags for it (the counters of "
        "HOST-GPU-CLOCKS name heat and the power brake; this sees a clock held low for any reason)",
    fix="read `nvidia-smi -q -d PERFORMANCE,CLOCK` while the box serves: the clock event reasons it lists as Active "
        "say why; a clock that stays low after a reboot is the power supply's or the firmware's (unplug the box from "
        "AC for a minute); then measure again",
)
def test_the_sm_clock_held_its_floor_while_every_perf_figure_was_measured(check, profile, gpu_clock_samples,
                                                                         record_property):
    """While each perf check measured, the GPU's median SM clock MUST have stayed at or above the floor: the
    profile's, else half the highest SM clock the driver states."""
    if profile.gpu is None:
        check.cannot_run(f"profile {profile.name} expects no NVIDIA GPU", "--profile gb10")
    if not gpu_clock_samples:
        check.cannot_run(f"no perf check of a GPU recipe measured long enough in this run for a read of the clock "
                         f"(one every {gpuclocks.SAMPLE_S:g} s), or nvidia-smi lists no GPU", "-m perf")
    stated = [(what, samples) for what, samples in gpu_clock_samples if samples]
    if not stated:
        check.cannot_run(f"the driver states no SM clock while the figures were measured (`{gpuclocks.COMMAND}`: "
                         "clocks/sm_clock N/A)")
    rows, low = [], []
    for what, samples in stated:
        median, floor, below = gpuclocks.below_floor(samples, profile.sm_clock_floor_mhz)
        top = max(t for _, t in samples)
        rows.append(f"{what}: {median:.0f} MHz (median of {len(samples)} reads, of a {top} MHz maximum)")
        if below:
            low.append(f"{rows[-1]}, floor {floor:.0f} MHz")
    floor_of = (f"the profile's {profile.sm_clock_floor_mhz:g} MHz ({profile.sm_clock_floor_source})"
                if profile.sm_clock_floor_mhz is not None else "half the highest SM clock the driver states")
    record_property("sm clock under load", "; ".join(rows))
    check.that(not low, expected=f"an SM clock of at least {floor_of} while each perf figure was measured",
               found=f"below it: {'; '.join(low)}" + (f" (at or above it: {len(rows) - len(low)} more)"
                                                     if len(low) < len(rows) else ""))
