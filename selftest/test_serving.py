"""The serving layer's negative path, on the real engine: broken models answer garbage, and every check that reads
an answer fails on it, while the checks that judge something else (bad input, the model list) still pass.

The broken models are the embedded default broken for real (selftest/garbage/corpus.py makes them): its weights
perturbed with noise (Latin-script token salad, no foreign script), and vLLM's dummy loader (random weights). The
clean side is the same model unbroken. A gateway in front of the clean engine, wrong in one way
(selftest/broken_gateway.py), fails exactly the checks that guard against it. The recording guard (`sparkgate
guard`) is proven in front of both models: it stores the requests the broken model answered with garbage and only
those, and its stored bodies replay red against the broken model and green against the clean one.
"""

from __future__ import annotations

import contextlib
import json
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from sparkgate import embedded
from sparkgate.launch import serving
from sparkgate.probes import chat_body
from sparkgate.proc import cache_dir
from sparkgate.recipes import Recipe, load_profiles, load_recipes

from .garbage.corpus import DAMAGED, perturbed
from .helpers import (
    GUARD_PORT,
    bind_to_core,
    broken_recipe,
    cores_apart,
    embedded_recipe_dir,
    guard,
    local_mem_available,
    move_port,
    node_id,
    run_suite,
    run_suites_at_once,
)

PORTS = {"random": 18001, "damaged": 18003}  # the clean model is the session's embedded_server
# What reads an answer, and must fail on garbage; what judges something else, and must pass on it.
READS_ANSWERS = ["SERVE-CHAT", "SERVE-STREAM", "SERVE-COHERENCE", "SERVE-OPENAI-SDK", "SERVE-SANITY",
                 "SERVE-PREFIX-CACHE", "SERVE-CONCURRENT", "SERVE-REPRO", "SERVE-REPRO-AGENT", "SERVE-JSON-SCHEMA",
                 "SERVE-CONSTRAINT", "SERVE-TOOLS-AUTO", "SERVE-TOOLS-NAMED", "SERVE-TOOLS-REQUIRED",
                 "SERVE-TOOLS-STREAM", "SERVE-TOOLS-ROUNDTRIP", "QUAL-ANSWERS"]
DIAGNOSING = ("SERVE-SANITY", "SERVE-COHERENCE")  # the checks whose job the cause is; the others name them
JUDGED_ON_THEIR_OWN = ["test_the_served_name_is_listed", "test_the_health_endpoint_answers",
                       "test_bad_input_gets_a_4xx_with_a_message", "test_a_text_only_model_refuses_an_image_with_a_4xx"]


# The CPU core each broken engine computes on: apart, so the two proofs below run at once.
CORES = dict(zip(PORTS, cores_apart(len(PORTS)), strict=True))


def recipe_for(kind: str, tmp: Path) -> Recipe:
    def change(data: dict) -> None:
        move_port(data, PORTS[kind])
        bind_to_core(data, CORES[kind])
        if kind == "random":
            data["serve_args"] += ["--load-format", "dummy"]
        elif kind == "damaged":
            where, strength = DAMAGED
            perturbed(where, strength)(embedded.prepare("embedded:smollm2", cache_dir()), tmp / "damaged")
            data["model"] = {**data["model"], "id": str(tmp / "damaged"), "source": None}
    return load_recipes(Path(broken_recipe(tmp, change)))["smollm2-cpu"]


@pytest.fixture(scope="module")
def servers(tmp_path_factory, embedded_server):
    """The broken servers, started once for the module, and the clean one: kind -> (recipes folder, server). The
    broken ones load at once, each from a thread of its own that lives as long as its server (a server's process
    dies with the thread that started it: PR_SET_PDEATHSIG)."""
    started = {"clean": (str(embedded_recipe_dir(tmp_path_factory.mktemp("clean"))), embedded_server)}
    with ThreadPoolExecutor(len(PORTS)) as threads, contextlib.ExitStack() as stack:
        loading = {}
        for kind in PORTS:  # the random model loads while the damaged one's weights are perturbed
            tmp = tmp_path_factory.mktemp(kind)
            ctx = serving(recipe_for(kind, tmp), load_profiles()["cpu"], local_mem_available, print, 600)
            loading[kind] = (str(tmp / "recipes"), ctx, threads.submit(ctx.__enter__))
        errors = []
        for kind, (recipes, ctx, future) in loading.items():
            try:
                started[kind] = (recipes, future.result())
                stack.push(ctx.__exit__)
            except Exception as exc:  # the other one is put away before this is raised
                errors.append(exc)
        if errors:
            raise errors[0]
        yield started


def failed_checks(result) -> list[str]:
    return sorted(set(re.findall(r"^\[((?:SERVE|QUAL)-[A-Z-]+)\] ", result.stdout.str(), re.M)))


# The replays' long prompts cost two minutes a model on a CPU: their red is proven once, on the damaged model.
REPLAYS = ("SERVE-REPRO", "SERVE-REPRO-AGENT")
BROKEN = {"damaged": True, "random": False}  # kind -> whether its run replays


