"""A fleet's results files compared: three test hosts over real ssh, one on an older driver, each checked by the
host layer as an owner checks a box; `sparkgate fleet` names the box that differs and what differs."""

import json
import os
import subprocess
import sys

import pytest

from selftest.testhost.spark01 import DEFAULT_DRIVER, HostSpec, TestHost
from sparkgate.fleet import Difference

from .helpers import node_id, run_suites_at_once

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the test hosts need root (network namespaces)")
OLD_DRIVER = "580.159.03"


def fleet(*files):
    return subprocess.run([sys.executable, "-m", "sparkgate.cli", "fleet", *map(str, files)], capture_output=True,
                          text=True, timeout=60)


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """host name -> the results file of its host-layer run (the driver check: the results record the box either way);
    spark02 runs an older driver. The three run at once, each against its own host."""
    tmp = tmp_path_factory.mktemp("fleet")
    test = node_id(__name__, "test_the_box_on_another_driver_is_named_with_its_driver_and_module")
    with TestHost(HostSpec(), "spark01", 0) as a, TestHost(HostSpec(driver_version=OLD_DRIVER), "spark02", 1) as b, \
            TestHost(HostSpec(), "spark03", 2) as c:
        runs = run_suites_at_once({h.name: (test, ["-m", "host", f"--host={h.name}", f"--ssh-config={h.ssh_config}",
                                                   f"--results-json={tmp / f'{h.name}.json'}", "-k", "driver_is"])
                                   for h in (a, b, c)}, tmp)
    assert [r.ret for r in runs.values()] == [0, 1, 0], {n: r.stdout.str()[-2000:] for n, r in runs.items()}
    return {name: tmp / f"{name}.json" for name in runs}


def test_the_box_on_another_driver_is_named_with_its_driver_and_module(results):
    """Three boxes, one on another driver: `fleet` MUST name that box, its driver and kernel module against the
    other two's, and exit 1."""
    run = fleet(*results.values())
    assert run.returncode == 1, run.stdout + run.stderr
    lines = run.stdout.splitlines()
    assert lines[0] == "fleet of 3 boxes: spark01, spark02, spark03"
    assert f"DIFFERS driver: spark02 has {OLD_DRIVER}; the other 2 (spark01, spark03) have {DEFAULT_DRIVER}" in lines
    assert (f"DIFFERS NVIDIA kernel module: spark02 has {OLD_DRIVER}; the other 2 (spark01, spark03) have "
            f"{DEFAULT_DRIVER}") in lines
    assert "1 box(es) differ in 2 field(s)" in run.stdout
    agree = next(line for line in lines if line.startswith("agree (")).split(": ", 1)[1].split(", ")
    assert agree == ["sparkgate", "arch", "os", "kernel", "GPUs", "docker"], agree


def test_boxes_that_agree_exit_0(results):
    run = fleet(results["spark01"], results["spark03"])
    assert run.returncode == 0, run.stdout + run.stderr
    assert "DIFFERS" not in run.stdout and "driver" in run.stdout.split("agree (")[1].split(", ")


def test_two_boxes_that_differ_are_both_named_with_their_values(results):
    run = fleet(results["spark01"], results["spark02"])
    assert run.returncode == 1
    assert (f"DIFFERS driver (no value most boxes share): spark01 has {DEFAULT_DRIVER}; spark02 has {OLD_DRIVER}"
            in run.stdout.splitlines()), run.stdout


def test_one_host_in_two_files_is_told_apart_by_file_and_what_a_file_says_is_printed_inert(results, tmp_path):
    """Two files of one host MUST be named apart (by file); a contributor's file is untrusted: a hostname carrying a
    terminal escape MUST be printed as `?`."""
    data = json.loads(results["spark02"].read_text())
    data["system"]["hostname"] = "spark01\x1b[2J"
    evil = tmp_path / "evil.json"
    evil.write_text(json.dumps(data))
    again = tmp_path / "spark01-again.json"
    again.write_bytes(results["spark01"].read_bytes())
    run = fleet(results["spark01"], evil, again)
    assert "\x1b" not in run.stdout and "spark01?[2J has" in run.stdout, run.stdout
    assert run.stdout.splitlines()[0] == ("fleet of 3 boxes: spark01 (spark01.json), spark01?[2J, spark01 "
                                          "(spark01-again.json)"), run.stdout


def test_every_file_is_a_box_even_where_names_and_long_values_collide(results, tmp_path):
    """Files in folders of long names, and a hostname that reads like another box's label, MUST each stay a box of
    their own; a long GPU list MUST be printed whole, so two lists that differ at the end print differently."""
    deep = tmp_path / ("x" * 100) / ("y" * 100)
    base = json.loads(results["spark01"].read_text())
    files = []
    for i, (host, gpus) in enumerate([("spark01", 8), ("spark01", 8), ("spark01 (c.json)", 7)]):
        data = json.loads(json.dumps(base))
        data["system"] |= {"hostname": host, "gpus": ["NVIDIA H100 80GB HBM3 (cc 9.0)"] * gpus}
        files.append(deep / f"{'abc'[i]}.json")
        files[-1].parent.mkdir(parents=True, exist_ok=True)
        files[-1].write_text(json.dumps(data))
    run = fleet(*files)
    assert run.stdout.splitlines()[0] == "fleet of 3 boxes: spark01 (a.json), spark01 (b.json), spark01 (c.json)", \
        run.stdout
    gpus = next(line for line in run.stdout.splitlines() if line.startswith("DIFFERS GPUs"))
    assert gpus.count("(cc 9.0)") == 15, gpus


