"""No check passes over nothing. Every check that judges "every X" over a set takes the set through one helper,
Check.every, which refuses an empty set: could not run, saying what it found none of and where, never a pass and
never a failure. A rule that judges a set on its own (CONT-ENV's) does the same. The host checks over a set are
proven on an empty test host (test_host_layer.py); PERF-CONCURRENT's floors here, on the embedded default.
"""

import pytest

from sparkgate.checks import Check
from sparkgate.recipes import load_recipes
from sparkgate.rules import env_rule

from .helpers import broken_recipe, run_suite

INITRAMFS = Check("HOST-INITRAMFS", "/boot/initrd.img-<kernel> MUST exist for every bootable kernel.", "why", "fix")
SHIPPED = load_recipes()


@pytest.mark.parametrize("empty", [[], (), {}, set(), (k for k in ())], ids=["list", "tuple", "dict", "set",
                                                                          "generator"])
def test_an_empty_set_could_not_run_saying_what_it_looked_for_and_where(empty):
    with pytest.raises(pytest.skip.Exception) as skipped:
        INITRAMFS.every(empty, "bootable kernel", "/boot (vmlinuz-*)", "--profile gb10")
    assert str(skipped.value) == ("[HOST-INITRAMFS] could not run: no bootable kernel found in /boot (vmlinuz-*) "
                                  "(to run it: --profile gb10)")


def test_a_set_with_members_is_handed_back_whole_to_be_judged():
    kernels = ["6.17.0-1031-nvidia", "6.17.0-1029-nvidia"]
    assert INITRAMFS.every(iter(kernels), "bootable kernel", "/boot (vmlinuz-*)") == kernels


def test_cont_env_could_not_run_for_a_recipe_that_requires_no_variable_and_judges_one_that_does():
    """qwen36 (image vllm-node, env {}, nvfp4) requires nothing: any container's env would pass "every variable"."""
    cont_env = Check("CONT-ENV", "The container's environment MUST hold every variable the recipe needs.", "", "")
    with pytest.raises(pytest.skip.Exception, match=r"^\[CONT-ENV\] could not run: qwen36-35b-a3b-nvfp4 requires no "
                                                    r"environment variable \(its env is empty, and neither its image "
                                                    r"vllm-node nor its nvfp4 quantization needs one\)$"):
        cont_env.holds(env_rule(SHIPPED["qwen36-35b-a3b-nvfp4"], {"PATH": "/usr/bin"}))
    verdict = env_rule(SHIPPED["qwen38-27b-nvfp4"], {"PATH": "/usr/bin"})
    assert (verdict.ok, verdict.not_applicable, verdict.found) == (False, "", "CUTE_DSL_ARCH missing (want "
                                                                              "CUTE_DSL_ARCH=sm_121a)")


def test_concurrency_floors_only_for_levels_never_measured_could_not_run(pytester, tmp_path, embedded_server):
    """max-num-seqs 4 measures 1 and 4 concurrent; floors for 8 only judge nothing (green and red with floors it
    measures: test_suite.py's test_a_floor_the_server_cannot_reach_fails_its_check and the newcomer run)."""
    def past_max_num_seqs(data):
        floors = data["floors"]
        floors["concurrent_8_decode"] = floors.pop("concurrent_4_decode")
        floors.pop("single_stream_decode")

    recipes = broken_recipe(tmp_path, past_max_num_seqs)
    result = run_suite(pytester, "-m", "perf", f"--recipes-dir={recipes}", "--recipe=smollm2-cpu",
                       f"--base-url={embedded_server.base_url}", "-k", "decode_under_concurrency", "--level=quick")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["SKIPPED*[[]PERF-CONCURRENT[]] could not run: no floor for a concurrency level "
                                 "measured found in recipe smollm2-cpu (levels measured: 1, 4; floors declared: "
                                 "*concurrent_8_decode*; figures were recorded)"])
