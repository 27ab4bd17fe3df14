"""The known-bad list and the package list read against it: every entry sourced, names compared as pip compares them,
and whatever an image prints read as untrusted."""

import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sparkgate import knownbad


def test_every_entry_names_the_release_that_fixed_it_and_its_source():
    entries = knownbad.entries()
    assert entries and all(e.versions and e.fixed_in not in e.versions and e.source and e.effect for e in entries)


def test_a_release_on_the_list_is_found_under_any_spelling_of_its_name():
    installed = knownbad.parse("PKG torch 2.9.0\nPKG NVIDIA_Cutlass.DSL 4.5.0\n")
    assert [(e.package, v) for e, v in knownbad.held(installed)] == [("nvidia-cutlass-dsl", "4.5.0")]


def test_the_fixed_release_and_anything_not_a_name_and_version_are_not():
    printed = "PKG nvidia-cutlass-dsl 4.5.1\nPKG <img src=x> 4.5.0\nPKG nvidia-cutlass-dsl 4.5.0 extra\nWARNING: x\n"
    assert knownbad.held(knownbad.parse(printed)) == []
    assert knownbad.parse(printed) == {"nvidia-cutlass-dsl": "4.5.1"}


@given(st.text())
def test_any_output_parses_to_plain_names_and_versions(printed):
    for kind in ("PKG", "DEB"):
        for name, version in knownbad.parse(printed, kind).items():
            assert name.isascii() and version.isascii() and " " not in name + version and "<" not in name + version


def test_a_package_listed_twice_is_read_as_the_copy_python_imports():
    """Distributions are listed in sys.path order and Python imports the first: a shadowed copy MUST NOT be the one
    recorded (or judged)."""
    assert knownbad.parse("PKG torch 2.10.0\nPKG torch 2.9.1\n") == {"torch": "2.10.0"}


INSTALLED, REMOVED = "install ok installed", "deinstall ok config-files"  # dpkg's status of a package kept, removed


@pytest.mark.parametrize("status, version", [(INSTALLED, "2.28.3-1+cuda13.0"), (INSTALLED, "1:2.21.5-1~bpo12+1"),
                                             (REMOVED, "2.28.3-1+cuda13.0")])
def test_the_system_nccl_dpkg_lists_is_a_shared_library_beside_the_wheels(tmp_path, status, version):
    """The package list run for real (sh, dpkg-query and this Python) on a dpkg database that holds libnccl2, as NGC's
    images install it: the system NCCL is read apart from the Python packages (so it can neither be on the known-bad
    list nor stand in for a Python list that is missing), in any version dpkg writes, and only while installed; both
    NCCLs are what `sparkgate fleet` compares."""
    (tmp_path / "info").mkdir()
    (tmp_path / "status").write_text(f"Package: libnccl2\nStatus: {status}\nArchitecture: arm64\nVersion: {version}\n"
                                     "Maintainer: cudatools <cudatools@nvidia.com>\n"
                                     "Description: NVIDIA Collective Communication Library (NCCL) Runtime\n")
    printed = subprocess.run(["sh", "-c", knownbad.PACKAGES_SCRIPT, "sparkgate-packages", sys.executable],
                             env={"DPKG_ADMINDIR": str(tmp_path), "PATH": "/usr/bin:/bin"}, capture_output=True,
                             text=True, timeout=60, check=True).stdout
    system, python = knownbad.parse(printed, "DEB"), knownbad.parse(printed)
    assert "libnccl2" not in python and "pydantic" in python
    both = knownbad.shared_libraries({**python, "nvidia-nccl-cu13": "2.28.3"} | system)
    if status == REMOVED:
        assert (system, both["nccl"]) == ({}, "nvidia-nccl-cu13 2.28.3"), printed[:300]
    else:
        assert system == {"libnccl2": version} and both["nccl"] == f"nvidia-nccl-cu13 2.28.3, libnccl2 {version}"
