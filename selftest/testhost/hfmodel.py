"""A model as the Hugging Face hub client leaves it in its cache: each file once under blobs/, named by its hash
(SHA-256 for the large files the hub stores with Git LFS, the git blob id for the rest), and a snapshot of links
to them. `cut` names a file whose blob lost its second half after it was written, as a download cut short and
renamed by hand, or a damaged disk, leaves it."""

from __future__ import annotations

import hashlib

LFS_FROM = 1 << 20  # files this large are LFS files here (the hub's .gitattributes decides per repository)
REVISION = "5f0fe4d2a1a9c2a2b1bd5d7e1b0e4c5a6f3d2e1c"


def blob_name(content: bytes) -> str:
    if len(content) >= LFS_FROM:
        return hashlib.sha256(content).hexdigest()
    return hashlib.sha1(b"blob %d\0" % len(content) + content).hexdigest()


def layout(model_id: str, files: dict[str, bytes], cut: str | None = None) -> tuple[dict[str, bytes], dict[str, str]]:
    """(files, links) relative to the cache root (HF_HOME): the blobs and refs/main, and the snapshot's links."""
    top = f"hub/models--{model_id.replace('/', '--')}"
    blobs, links = {f"{top}/refs/main": REVISION.encode()}, {}
    for path, content in files.items():
        name = blob_name(content)
        blobs[f"{top}/blobs/{name}"] = content[: len(content) // 2] if path == cut else content
        links[f"{top}/snapshots/{REVISION}/{path}"] = "../" * (path.count("/") + 2) + f"blobs/{name}"
    return blobs, links