def test_fewer_than_two_files_the_same_file_twice_or_one_unreadable_is_a_clear_error(results, tmp_path):
    one = fleet(results["spark01"])
    assert one.returncode == 2 and "a fleet is two boxes or more" in one.stderr
    twice = fleet(results["spark01"], results["spark01"].parent / "." / results["spark01"].name)
    assert twice.returncode == 2 and "a file is given twice" in twice.stderr
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    unreadable = fleet(results["spark01"], bad)
    assert unreadable.returncode == 2 and f"{bad} is not a sparkgate results file" in unreadable.stderr
    hostile = json.loads(results["spark01"].read_text())
    hostile["recipes"] = [{"recipe": "r", "floors": {"\x1b]0;pwned\x07": "fast"}}]
    bad.write_text(json.dumps(hostile))
    said = fleet(results["spark01"], bad).stderr
    assert "\x1b" not in said and "\x07" not in said and "floors.?]0;pwned?" in said, said


def test_the_odd_boxes_are_those_off_the_value_most_hold_or_all_on_a_tie():
    assert Difference("driver", {"a": ["x", "y"], "b": ["z"]}).odd == ["z"]
    assert Difference("driver", {"a": ["x"], "b": ["z"]}).odd == ["x", "z"]
    assert Difference("driver", {"a": ["x", "y"], "b": ["z", "w"], "c": ["v"]}).odd == ["x", "y", "z", "w", "v"]


def served(recipe, vllm, **server):
    return {"recipe": recipe, "recipe_digest": "d1", "serving_digest": "s1", "model": "m", "image": "img:tag",
            "image_id": "sha256:1", "image_digest": None, "vllm_version": vllm, "server": server}


def fleet_of(results, tmp_path, recipes):
    """`fleet` over the three boxes' files, each box's recipes replaced: name -> its recipe runs."""
    files = []
    for name, runs in recipes.items():
        data = json.loads(results[name].read_text())
        data["recipes"] = runs
        files.append(tmp_path / f"{name}.json")
        files[-1].write_text(json.dumps(data))
    return fleet(*files)


def test_a_recipe_served_on_another_vllm_is_named_and_one_served_on_one_box_only_is_not_compared(results, tmp_path):
    """Per recipe, the boxes MUST be compared among those that ran it: the vLLM version spark02 ran differs; a recipe
    only spark03 ran is compared with nothing, and said so."""
    run = fleet_of(results, tmp_path, {"spark01": [served("r", "0.32.0")], "spark02": [served("r", "0.31.1")],
                                       "spark03": [served("r", "0.32.0"), served("only-here", "0.32.0")]})
    assert run.returncode == 1, run.stdout + run.stderr
    assert "DIFFERS r: vLLM version: spark02 has 0.31.1; the other 2 (spark01, spark03) have 0.32.0" in run.stdout
    assert "r: recipe digest" in run.stdout.split("agree (")[1].split("\n")[0].split(", "), run.stdout
    assert "only-here: vLLM version (spark03)" in run.stdout.split("recorded by one box only, not compared: ")[1]


def test_a_box_whose_image_carries_another_nccl_is_named_with_its_build(results, tmp_path):
    """The libraries CONT-KNOWN-BAD read in each server's image: an NCCL build one box's differs in MUST be named
    (two nodes on two NCCL builds may hang in their first collective); the server's other facts (its KV cache size)
    are the box's own and not compared."""
    good = dict(nccl="nvidia-nccl-cu13 2.28.7", torch="torch 2.10.0", attention_backend="FLASHINFER",
                kv_cache_gib="20.0")
    run = fleet_of(results, tmp_path, {
        "spark01": [served("r", "0.32.0", **good)],
        "spark02": [served("r", "0.32.0", **{**good, "nccl": "nvidia-nccl-cu13 2.27.3", "kv_cache_gib": "19.5"})],
        "spark03": [served("r", "0.32.0", **good)]})
    assert run.returncode == 1, run.stdout + run.stderr
    assert ("DIFFERS r: nccl: spark02 has nvidia-nccl-cu13 2.27.3; the other 2 (spark01, spark03) have "
            "nvidia-nccl-cu13 2.28.7") in run.stdout.splitlines(), run.stdout
    agree = run.stdout.split("agree (")[1].split("\n")[0]
    assert "r: torch" in agree and "r: attention_backend" in agree and "kv_cache" not in run.stdout, run.stdout
