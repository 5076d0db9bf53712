"""Short HTTP calls to a server (its health, identity, pace, cache flush, model name): httpx's get and post with one
TLS context for the process. httpx builds a context, CA bundle and all, for every top-level call (about 60 ms of CPU
here, for a plain http:// URL too): a campaign makes five such calls a sweep stage, between its stages. (A
recorder's sampler builds one client for its run, in its own process.)"""

from __future__ import annotations

import ssl
from functools import cache

import httpx


@cache
def tls() -> ssl.SSLContext:
    """The context httpx would build for each call (verified, its CA bundle), built once."""
    return httpx.create_ssl_context()


def get(url: str, **kwargs) -> httpx.Response:
    return httpx.get(url, verify=tls(), **kwargs)


def post(url: str, **kwargs) -> httpx.Response:
    return httpx.post(url, verify=tls(), **kwargs)
