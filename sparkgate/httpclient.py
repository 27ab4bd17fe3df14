"""One rule for every HTTP client the suite opens to a server: let an idle connection go before the server does.

vLLM's API server closes a connection idle for 5 s (VLLM_HTTP_TIMEOUT_KEEP_ALIVE, uvicorn's default too), and
httpx keeps an idle connection for 5 s by default: a request sent on it at that moment meets a socket the server
is closing and fails with no answer ("Server disconnected", the openai client's "Connection error"), a failure of
the client, not of the box. A connection idle for longer than KEEPALIVE_S is opened anew instead.
"""

from __future__ import annotations

import httpx

SERVER_KEEPALIVE_S = 5  # vLLM's VLLM_HTTP_TIMEOUT_KEEP_ALIVE default
KEEPALIVE_S = 2.0


def limits(max_connections: int | None = 100) -> httpx.Limits:
    """httpx's limits: at most `max_connections` (None: no bound), idle ones let go after KEEPALIVE_S. (A server
    whose VLLM_HTTP_TIMEOUT_KEEP_ALIVE is set below KEEPALIVE_S would need less.)"""
    return httpx.Limits(max_connections=max_connections, keepalive_expiry=KEEPALIVE_S)
