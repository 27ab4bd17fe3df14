"""Bad input gets a 4xx with a message from the server: never a 5xx, a hang or a dropped connection."""

import json

import pytest

from sparkgate.probes import chat_body, too_long_text

CASES = {
    # name: (how to build the request, what is wrong with it)
    "prompt-longer-than-context": (lambda s, r: chat_body(s.served_name, too_long_text(r.max_model_len)),
                                   "a prompt longer than --max-model-len"),
    "unknown-model": (lambda s, r: chat_body("no-such-model-sparkgate", "Hello"), "a model that is not served"),
    "malformed-json": (lambda s, r: b'{"model": "' + s.served_name.encode() + b'", "messages": [',
                       "a body that is not JSON"),
    "no-messages": (lambda s, r: {"model": s.served_name, "max_tokens": 8}, "a body without messages"),
    "negative-temperature": (lambda s, r: chat_body(s.served_name, "Hello", temperature=-1),
                             "temperature -1"),
}


@pytest.mark.check("SERVE-BAD-INPUT", why="clients learn what they did wrong from a 4xx and its message; a 5xx "
                   "looks like an outage and is retried, a hang ties up a slot, and a crash takes every "
                   "user's request with it",
                   fix="read the server log for the request: a 5xx or a crash on bad input is a server bug "
                       "(upgrade the image, or put a validating proxy in front); behind a proxy or gateway, send "
                       "the same request to the server itself: a proxy that intercepts upstream errors (nginx: "
                       "proxy_intercept_errors on) answers the server's 4xx with a 5xx of its own")
@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_gets_a_4xx_with_a_message(check, server, recipe, endpoint, case):
    """Bad input MUST get a 4xx with an error message, never a 5xx, a hang or a dropped connection."""
    build, what = CASES[case]
    request = build(server, recipe)
    response = endpoint.post(content=request) if isinstance(request, bytes) else endpoint.post(request)
    message = endpoint.error_message(response)
    check.that(400 <= response.status_code < 500 and bool(message),
               expected=f"HTTP 4xx with an error message for {what}",
               found=f"HTTP {response.status_code}: {json.dumps(response.text[:300])}")
    # The server must still serve afterwards: a 4xx after which the engine is dead is no better than a 5xx. Whether
    # that answer is clean is SERVE-SANITY's to judge, not this check's: one defect, one failure.
    after = endpoint.post(chat_body(server.served_name, "Say hello in one short sentence.", max_tokens=16))
    check.that(after.status_code == 200, expected=f"HTTP 200 to a plain request after {what}",
               found=f"HTTP {after.status_code}: {json.dumps(after.text[:300])}",
               fix="the server stopped serving after a bad request: read its log; an engine that dies on bad "
                   "input takes every user's request with it")
