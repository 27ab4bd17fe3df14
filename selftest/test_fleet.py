"""A fleet: three test hosts over real ssh, one on an older driver, checked by the host layer in one command (one
pytest-xdist worker per box) with one merged report; Ctrl-C during such a run; and the boxes' results files compared
by `sparkgate fleet`, which names the box that differs and what differs."""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest

from selftest.testhost.spark01 import DEFAULT_DRIVER, HostSpec, TestHost
from sparkgate.fleet import Difference, fleet_hosts, per_host
from sparkgate.hostlock import LOCK_DIR

from .helpers import ROOT, SUITE_PLUGINS, TESTS, node_id, run_suites_at_once

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the test hosts need root (network namespaces)")
OLD_DRIVER = "580.159.03"


def fleet(*files):
    return subprocess.run([sys.executable, "-m", "sparkgate.cli", "fleet", *map(str, files)], capture_output=True,
                          text=True, timeout=60)


@pytest.fixture(scope="module")
def boxes(tmp_path_factory):
    """Three test hosts, spark02 on an older driver, and one ssh config that names them all."""
    with TestHost(HostSpec(), "spark01", 0) as a, TestHost(HostSpec(driver_version=OLD_DRIVER), "spark02", 1) as b, \
            TestHost(HostSpec(), "spark03", 2) as c:
        config = tmp_path_factory.mktemp("fleet-ssh") / "ssh_config"
        config.write_text("".join(h.ssh_config.read_text() for h in (a, b, c)))
        yield {h.name: h for h in (a, b, c)}, config


@pytest.fixture(scope="module")
def fleet_run(boxes, tmp_path_factory):
    """One command checks the three boxes at once, two named by --host and one by an inventory file, one pytest-xdist
    worker each: the driver check, with a results file per box, one Markdown summary and one HTML report."""
    hosts, ssh_config = boxes
    tmp = tmp_path_factory.mktemp("fleet")
    (tmp / "inventory").write_text("# the lab\n[sparks]\nspark03\n")
    test = node_id(__name__, "test_one_command_checks_every_box_and_fails_only_the_box_on_the_old_driver")
    run = run_suites_at_once({"fleet": (test, [
        "-m", "host", "--host=spark01", "--host=spark02", f"--inventory={tmp / 'inventory'}",
        f"--ssh-config={ssh_config}", f"--results-json={tmp / 'run.json'}", f"--summary-md={tmp / 'fleet.md'}",
        f"--html={tmp / 'fleet.html'}", "--self-contained-html", "-k", "driver_is"])}, tmp)["fleet"]
    return run, tmp


@pytest.fixture(scope="module")
def results(fleet_run):
    """host name -> its results file, as the fleet run wrote them."""
    run, tmp = fleet_run
    return {name: tmp / f"run.{name}.json" for name in ("spark01", "spark02", "spark03")}


def test_one_command_checks_every_box_and_fails_only_the_box_on_the_old_driver(fleet_run):
    """Each box MUST be checked by its own worker: spark01 and spark03 pass the driver check, spark02 fails exactly
    it, and every failure names its box."""
    run, _ = fleet_run
    out = run.stdout.str()
    assert run.ret == 1, out[-3000:]
    assert "sparkgate fleet: spark01 (gw0), spark02 (gw1), spark03 (gw2)" in out, out[:3000]
    failed = [line.split(" - ")[0] for line in run.outlines if line.startswith("FAILED ")]
    assert failed == ["FAILED tests/host/test_driver.py::test_the_driver_is_at_least_the_profiles_minimum@spark02"], \
        failed
    assert "__ test_the_driver_is_at_least_the_profiles_minimum@spark02 __" in out, out[-3000:]
    for box, (passed, n_failed) in {"spark01": (1, 0), "spark02": (0, 1), "spark03": (1, 0)}.items():
        assert f"{box}: {passed} passed, {n_failed} failed, 0 could not run; results: " in out, out[-3000:]
    assert (f"DIFFERS driver: spark02 has {OLD_DRIVER}; the other 2 (spark01, spark03) have {DEFAULT_DRIVER}"
            in run.outlines), out[-3000:]
    # pytest-benchmark, which turns itself off under xdist, is off in each box's worker before it says so
    assert "because xdist plugin is active" not in out + run.stderr.str(), run.stderr.str()[-3000:]


def test_the_fleet_summary_groups_failures_by_box_under_one_table_of_boxes(fleet_run, results):
    run, tmp = fleet_run
    md = (tmp / "fleet.md").read_text()
    assert md.startswith("# sparkgate fleet: 3 boxes\n"), md[:500]
    assert f"| spark02 | 0 | 1 | 0 | {results['spark02']} |" in md, md[:1500]
    spark02 = md.split("## spark02: 0 passed, 1 failed, 0 could not run")[1].split("## spark03")[0]
    assert "- **HOST-DRIVER-MIN**" in spark02 and f"- Driver: {OLD_DRIVER}" not in md.split("## spark02")[0], md
    assert "HOST-DRIVER-MIN" not in md.split("## spark01: 1 passed")[1].split("## spark02")[0], md


