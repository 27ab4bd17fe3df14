"""Reasoning models: thinking lands in the reasoning field, never in the answer, and can be turned off.

The guide's Qwen3.6 measured a two-token answer at 101 completion tokens with thinking on and 2 with it off:
left on against a small budget, a request can spend it all thinking and return empty content.
"""

import pytest

from sparkgate.probes import COHERENCE, THINKING_OFF, chat_body
from sparkgate.sanity import reasoning_of

PROBE = COHERENCE[1]
REASONING_FIX = ("serve with --reasoning-parser matching the model (qwen3 for Qwen3.x); this vLLM build returns "
                 "the thinking as `reasoning` (older builds: `reasoning_content`), clients must read that field")


@pytest.fixture
def reasoning_declared(check, recipe):
    if not recipe.features.reasoning:
        check.cannot_run(f"recipe {recipe.name} does not declare a reasoning model (features.reasoning: false)",
                         "serve a reasoning model with --reasoning-parser NAME and set features.reasoning: true")


@pytest.mark.check("SERVE-REASONING", why="clients show the answer and hide the thinking; thinking mixed into "
                   "the content reaches the user and breaks parsers", fix=REASONING_FIX)
def test_thinking_lands_in_the_reasoning_field_not_the_answer(check, server, endpoint, reasoning_declared):
    """With thinking on, the thinking MUST arrive in `reasoning` or `reasoning_content` and the answer in content."""
    body = chat_body(server.served_name, PROBE.prompt, max_tokens=2048,
                     chat_template_kwargs={"enable_thinking": True})
    message = endpoint.chat(body)["choices"][0]["message"]
    key, thinking = reasoning_of(message)
    content = message.get("content") or ""
    print(f"reasoning field: {key or 'none'} ({len(thinking)} chars); content {content[:80]!r}")
    check.that(bool(thinking.strip()) and PROBE.answered(content),
               expected=f"thinking in `reasoning` or `reasoning_content`, and {PROBE.answer!r} in content",
               found=f"reasoning field {key or 'absent'} ({len(thinking)} chars), content {content[:200]!r}")


@pytest.mark.check("SERVE-THINKING-OFF", why="agents turn thinking off for short answers; if the switch is "
                   "ignored every request costs ~50x the tokens (guide: 101 against 2) and small budgets run out",
                   fix="send chat_template_kwargs {\"enable_thinking\": false}; if it is ignored the model's chat "
                       "template does not read it: use the model's own template (--chat-template)")
def test_thinking_off_gives_no_reasoning_and_costs_far_fewer_tokens(check, server, endpoint, reasoning_declared):
    """With enable_thinking false there MUST be no reasoning, and the answer MUST cost at most half the tokens."""
    on = endpoint.chat(chat_body(server.served_name, PROBE.prompt, max_tokens=2048,
                                 chat_template_kwargs={"enable_thinking": True}), label="thinking on")
    off = endpoint.chat(chat_body(server.served_name, PROBE.prompt, max_tokens=2048,
                                  chat_template_kwargs=THINKING_OFF), label="thinking off")
    n_on, n_off = on["usage"]["completion_tokens"], off["usage"]["completion_tokens"]
    key, thinking = reasoning_of(off["choices"][0]["message"])
    content = off["choices"][0]["message"].get("content") or ""
    print(f"completion tokens: thinking on {n_on}, off {n_off}")
    check.that(not thinking and n_off * 2 <= n_on and PROBE.answered(content),
               expected=f"no reasoning, {PROBE.answer!r} in content, and at most {n_on // 2} completion tokens "
                        f"(half of {n_on} with thinking on)",
               found=f"{n_off} completion tokens, reasoning {key or 'none'} ({len(thinking)} chars), "
                     f"content {content[:120]!r}")
