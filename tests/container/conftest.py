"""How the container checks read the recipe's container: live, through the docker SDK against the target's
engine (never from the recipe alone), with its image, its log and vLLM's startup facts parsed from that log.

A recipe that runs as a process has no container: every container check skips with that reason."""

from __future__ import annotations

import pytest

from sparkgate.launch import StartError
from sparkgate.launch.container_spec import LiveContainer, read_live


@pytest.fixture
def live(check, recipe, request, docker_engine, target_name) -> LiveContainer:
    """The recipe's container as it runs now (a process recipe is not started just to be skipped here)."""
    if recipe.launcher != "docker":
        check.cannot_run(f"{recipe.name} runs as a {recipe.launcher}, not in a container", "a docker recipe")
    server = request.getfixturevalue("server")
    name = server.container or recipe.container_name
    try:
        client = docker_engine.client
    except StartError as exc:
        check.cannot_run(str(exc), "--docker-host URL")
    found = read_live(client, name, stats=check.id == "CONT-RESIDENT")
    if found is None:
        check.cannot_run(f"no container named {name} on the docker engine of {target_name}",
                         "set container_name in the recipe to the running container's name")
    import docker.errors  # here, not at the top: a run without a container check never pays for its import

    try:  # what the recipe's image reference points at now (the container may run an older build of it)
        found.tag_image_id = client.images.get(recipe.image).id
    except docker.errors.ImageNotFound:  # reported by CONT-IMAGE
        found.tag_image_id = None
    found.server = server
    return found