def test_the_fleet_report_has_a_host_column_and_a_section_per_box(fleet_run):
    """The HTML report, as a person sees it in Chromium: the boxes' table, the agreement naming spark02's driver,
    and the failed row naming its box in the Host column."""
    browser = shutil.which("chromium")
    if browser is None:
        pytest.skip("no chromium: the report was written but not opened (apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    _, tmp = fleet_run
    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=browser, args=["--no-sandbox", "--disable-gpu"])
        page = chromium.new_page(viewport={"width": 1400, "height": 1000})
        page.goto((tmp / "fleet.html").as_uri())
        page.wait_for_selector("#sparkgate-fleet")
        assert "spark02\t0\t1\t0" in page.inner_text("#sparkgate-fleet"), page.inner_text("#sparkgate-fleet")
        assert f"DIFFERS driver: spark02 has {OLD_DRIVER}" in page.inner_text("#sparkgate-agreement")
        failed = page.locator("#results-table tbody.failed tr").first.inner_text()
        assert failed.split("\t")[:3] == ["Failed", "spark02", "HOST-DRIVER-MIN"], failed
        page.screenshot(path=str(tmp / "fleet.png"), full_page=True)
        ids = page.eval_on_selector_all("[id]", "nodes => nodes.map(n => n.id)")
        chromium.close()
    assert len(ids) == len(set(ids)) and {"sparkgate-summary-box1", "sparkgate-failures-box2"} <= set(ids), ids


