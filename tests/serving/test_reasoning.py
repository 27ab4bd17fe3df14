"""Reasoning models: thinking lands in the reasoning field, never in the answer, and can be turned off.

The guide's Qwen3.6 measured a two-token answer at 101 completion tokens with thinking on and 2 with it off:
left on against a small budget, a request can spend it all thinking and return empty content.
"""

import pytest

from sparkgate.probes import COHERENCE, THINKING_OFF, chat_body
from sparkgate.sanity import REASONING_FIX, reasoning_of, thinking_in_content

PROBE = COHERENCE[1]


@pytest.fixture
def reasoning_declared(check, recipe):
    if not recipe.features.reasoning:
        check.cannot_run(f"recipe {recipe.name} does not declare a reasoning model (features.reasoning: false)",
                         "serve a reasoning model with --reasoning-parser NAME and set features.reasoning: true")


@pytest.mark.check("SERVE-REASONING", why="clients show the answer and hide the thinking; thinking mixed into "
                   "the content reaches the user and breaks parsers, and a build that renames the field (older vLLM: "
                   "reasoning_content) hides the thinking from every client that reads the old name", fix=REASONING_FIX)
def test_thinking_lands_in_the_reasoning_field_not_the_answer(check, server, endpoint, reasoning_declared, server_fact,
                                                              pytestconfig):
    """With thinking on, the thinking MUST arrive in `reasoning` or `reasoning_content` (with --baseline, in the field
    the baseline's server used) and the answer in content."""
    body = chat_body(server.served_name, PROBE.prompt, max_tokens=2048,
                     chat_template_kwargs={"enable_thinking": True})
    message = endpoint.chat(body, judged_here=("reasoning-leak",))["choices"][0]["message"]  # this check's verdict
    key, thinking = reasoning_of(message)
    content = message.get("content") or ""
    print(f"reasoning field: {key or 'none'} ({len(thinking)} chars); content {content[:80]!r}")
    before = server_fact("reasoning_field", key or "none")  # in the results file: what the next gate compares
    check.that(bool(thinking.strip()) and PROBE.answered(content),
               expected=f"thinking in `reasoning` or `reasoning_content`, and {PROBE.answer!r} in content",
               found=f"reasoning field {key or 'absent'} ({len(thinking)} chars), content {content[:200]!r}")
    if key and before not in (None, "none", key):
        check.that(False, expected=f"the thinking in `{before}`, where the baseline's server sent it "
                                   f"({pytestconfig.option.sg_baseline})",
                   found=f"the thinking in `{key}`: a client that reads `{before}` finds none",
                   fix=f"clients (and their parsers) must read `{key}` with this build before it serves them, or "
                       "stay on the baseline's image")


@pytest.mark.check("SERVE-THINKING-OFF", why="agents turn thinking off for short answers; if the switch is "
                   "ignored every request costs ~50x the tokens (guide: 101 against 2) and small budgets run out",
                   fix="send chat_template_kwargs {\"enable_thinking\": false}; if it is ignored the model's chat "
                       "template does not read it: use the model's own template (--chat-template)")
def test_thinking_off_gives_no_reasoning_and_costs_far_fewer_tokens(check, server, endpoint, reasoning_declared):
    """With enable_thinking false there MUST be no reasoning, and the answer MUST cost at most half the tokens."""
    on = endpoint.chat(chat_body(server.served_name, PROBE.prompt, max_tokens=2048,
                                 chat_template_kwargs={"enable_thinking": True}), label="thinking on")
    off = endpoint.chat(chat_body(server.served_name, PROBE.prompt, max_tokens=2048,
                                  chat_template_kwargs=THINKING_OFF), label="thinking off",
                        judged_here=("reasoning-leak",))  # thinking here is this check's verdict, wherever it is
    n_on, n_off = on["usage"]["completion_tokens"], off["usage"]["completion_tokens"]
    content = off["choices"][0]["message"].get("content") or ""
    key, thinking = reasoning_of(off["choices"][0]["message"])
    if not thinking and (thinking := thinking_in_content(content)):
        key = "the content's <think> tags"
    print(f"completion tokens: thinking on {n_on}, off {n_off}")
    check.that(not thinking and n_off * 2 <= n_on and PROBE.answered(content),
               expected=f"no reasoning, {PROBE.answer!r} in content, and at most {n_on // 2} completion tokens "
                        f"(half of {n_on} with thinking on)",
               found=f"{n_off} completion tokens, reasoning {key or 'none'} ({len(thinking)} chars), "
                     f"content {content[:120]!r}")
