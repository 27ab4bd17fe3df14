"""The known-bad list and the package list read against it: every entry sourced, names compared as pip compares them,
and whatever an image prints read as untrusted."""

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
    for name, version in knownbad.parse(printed).items():
        assert name.isascii() and version.isascii() and " " not in name + version and "<" not in name + version


def test_a_package_listed_twice_is_read_as_the_copy_python_imports():
    """Distributions are listed in sys.path order and Python imports the first: a shadowed copy MUST NOT be the one
    recorded (or judged)."""
    assert knownbad.parse("PKG torch 2.10.0\nPKG torch 2.9.1\n") == {"torch": "2.10.0"}