@pytest.mark.parametrize("how", ["ctrl-c", "sigterm-to-the-controller"])
def test_ctrl_c_during_a_fleet_run_puts_every_box_back(boxes, tmp_path, how):
    """Ctrl-C (SIGINT to the terminal's process group), or SIGTERM to the controller alone (CI's cancel), while both
    boxes' runs hold their locks mid-check: each box's teardown MUST run to its end, however long (16 s here, past
    the 15 s after which a pytest-xdist worker told to exit kills itself), the run MUST stop with exit 2, each box's
    run lock MUST be free with no holder record left, no lock holder of this machine may outlive it, and the
    progress lines MUST name their box."""
    hosts, ssh_config = boxes
    held = tmp_path / "held"
    held.mkdir()
    env = {**os.environ, "SG_HELD_DIR": str(held), "SG_TEARDOWN_S": "16" if how == "ctrl-c" else "0",
           "HOME": str(tmp_path), "PY_COLORS": "0",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    run = subprocess.Popen([sys.executable, "-m", "pytest", TESTS, *SUITE_PLUGINS, "-p", "selftest.hold_check", "-m",
                            "host", "--host=spark01", "--host=spark02", f"--ssh-config={ssh_config}"],
                           cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while len(list(held.iterdir())) < 2 and run.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert sorted(p.name for p in held.iterdir()) == ["spark01", "spark02"], run.communicate(timeout=30)[0]
        if how == "ctrl-c":
            os.killpg(run.pid, signal.SIGINT)
        else:
            os.kill(run.pid, signal.SIGTERM)
        out = run.communicate(timeout=120)[0]
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
    assert run.returncode == 2, out[-3000:]
    last = out.rstrip().splitlines()[-1]  # the check the Ctrl-C cut short is no failure (xdist's "crashed" report)
    assert "failed" not in last and "crashed while running" not in out, out[-3000:]
    assert sorted(p.name for p in held.iterdir()) == ["spark01", "spark01.put-back", "spark02", "spark02.put-back"], \
        out[-3000:]
    assert "[sparkgate spark01] holding the driver check" in out and "[sparkgate spark02] holding" in out, out[-3000:]
    signame = "SIGINT" if how == "ctrl-c" else "SIGTERM"
    assert f"[sparkgate] {signame} received: waiting for each box's run to put its box back" in out, out[-3000:]
    for name in ("spark01", "spark02"):
        left = hosts[name].run(f"ls -A {LOCK_DIR}; flock -n {LOCK_DIR} echo free")
        assert left.stdout.split() == ["free"], (name, left.stdout, out[-3000:])
    holders = subprocess.run(["pgrep", "-f", "sparkgate-lock"], capture_output=True, text=True).stdout.split()
    assert not holders, holders


def test_a_box_that_cannot_be_reached_is_one_error_and_the_other_boxes_are_checked(boxes, tmp_path):
    """A fleet with one box ssh cannot reach: that box MUST be one error naming it (exit 4), the other box MUST still be
    checked, and the run MUST NOT hang waiting for the lost box's worker."""
    _, ssh_config = boxes
    env = {**os.environ, "HOME": str(tmp_path), "PY_COLORS": "0",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    run = subprocess.run([sys.executable, "-m", "pytest", TESTS, *SUITE_PLUGINS, "-m", "host", "-k", "driver_is",
                          "--host=spark01", "--host=sg-nowhere.invalid", f"--ssh-config={ssh_config}"], cwd=ROOT,
                         env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 4, run.stdout[-3000:] + run.stderr[-3000:]
    assert "spark01: 1 passed, 0 failed, 0 could not run" in run.stdout, run.stdout[-3000:]
    assert "sg-nowhere.invalid: 0 passed, 0 failed, 0 could not run; results: ERROR: cannot reach sg-nowhere.invalid " \
           "to take its run lock" in run.stdout, run.stdout[-3000:]
    assert "[sparkgate sg-nowhere.invalid] ERROR: this box could not be checked" in run.stderr, run.stderr[-3000:]


def test_a_redacted_fleet_names_its_boxes_box1_box2_everywhere(boxes, tmp_path):
    """--redact: the boxes MUST be box1, box2 in the terminal, the test ids, the summary and the results files' names,
    and their hostnames MUST appear in none of these."""
    _, ssh_config = boxes
    test = node_id(__name__, "test_a_redacted_fleet_names_its_boxes_box1_box2_everywhere")
    run = run_suites_at_once({"redacted": (test, [
        "-m", "host", "-k", "driver_is", "--host=spark01", "--host=spark02", f"--ssh-config={ssh_config}", "--redact",
        f"--results-json={tmp_path / 'run.json'}", f"--summary-md={tmp_path / 'fleet.md'}"])}, tmp_path)["redacted"]
    out, md = run.stdout.str(), (tmp_path / "fleet.md").read_text()
    assert run.ret == 1 and "sparkgate fleet: box1 (gw0), box2 (gw1)" in out, out[-3000:]
    assert "test_the_driver_is_at_least_the_profiles_minimum@box2" in out, out[-3000:]
    assert sorted(p.name for p in tmp_path.glob("run.*.json")) == ["run.box1.json", "run.box2.json"]
    written = out + md + "".join(p.read_text() for p in tmp_path.glob("run.*.json"))
    assert "spark01" not in written and "spark02" not in written, [line for line in written.splitlines()
                                                                   if "spark0" in line][:5]


def test_listing_the_checks_of_a_fleet_starts_no_worker(tmp_path):
    run = subprocess.run([sys.executable, "-m", "pytest", TESTS, *SUITE_PLUGINS, "--host=spark01", "--host=spark02",
                          "--list-checks=-"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and "| `HOST-DRIVER-MIN` |" in run.stdout, run.stdout[-1500:] + run.stderr[-1500:]
    assert "workers" not in run.stdout, run.stdout[-1500:]


def test_an_inventory_names_boxes_and_refuses_what_it_would_misread(tmp_path):
    """Groups, groups of groups and comments MUST be skipped; a variable (a host's or a group's), a range, a name no
    ssh could take, a box named twice, `local` among boxes and an empty inventory MUST each be one error naming it."""
    inventory = tmp_path / "inventory"
    inventory.write_text("[sparks]\nspark01  # rack 2\n\n; old\nssh://ops@spark02:2222\n[lab:children]\nsparks\n")
    assert fleet_hosts(["spark09"], str(inventory)) == ["spark09", "spark01", "ssh://ops@spark02:2222"]
    assert per_host("out/run.json", "ssh://ops@spark02:2222") == "out/run.ops_spark02_2222.json"
    for text, said in (("[sparks]\nspark01 ansible_host=10.0.0.7\n", "line 2: 'spark01 ansible_host=10.0.0.7' says "
                                                                       "more than a box"),
                       ("[sparks:vars]\nansible_user=ops\n", "line 2: 'ansible_user=ops' says more than a box"),
                       ("spark[01:03]\n", "line 1: 'spark[01:03]' is a range"),
                       ("all:\n  hosts:\n", "line 1: 'all:' reads as YAML"),
                       ("# nothing\n[sparks]\n", "names no box")):
        inventory.write_text(text)
        with pytest.raises(ValueError, match=re.escape(said)):
            fleet_hosts(None, str(inventory))
    for given, said in ((["spark01", "spark01"], "spark01 named twice"), (["local", "spark01"], "local in a fleet"),
                        (["spark01", "spark02\x1b[2J"], "'spark02?[2J' is not a box to reach")):
        with pytest.raises(ValueError, match=re.escape(said)):
            fleet_hosts(given, None)
    assert fleet_hosts(None, None) == ["local"]
    inventory.write_text("ssh://ops@[fd00::7]:22\n")
    assert fleet_hosts(None, str(inventory)) == ["ssh://ops@[fd00::7]:22"]


def test_a_fleet_refuses_options_that_would_share_a_box_or_a_worker(tmp_path):
    """-n and --base-url with several boxes MUST be one clear usage error each (exit 4), before any box is reached."""
    for extra, said in ((["-n", "3"], "leave out -n, --dist and --tx"),
                        (["--base-url=http://x:8000", "--recipe=smollm2-cpu"], "--base-url tests one running server")):
        run = subprocess.run([sys.executable, "-m", "pytest", TESTS, *SUITE_PLUGINS, "--host=spark01",
                              "--host=spark02", *extra], cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert run.returncode == 4 and said in run.stderr, (extra, run.stdout[-1500:], run.stderr[-1500:])


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
    assert run.stdout.splitlines()[0] == ("fleet of 3 boxes: spark01 (run.spark01.json), spark01?[2J, spark01 "
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
