"""The host is the hardware class its recipes were written for."""

import pytest


@pytest.mark.check(
    "HOST-ARCH",
    why="the recipe's image and kernels are built for this architecture; another one cannot run them",
    fix="run this recipe on a host of its profile, or pick a recipe for this host with --recipe",
)
def test_the_architecture_is_the_profiles(check, host_facts, profile):
    """The host's CPU architecture MUST be the one its hardware profile names."""
    if profile.arch is None:
        check.cannot_run(f"profile {profile.name} names no architecture", "--profile gb10")
    check.that(host_facts.arch == profile.arch,
               expected=f"{profile.arch} (profile {profile.name})", found=host_facts.arch)


@pytest.mark.check(
    "HOST-GPU",
    why="the recipes' kernels and memory arithmetic are for this GPU (GB10: sm_121, unified memory)",
    fix="run this recipe on a host of its profile; if nvidia-smi failed, fix the driver first",
)
def test_the_gpu_is_the_profiles(check, host_facts, profile):
    """The host's GPU MUST be the one its hardware profile names, with its compute capability."""
    if profile.gpu is None:
        check.cannot_run(f"profile {profile.name} expects no GPU", "--profile gb10")
    if not host_facts.gpus:
        check.cannot_run(f"nvidia-smi lists no GPU ({host_facts.nvidia_smi_error or 'not installed'}): "
                         "HOST-NVIDIA-SMI or HOST-MODULE-MATCH says why")
    found = [f"{g.name} (compute capability {g.compute_cap})" for g in host_facts.gpus]
    want = profile.gpu
    ok = any(g.name == want.name and g.compute_cap == want.compute_capability for g in host_facts.gpus)
    check.that(ok, expected=f"{want.name} (compute capability {want.compute_capability})", found=", ".join(found))
