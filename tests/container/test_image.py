"""The image the container runs: the recipe's, recorded by digest, built for this hardware."""

import contextlib

import pytest

from sparkgate import knownbad
from sparkgate.launch.container_spec import DOCKER_ARCH, LABEL
from sparkgate.redact import printable


@pytest.mark.check(
    "CONT-IMAGE",
    why="results from two boxes compare only when both ran the same build; a tag such as nightly moves, so "
        "the image is recorded by id and digest, and a container still running an older build of the tag "
        "is not the image the recipe names",
    fix="run the recipe's image (docker rm -f NAME, then start the recipe again); after `docker pull` or a "
        "rebuild, recreate the container so it runs what the tag names now",
)
def test_the_container_runs_the_recipes_image(check, live, recipe, record_property):
    """The container MUST run the recipe's image reference, at the build that reference names now."""
    ref = (live.attrs.get("Config") or {}).get("Image")
    image_id = live.attrs.get("Image", "")
    digests = ", ".join(live.image.get("RepoDigests") or []) or "none (built or imported locally)"
    live.server.facts.update(image=str(ref), image_id=image_id, image_digest=digests)
    record_property("image", f"{ref} {image_id} {digests}")
    current = live.tag_image_id
    check.that(ref == recipe.image and current == image_id,
               expected=f"{recipe.image}" + (f" at {current}" if current else " (present on the engine)"),
               found=f"{ref} at {image_id} (digests: {digests})"
                     + ("" if current in (None, image_id) else f"; the tag now names {current}")
                     + ("; the recipe's image is not on the engine" if current is None else ""))


@pytest.mark.check(
    "CONT-ARCH",
    why="an image for another architecture either fails to start (exec format error) or runs under "
        "emulation at a fraction of the speed; GB10 is aarch64 and upstream images lacked sm_121 builds",
    fix="use the image's arm64 build (on a Spark: vllm/vllm-openai:nightly-aarch64, or build vllm-node with "
        "eugr/spark-vllm-docker on the box itself)",
)
def test_the_image_is_built_for_this_hardware(check, live, recipe, host_facts, recipe_profile):
    """The image's architecture MUST be the hardware profile's (arm64 on gb10), or the host's if it names none."""
    arch = recipe_profile.arch or host_facts.arch
    if not arch:
        check.cannot_run("neither the profile nor the host names an architecture")
    want = DOCKER_ARCH.get(arch, arch)
    have = live.image.get("Architecture")
    basis = f"profile {recipe_profile.name}" if recipe_profile.arch else "the host"
    check.that(have == want, expected=f"{want} ({basis}: {arch})",
               found=f"{have} ({live.image.get('Os')}/{have}, image {(live.attrs.get('Config') or {}).get('Image')})")


@pytest.mark.check(
    "CONT-KNOWN-BAD",
    why="some library releases break serving on this hardware while the server starts and answers (with "
        "nvidia-cutlass-dsl 4.5.0 a Spark's NVFP4 MoE model answered garbage); the suite ships a list of them, each "
        "entry with its source (sparkgate/known_bad.yaml)",
    fix="rebuild or pull the image with the release the list names as fixed (pip install 'PACKAGE==FIXED' in its "
        "Dockerfile), recreate the container, and run the suite again",
)
def test_the_image_holds_no_known_bad_release(check, live, docker_engine, record_property, server_fact):
    """The Python packages the server runs with MUST include no release on the shipped known-bad list."""
    import docker.errors
    import requests

    config, binds = live.attrs.get("Config") or {}, (live.attrs.get("HostConfig") or {}).get("Binds") or []
    command = live.attrs.get("Path") or ""
    client, name, lister = docker_engine.client, live.name + knownbad.LISTER_SUFFIX, None
    try:  # read in a throwaway container of the same image, mounts and env: the server's own is never touched
        with contextlib.suppress(docker.errors.NotFound):  # one a run left as it died, by its label: ours to remove
            leftover = client.containers.get(name)
            if f"{LABEL}.packages" in (leftover.labels or {}):
                leftover.remove(force=True)
        lister = client.containers.create(
            live.attrs["Image"], [knownbad.PACKAGES_SCRIPT, "sparkgate-packages", command], entrypoint=["sh", "-c"],
            name=name, environment=config.get("Env") or [], volumes=binds, user=config.get("User") or None,
            network_mode="none", labels={f"{LABEL}.packages": live.name})
        lister.start()
        status = lister.wait(timeout=knownbad.LISTER_TIMEOUT_S)["StatusCode"]
        out = lister.logs(stdout=True, stderr=False)
        said = lister.logs(stdout=False, stderr=True).decode(errors="replace").strip()[-300:] if status else ""
    except requests.exceptions.ReadTimeout:
        check.cannot_run(f"listing the server's Python packages in its image did not finish within "
                         f"{knownbad.LISTER_TIMEOUT_S} s")
    except (docker.errors.DockerException, requests.RequestException) as exc:
        check.cannot_run(f"the server's Python packages could not be listed in its image: {str(exc)[:300]}")
    finally:
        if lister is not None:
            with contextlib.suppress(docker.errors.DockerException):  # gone already: nothing to remove
                lister.remove(force=True)
    if status:  # a list cut short could leave out the one release that matters
        check.cannot_run(f"listing the server's Python packages in its image exited {status}: "
                         + (printable(said) or "nothing said"))
    printed = out.decode(errors="replace")
    installed = knownbad.parse(printed)
    if not installed:
        check.cannot_run("the server's Python packages could not be listed in its image ("
                         + ("no Python found" if b"NOPYTHON" in out else "none listed") + ")")
    for fact, release in knownbad.shared_libraries(installed | knownbad.parse(printed, "DEB")).items():
        server_fact(fact, release)  # in the results file: what `sparkgate fleet` compares between boxes
    bad, n = knownbad.held(installed), len(knownbad.entries())
    record_property("packages", f"{len(installed)} read with {command}, against {n} known-bad entries")
    check.that(not bad, expected=f"none of the releases on the known-bad list ({n} entr{'y' if n == 1 else 'ies'})",
               found="; ".join(f"{e.package} {version}: {e.effect} (fixed in {e.fixed_in}; {e.source})"
                               for e, version in bad) or f"{len(installed)} packages, none on the list")