@pytest.fixture(scope="module")
def broken_runs(servers, tmp_path_factory):
    """The serving layer against each broken model, both at once (each engine on a core of its own), at quick: a
    level sets how many quality probes are asked, never whether a layer is judged (test_levels.py)."""
    test = "test_a_broken_model_fails_every_check_that_reads_an_answer_and_nothing_else"
    return run_suites_at_once({kind: (node_id(__name__, f"{test}[{kind}]"),
                                      ["-m", "serving", f"--recipes-dir={servers[kind][0]}", "--recipe=smollm2-cpu",
                                       f"--base-url={servers[kind][1].base_url}", "--level=quick", "-k",
                                       # The agent loop is judged against a baseline only (test_quality.py).
                                       "not test_agent" if replays else "not repro and not test_agent"])
                               for kind, replays in BROKEN.items()}, tmp_path_factory.mktemp("broken-runs"))


@pytest.mark.parametrize("kind", BROKEN)
def test_a_broken_model_fails_every_check_that_reads_an_answer_and_nothing_else(broken_runs, kind):
    """Every check that reads an answer MUST fail on the broken model's garbage, pointing at the one that diagnoses
    it, and the checks that judge something else pass."""
    result, replays = broken_runs[kind], BROKEN[kind]
    out = result.stdout.str()
    expected = [c for c in READS_ANSWERS if replays or c not in REPLAYS]
    assert failed_checks(result) == sorted(expected), out[-6000:]
    # Bad input is judged on its own (its follow-up's garbage is SERVE-SANITY's), and so is the model list.
    passed = {line.split("::")[1].split("[")[0] for line in result.outlines if line.startswith("PASSED tests/")}
    assert set(JUDGED_ON_THEIR_OWN) <= passed, (passed, out[-3000:])
    # One defect, one failure: every other answer-reading check names the one that diagnoses its cause.
    for check_id in set(expected) - set(DIAGNOSING):
        message = re.search(rf"^\[{check_id}\] .*?(?=^\[(?:SERVE|QUAL)-|^_{{3,}}|^=+ |\Z)", out, re.M | re.S).group()
        assert any(f"the same defect as {d}'s" in message for d in DIAGNOSING), (check_id, message[:3000])
    if kind == "damaged":  # Latin-script salad: found by its words, not by a foreign script
        assert "token salad:" in out, out[-4000:]


# ---- a gateway in front of the engine, wrong in one way ----------------------------------------------------

# way (selftest/broken_gateway.py) -> the checks that guard against it, and what their messages must say
GATEWAYS = {
    "openai-only": ({"SERVE-CONSTRAINT"}, ["the server answered HTTP 200 and ignored the constraint it was sent",
                                           "a gateway that validates requests against OpenAI's schema drops"]),
    "errors-500": ({"SERVE-BAD-INPUT", "SERVE-VISION-REJECT"},
                   ['found:    HTTP 500: "<html><body><h1>500 Internal Server Error',
                    "proxy_intercept_errors on", "(the same defect as SERVE-BAD-INPUT's"]),
    "v1-only": ({"SERVE-HEALTH"}, ["expected: HTTP 200 from GET /health within 30 s",
                                   "found:    HTTP 404: 'not found'"]),
    "cache-drifts": ({"SERVE-PREFIX-CACHE"}, ["expected: two non-empty answers that agree on their first 40 characters",
                                              "found:    uncached 'The lighthouse door is"]),
}


@pytest.fixture(scope="module")
def gateway_runs(gateway, tmp_path_factory):
    """The serving layer behind each way, all at once against the one engine (they judge answers, not time)."""
    test = "test_a_gateway_wrong_in_one_way_fails_exactly_the_checks_that_guard_against_it"
    return run_suites_at_once({way: (node_id(__name__, f"{test}[{way}]"),
                                     ["-m", "serving", "--recipe=smollm2-cpu", f"--base-url={gateway}/{way}",
                                      "--level=quick", "-k", "not repro and not test_agent"])
                               for way in GATEWAYS}, tmp_path_factory.mktemp("gateway-runs"))


@pytest.mark.parametrize("way", GATEWAYS)
def test_a_gateway_wrong_in_one_way_fails_exactly_the_checks_that_guard_against_it(gateway_runs, way):
    """The real engine behind a gateway that drops vLLM's own request fields, answers the engine's 4xx with a bare
    500, forwards the OpenAI API alone (no /health), or answers a long prompt sent again as if it asked something
    else (fluent, not garbage: what only the comparison with the first answer sees): the serving layer MUST fail
    exactly the checks that guard against that, saying so, and pass the rest (the long replays, which only read
    answers, are proven red on the broken models above)."""
    checks, words = GATEWAYS[way]
    result = gateway_runs[way]
    out = result.stdout.str()
    assert failed_checks(result) == sorted(checks), out[-6000:]
    for w in words:
        assert w in out, (w, out[-6000:])


