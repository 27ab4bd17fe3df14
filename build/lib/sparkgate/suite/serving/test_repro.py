"""Stored repro bodies replay clean, cold and then warm, on every run.

The guide's standing rule for a box that once answered garbage: replay the stored repro body after any image
bump or flag change. Its failure was content- and cache-dependent (the same 33K-token agent payload was clean
on an idle engine and garbage on a warm one), so each body is sent twice: once as cold as the server allows,
once again with its prefix cached. Operators drop their own bodies into tests/data/repro or pass --repro-dir.
"""

import json

import pytest

from sparkgate import probes, sanity

REPLAY_MAX_TOKENS = 96  # garbage shows from the first tokens on; a long answer only costs time
GUIDE_PAYLOAD_TOKENS = 33_254  # the guide's failing agent payload


def replay(check, server, endpoint, body, name, fresh=False):
    """Send `body` cold, then warm; every answer must be clean. `fresh`: the body is new to this server."""
    body = {**body, "model": server.served_name, "stream": False,
            "max_tokens": min(body.get("max_tokens") or REPLAY_MAX_TOKENS, REPLAY_MAX_TOKENS)}
    body.pop("stream_options", None)
    body.pop("max_completion_tokens", None)  # vLLM prefers it to max_tokens: an agent's 32K would run for hours
    # vLLM drops its prefix cache on this call only in dev mode (VLLM_SERVER_DEV_MODE=1); elsewhere the
    # first send is as cold as this run can make it without changing the body, which must stay as stored.
    reset = fresh or endpoint.post(None, path="/reset_prefix_cache", timeout=30).status_code == 200
    for label in ("cold" if reset else "first (the prefix cache cannot be reset here)", "warm"):
        response = endpoint.post(body)
        error = response.text[:400]
        if response.status_code == 400 and "context" in error.lower():
            check.cannot_run(f"{name} does not fit this recipe's context ({server.recipe.max_model_len} "
                             f"tokens): {error}", "replay it against a recipe with a longer --max-model-len")
        endpoint.answer(response, body, label=f"{name}, {label} send")


@pytest.mark.check("SERVE-REPRO", why=sanity.WHY, fix=sanity.FIX)
def test_a_stored_repro_body_replays_clean_cold_and_warm(check, server, endpoint, repro_path):
    """Every stored repro body MUST get a clean answer, sent cold and then warm."""
    try:
        body = json.loads(repro_path.read_text())
    except ValueError as exc:
        body = f"not JSON: {exc}"
    check.that(isinstance(body, dict) and bool(body.get("messages")),
               expected=f"{repro_path} to hold a chat completion request body with messages",
               found=str(body)[:200], why="a repro body that cannot be sent reproduces nothing",
               fix="store the body exactly as the client sent it to /v1/chat/completions (JSON, with messages)")
    replay(check, server, endpoint, body, repro_path.name)


@pytest.mark.check("SERVE-REPRO-AGENT", why=sanity.WHY, fix=sanity.FIX)
def test_an_agent_payload_sized_to_the_context_replays_clean_cold_and_warm(check, server, recipe, endpoint):
    """An agent-like payload as large as the context allows MUST answer clean, cold and then warm."""
    # The guide's payload size, or what fits: the prompt plus the answer within --max-model-len.
    target = min(GUIDE_PAYLOAD_TOKENS, int(0.9 * (recipe.max_model_len - REPLAY_MAX_TOKENS)))

    def count(body):
        # The server's own tokenizer and chat template, without a prefill: the first replay stays cold.
        response = endpoint.post({k: body[k] for k in ("model", "messages", "tools")}, path="/tokenize", timeout=60)
        try:
            return int(response.json()["count"]) if response.status_code == 200 else None
        except (ValueError, KeyError, TypeError):
            return None  # a server without vLLM's /tokenize: sized by characters instead

    body = probes.sized_agent_body(server.served_name, target, count, max_tokens=REPLAY_MAX_TOKENS)
    # The same body every run (greedy, so a failure reproduces): cold where the server lets its prefix cache
    # be reset, and on a freshly started server; labelled as a first send otherwise.
    size = count(body)
    print(f"agent payload: {len(body['tools'])} tools, last {body['tools'][-1]['function']['name']!r}, "
          f"target {target} prompt tokens, {size or 'unknown'} as the server counts them")
    replay(check, server, endpoint, body, f"the agent payload of ~{target} tokens", fresh=server.started)
