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