def test_behind_a_gateway_that_buffers_each_answer_the_client_times_every_token_at_once_and_fails_the_itl_check(
        pytester, gateway):
    """A stream that arrives as one burst: the client's inter-token latency MUST disagree with the server's own, and
    PERF-SERVER-ITL fail on it, while the token counts still agree (PERF-SERVER-TOKENS passes)."""
    result = run_suite(pytester, "-m", "perf", "--recipe=smollm2-cpu", f"--base-url={gateway}/buffers",
                       "--level=quick", "-k", "inter_token_latency_agrees or token_counter_agrees")
    out = result.stdout.str()
    assert re.findall(r"^\[(PERF-[A-Z-]+)\] ", out, re.M) == ["PERF-SERVER-ITL"], out[-4000:]
    assert "PASSED tests/perf/test_server_counts.py::test_the_servers_token_counter_agrees" in out, out[-4000:]
    result.stdout.fnmatch_lines(["*expected: client within 25% of the server's * ms*", "*found:    client * ms*"])


def test_behind_a_gateway_that_stamps_each_system_prompt_the_prefix_cache_never_hits_and_only_its_check_fails(
        pytester, gateway):
    """A request number written at the top of every system message (alone on the engine: its /metrics counts every
    client's hits): SERVE-PREFIX-HITS MUST fail naming the tokens the repeat took from the cache, and
    SERVE-PREFIX-CACHE, whose cached path was never taken, MUST say it could not run and point at it."""
    result = run_suite(pytester, "-m", "serving", "--recipe=smollm2-cpu", f"--base-url={gateway}/stamps",
                       "--level=quick", "-k", "prefix_cache or repeated_request")
    out = result.stdout.str()
    assert failed_checks(result) == ["SERVE-PREFIX-HITS"], out[-4000:]
    result.stdout.fnmatch_lines([
        "*expected: at least half of the repeated prompt's * tokens from the prefix cache",
        "*found:    0 of them, all * looked up (vllm:prefix_cache_hits_total +0, vllm:prefix_cache_queries_total +*)",
        "SKIPPED*[[]SERVE-PREFIX-CACHE[]] could not run: the second send was not served from the prefix cache "
        "(vllm:prefix_cache_hits_total +0), so the cached path was not exercised: SERVE-PREFIX-HITS says why*"])


# ---- the recording guard ---------------------------------------------------------------------------------

# Prompts the real model answers cleanly (selftest/garbage/corpus.jsonl: it loops on some others, rightly flagged).
PROMPTS = ["Explain why the sky is blue in two sentences.", "Describe a cat to a child.",
           "Give me a short tip for better sleep."]


def send_through(port: int, model: str) -> None:
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=300) as client:
        for i, prompt in enumerate(PROMPTS):
            body = chat_body(model, prompt, max_tokens=48)
            if i % 2:  # streamed and not: the guard reads both
                with client.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as response:
                    for _ in response.iter_bytes():
                        pass
            else:
                assert client.post("/v1/chat/completions", json=body).status_code == 200


def test_the_guard_stores_only_what_produced_garbage_and_its_bodies_replay(pytester, servers, tmp_path):
    clean_dir, damaged_dir = tmp_path / "clean", tmp_path / "damaged"
    for kind, out in (("clean", clean_dir), ("damaged", damaged_dir)):
        _, srv = servers[kind]
        proc = guard(srv.base_url, out)
        try:
            send_through(GUARD_PORT, srv.served_name)
        finally:
            proc.terminate()
            proc.wait(10)
    assert list(clean_dir.glob("*.json")) == [], "the guard stored an answer of the clean model"
    stored = sorted(damaged_dir.glob("*.json"))
    assert stored, "the guard stored nothing of the damaged model"
    for body_file in stored:
        body = json.loads(body_file.read_text())
        assert body["messages"][0]["content"] in PROMPTS  # the exact request
        meta = json.loads(body_file.with_suffix(".meta").read_text())
        assert meta["findings"] and meta["answer"] and meta["time"] and meta["server"]["models"]
    # The guard's bodies only: the shipped one (a long prompt) replays in the broken-model and newcomer runs.
    guards_only = "stored_repro and not tools"
    recipes, damaged = servers["damaged"]
    red = run_suite(pytester, "-m", "serving", "-k", guards_only, f"--recipes-dir={recipes}",
                    "--recipe=smollm2-cpu", f"--base-url={damaged.base_url}", f"--repro-dir={damaged_dir}")
    assert failed_checks(red) == ["SERVE-REPRO"], red.stdout.str()[-3000:]
    red.assert_outcomes(failed=len(stored), deselected=None)
    _, clean = servers["clean"]
    green = run_suite(pytester, "-m", "serving", "-k", guards_only, "--recipe=smollm2-cpu",
                      f"--base-url={clean.base_url}", f"--repro-dir={damaged_dir}")
    assert failed_checks(green) == [] and green.ret == 0, green.stdout.str()[-3000:]
    green.assert_outcomes(passed=len(stored), deselected=None)
