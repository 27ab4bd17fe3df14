"""sparkgate as a person installs it: the wheel, in a fresh virtual environment, used from an empty folder.

The checks, recipes, profiles and repro bodies ship inside the wheel; the pytest plugin registers itself (a pytest11
entry point), so its options exist in any pytest run where sparkgate is installed.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import venv

import pytest

from .helpers import ROOT

# The whole module runs first (one wheel, one virtualenv), on a clean machine: it runs this machine's host checks.
pytestmark = [pytest.mark.skipif(os.geteuid() != 0, reason="checks the local host as root, like the other self-tests"),
              pytest.mark.clean_machine]


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(the new environment's bin folder, an empty folder to work in)."""
    tmp = tmp_path_factory.mktemp("install")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--disable-pip-version-check", "-w",
                    str(tmp / "wheels"), str(ROOT)], check=True, capture_output=True)
    [wheel] = (tmp / "wheels").glob("sparkgate-*.whl")
    venv.create(tmp / "venv", with_pip=True)
    bin_dir = tmp / "venv" / "bin"
    # --no-compile: the dependencies' bytecode is written on first import instead (pip's compiling took a third of
    # this install here: 50 s against 33 s, n=1); what gets installed is the same.
    subprocess.run([str(bin_dir / "pip"), "install", "-q", "--disable-pip-version-check", "--no-compile", str(wheel)],
                   check=True, capture_output=True)
    empty = tmp / "empty"
    empty.mkdir()
    return bin_dir, empty


def run(installed, *argv):
    bin_dir, empty = installed
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    env.pop("SPARKGATE_CACHE", None)
    return subprocess.run([str(bin_dir / argv[0]), *argv[1:]], cwd=empty, env=env, capture_output=True, text=True,
                          timeout=600)


def test_the_installed_cli_names_its_version_and_commit_and_lists_the_shipped_recipes(installed):
    version = run(installed, "sparkgate", "--version")
    assert re.fullmatch(r"sparkgate \S+ \(commit \S+\)\n", version.stdout), version.stdout + version.stderr
    listing = run(installed, "sparkgate", "recipes", "list")
    assert listing.returncode == 0
    assert [line.split()[0] for line in listing.stdout.splitlines()] == [
        "qwen3-coder-next-int4", "qwen36-35b-a3b-nvfp4", "qwen38-27b-nvfp4", "smollm2-cpu"]
    show = run(installed, "sparkgate", "recipes", "show", "qwen38-27b-nvfp4")
    assert "docker run -d --name qwen3.8-27b-nvfp4" in show.stdout


def test_the_installed_plugin_runs_the_shipped_host_checks_from_an_empty_folder(installed):
    result = run(installed, "sparkgate", "run", "--host=local", "-m", "host", "-rA")
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-3000:]
    passed = r"^PASSED \S*host/test_memory.py::test_available_memory_covers_every_selected_recipe"
    assert re.search(passed, out, re.M), out[-3000:]
    assert "warning" not in out.splitlines()[-1], out[-3000:]
    options = run(installed, "pytest", "--help").stdout  # the plugin's options, in any pytest run
    assert "--host=TARGET" in options and "--results-json=PATH" in options and "(default: local)" in options


def test_a_run_in_which_nothing_ran_does_not_read_as_a_pass(installed):
    """Every container check skips for a process recipe: exit status 3, never 0."""
    result = run(installed, "sparkgate", "run", "--host=local", "-m", "container", "--recipe=smollm2-cpu")
    assert result.returncode == 3, (result.stdout + result.stderr)[-3000:]
    assert re.search(r"all \d+ selected checks were skipped: nothing ran", result.stdout), result.stdout[-3000:]


def test_testinfras_hosts_option_is_refused_not_silently_local(installed):
    result = run(installed, "pytest", "--hosts=ssh://spark01", "-m", "host", "-p", "no:cacheprovider")
    assert result.returncode == 4
    assert "--hosts is testinfra's option, and sparkgate does not read it: the box is --host" in result.stderr


def test_an_option_value_that_is_a_path_outside_the_clone_keeps_the_clones_checks(tmp_path):
    """`pytest -m perf --results-json /tmp/r.json` from the clone: the plugin's option is known before pytest
    looks for its root folder, so the path is read as the option's value, not as what to collect."""
    result = subprocess.run([sys.executable, "-m", "pytest", "-m", "perf", "--results-json", str(tmp_path / "r.json"),
                             "--collect-only", "-q"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "tests/perf/test_natural.py::test_natural_single_stream_decode_meets_the_floor" in result.stdout
