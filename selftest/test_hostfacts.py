"""Host facts parse what real machines print: a GB10 (public reports) and an H200 VM (recorded here)."""

import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from sparkgate import wallclock
from sparkgate.hostfacts import HostFacts, matching_profile, parse_gpu_csv, parse_meminfo, parse_os_release
from sparkgate.recipes import load_profiles

DATA = Path(__file__).parent / "data" / "hosts"
H200 = (DATA / "h200-vm" / "host-facts.txt").read_text()


def recorded(command: str) -> str:
    """The output recorded under `$ command` in the H200 host-facts file."""
    match = re.search(rf"^\$ {re.escape(command)}\n(.*?)(?=^\$ |\Z)", H200, re.S | re.M)
    assert match, command
    return match.group(1)


def test_the_h200_csv_row_parses_with_its_memory():
    [gpu] = parse_gpu_csv(recorded(
        "nvidia-smi --query-gpu=name,driver_version,compute_cap,memory.total,memory.used,memory.free,"
        "pci.bus_id --format=csv,noheader"))
    assert (gpu.name, gpu.driver_version, gpu.compute_cap) == ("NVIDIA H200", "580.159.04", "9.0")
    assert (gpu.memory_total_mib, gpu.memory_free_mib, gpu.pci_bus_id) == (143771, 143156, "00000000:00:06.0")


def test_the_gb10_na_memory_fields_parse_as_absent():
    # nvidia-smi on GB10 prints [N/A] for every memory field (unified memory); see gb10-FACTS.md.
    [gpu] = parse_gpu_csv("NVIDIA GB10, 595.84, 12.1, [N/A], [N/A], [N/A], 0000000F:01:00.0\n")
    assert gpu.name == "NVIDIA GB10" and gpu.compute_cap == "12.1"
    assert gpu.memory_total_mib is gpu.memory_used_mib is gpu.memory_free_mib is None


def test_a_malformed_csv_row_is_an_error_not_a_wrong_fact():
    with pytest.raises(ValueError, match="printed 2 fields"):
        parse_gpu_csv("NVIDIA GB10, 595.84\n")


def test_meminfo_is_read_in_bytes():
    mem = parse_meminfo(recorded("head -5 /proc/meminfo"))
    assert mem["MemTotal"] == 131981020 * 1024 and mem["MemAvailable"] == 131474532 * 1024


def test_os_release_pretty_name():
    assert parse_os_release(recorded("cat /etc/os-release")) == "Ubuntu 24.04.3 LTS"


def facts(arch, gpus="", module=None, smi=True):
    return HostFacts(target="t", hostname="h", arch=arch, kernel="k", os="o", cpus=1, mem_total_bytes=1,
                     mem_available_bytes=1, nvidia_smi="/usr/bin/nvidia-smi" if smi else None,
                     gpus=parse_gpu_csv(gpus) if gpus else [], nvidia_module_version=module)


@pytest.mark.parametrize(
    ("host", "profile"),
    [
        (facts("aarch64", "NVIDIA GB10, 595.84, 12.1, [N/A], [N/A], [N/A], 0000000F:01:00.0"), "gb10"),
        # A Spark whose driver is broken is still a Spark: its host checks must run and fail.
        (facts("aarch64", module="580.126.09"), "gb10"),
        (facts("x86_64", smi=False), "cpu"),
        (facts("x86_64", "NVIDIA H200, 580.159.04, 9.0, 143771 MiB, 0 MiB, 143156 MiB, 00000000:00:06.0"), None),
    ],
    ids=["gb10", "gb10-broken-driver", "cpu-box", "h200-vm"],
)
def test_a_host_matches_its_hardware_profile(host, profile):
    found = matching_profile(host, load_profiles())
    assert (found.name if found else None) == profile


def test_the_box_clock_is_read_at_the_shortest_round_trip_and_judged_at_either_end_of_its_error():
    """Of three readings, the one with the shortest round trip (timed on the monotonic clock) is kept, placed halfway
    through it; the clocks are apart only beyond the reading's error, together only within it."""
    said = iter(["1796584594.500000000", "1796584594.900000000", "1796584595.100000000"])
    wall = iter([1796584499.0, 1796584500.2, 1796584500.5])
    ticks = iter([10.0, 11.0, 20.0, 20.2, 30.0, 31.0])
    reading = wallclock.offset(lambda _command: SimpleNamespace(stdout=next(said), stderr="", rc=0),
                               wall=wall.__next__, monotonic=ticks.__next__)
    assert (reading.seconds, reading.within) == (pytest.approx(94.6), pytest.approx(0.1))
    assert reading.beyond(94.45) and not reading.beyond(94.55) and not reading.inside(94.65) and reading.inside(94.75)
    assert wallclock.describe(reading.seconds) == "94.6 s ahead of" and wallclock.describe(-0.0123) == "0.012 s behind"


@pytest.mark.parametrize("printed, seconds", [("0.000000001\n", 1e-9), ("86400.000000000", 86400.0),
                                              ("1796584594.5\n", None), ("1796584594.%N\n", None), ("", None)])
def test_a_clock_reset_to_1970_is_a_reading_and_a_date_without_nanoseconds_is_not(printed, seconds):
    """A box whose clock restarted at the epoch (a flat RTC battery) reads as such, so the check judges it; a `date`
    that prints %N literally (busybox) or no fraction at all is refused, not misread."""
    assert wallclock.parse_epoch(printed) == seconds
