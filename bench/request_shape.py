"""What every request of a run carries beyond its workload: extra body parameters, headers from the environment,
and the targets it is spread over (`capbench run --extra-body --header --also-target --route`)."""

from __future__ import annotations

import json
import os
import re

from bench.checks import check_target
from bench.errors import BadInput

OWNED_BODY_KEYS = ("model", "stream", "stream_options", "messages", "prompt", "input")


def request_shape(extra_body: str | None, headers: list[str], also_targets: list[str], route: str) -> dict:
    """--extra-body, --header NAME=env:VAR, --also-target, --route as the run's config keeps them (header values
    stay in the environment: each process reads them); BadInput for what cannot be used."""
    body = {}
    if extra_body:
        try:
            body = json.loads(extra_body)
        except ValueError as e:
            raise BadInput(f"--extra-body is not JSON ({e})") from None
        if not isinstance(body, dict):
            raise BadInput("--extra-body takes a JSON object, e.g. '{\"temperature\": 0.6}'")
        owned = sorted(set(body) & set(OWNED_BODY_KEYS))
        if owned:
            raise BadInput(f"--extra-body may not set {', '.join(owned)} (the workload and options own them)")
    headers_env = {}
    for h in headers:
        name, _, value = h.partition("=")
        if not re.fullmatch(r"[A-Za-z0-9-]{1,64}", name) or not value.startswith("env:") or \
                not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,127}", value[4:]):
            raise BadInput(f"--header takes NAME=env:VAR (the value from the environment, never on the command "
                           f"line), not {h.split('=')[0]!r}=...")
        if name.lower() in ("content-type", "accept", "content-length", "host"):
            raise BadInput(f"--header {name}: capbench sets it")
        if not os.environ.get(value[4:]):
            raise BadInput(f"environment variable {value[4:]} (--header {name}) is not set")
        headers_env[name] = value[4:]
    if route not in ("round-robin", "session"):
        raise BadInput(f"--route is round-robin or session, not {route!r}")
    for url in also_targets:
        check_target(url)
    return {"extra_body": body, "headers_env": headers_env, "targets": list(also_targets), "route": route}
