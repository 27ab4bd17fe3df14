"""The endpoint never answers in garbage: every answer here goes through the one sanity detector."""

import pytest

from sparkgate import sanity
from sparkgate.probes import SANITY_PROMPTS, chat_body


@pytest.mark.check("SERVE-SANITY", why=sanity.WHY, fix=sanity.FIX)
def test_ordinary_prompts_get_clean_answers(check, server, endpoint):
    """Answers to ordinary English prompts, streamed and not, MUST be non-empty and free of garbage."""
    empty = []
    for i, prompt in enumerate(SANITY_PROMPTS):
        body = chat_body(server.served_name, prompt, max_tokens=64)
        # Both paths: the garbage the guide saw depended on how the request was scheduled, not on the API.
        if i % 2:
            text = endpoint.stream(body, label=f"{prompt!r} (streamed)").content
        else:
            text = endpoint.chat(body, label=repr(prompt))["choices"][0]["message"].get("content") or ""
        if not text.strip():
            empty.append(repr(prompt))
    check.that(not empty, expected="a non-empty answer to every prompt",
               found=f"empty answers to {', '.join(empty)}")
