"""The cached weights check's reading of the Hugging Face cache, run here with this machine's sh and coreutils on a
cache laid out as the hub client lays it out, holding the embedded model's real files."""

import shutil
import subprocess
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from sparkgate import hfcache

from .helpers import ROOT
from .testhost.hfmodel import layout

MODEL = ROOT / ".cache" / "models" / "smollm2"
MODEL_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
FILES = ("config.json", "tokenizer.json", "tokenizer_config.json", "generation_config.json")


def cache(tmp_path, cut=None, extra=()):
    blobs, links = layout(MODEL_ID, {f: (MODEL / f).read_bytes() for f in FILES}, cut)
    for rel, content in blobs.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_bytes(content)
    for rel, target in links.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).symlink_to(target)
    for name in extra:
        (tmp_path / f"hub/models--{MODEL_ID.replace('/', '--')}/blobs/{name}").write_bytes(b"x")
    return str(tmp_path)


def read(hf_cache, budget=0, model_id=MODEL_ID):
    out = subprocess.run(hfcache.command(hf_cache, model_id, budget), shell=True, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return hfcache.parse(out.stdout)


def test_a_whole_model_hashes_to_its_names_every_file_named_by_its_snapshot_path(tmp_path):
    model = read(cache(tmp_path))
    assert model.present and not model.damaged and len(model.hashed) == len(FILES)
    assert sorted(f.rsplit("/", 1)[1] for b in model.blobs for f in b.files) == sorted(FILES)
    sha256 = [b for b in model.blobs if len(b.name) == 64]
    assert [b.files[0].rsplit("/", 1)[1] for b in sha256] == ["tokenizer.json"]  # the one LFS-sized file here


def test_a_file_cut_short_is_named_with_what_it_hashes_to(tmp_path):
    model = read(cache(tmp_path, cut="tokenizer.json"))
    assert [b.files[0].rsplit("/", 1)[1] for b in model.damaged] == ["tokenizer.json"]
    (bad,) = model.damaged
    assert bad.size == (MODEL / "tokenizer.json").stat().st_size // 2 and bad.actual and bad.actual != bad.name


def test_a_small_file_damaged_is_found_by_its_git_blob_id(tmp_path):
    assert [b.files[0].rsplit("/", 1)[1] for b in read(cache(tmp_path, cut="config.json")).damaged] == ["config.json"]


def test_a_budget_hashes_the_smallest_files_and_samples_out_the_rest(tmp_path):
    model = read(cache(tmp_path, cut="tokenizer.json"), budget=100_000)
    assert len(model.hashed) == len(FILES) - 1 and not model.damaged  # the cut file is the largest: not hashed
    assert [b.whole for b in model.blobs if b.actual is None] == [None]


def test_an_absent_model_unfinished_downloads_and_odd_names_are_told_apart(tmp_path):
    assert not read(str(tmp_path)).present
    model = read(cache(tmp_path, extra=("0" * 64 + ".incomplete", "*", "$(touch pwned)")))
    assert len(model.incomplete) == 1 and model.unnamed == 2 and not model.damaged
    assert not (tmp_path / "pwned").exists() and not list(tmp_path.rglob("pwned"))


def test_a_snapshot_path_with_markup_is_never_quoted(tmp_path):
    root = cache(tmp_path)
    snapshot = next((tmp_path / f"hub/models--{MODEL_ID.replace('/', '--')}/snapshots").iterdir())
    (snapshot / "<img src=x onerror=alert(1)>.json").symlink_to(Path(snapshot / "config.json").readlink())
    files = [f for b in read(root).blobs for f in b.files]
    assert "snapshots/(a path with odd characters)" in files and not any("<" in f for f in files)


@given(st.text())
def test_any_output_parses_without_raising_and_trusts_no_malformed_hash(text):
    model = hfcache.parse(text)
    assert all(len(b.name) in (40, 64) for b in model.blobs)
    assert not any(c in f for b in model.blobs for f in b.files for c in "<>&\"'`$\n")


def test_a_box_without_the_hash_tools_is_told_apart_from_a_damaged_model(tmp_path):
    bare = tmp_path / "bin"
    bare.mkdir()
    for tool in ("sh", "ls", "stat", "cat", "find", "readlink", "basename"):  # coreutils, less the two hashes
        (bare / tool).symlink_to(shutil.which(tool))
    out = subprocess.run(hfcache.command(cache(tmp_path), MODEL_ID), shell=True, capture_output=True, text=True,
                         env={"PATH": str(bare)}, executable="/bin/sh")
    model = hfcache.parse(out.stdout)
    assert not model.present and "sha256sum" in model.unreadable and not model.damaged
