"""loadgen as a plain locustfile, for people who already run Locust (no store: Locust's own statistics and the
records in each request event's context["capbench"]):

    locust -f loadgen/locustfile.py --headless --host http://127.0.0.1:30000 --model NAME \\
           --cb-profile poisson --cb-rate 20 --cb-duration 60 --cb-workload chat -u 200 -r 200 -t 70s OpenLoopUser
    locust -f loadgen/locustfile.py --headless --host ... --model NAME --cb-profile users --cb-duration 60 \\
           -u 8 -r 8 -t 60s ClosedLoopUser

Open loop: -u is the pool of users that carry the schedule (enough for rate x latency); the schedule starts one
second after the test starts; -t counts from Locust's own start, so give it a few seconds more than the
profile's duration (requests cut off by -t are recorded as `aborted`).
"""

import json
import time

from locust import events

from loadgen import profiles, workloads
from loadgen.users import CONFIG_OPTION, ClosedLoopUser, OpenLoopUser  # noqa: F401  (Locust finds them here)


@events.init_command_line_parser.add_listener
def _options(parser) -> None:
    parser.add_argument("--model", default="default", help="Model name to send")
    parser.add_argument("--cb-profile", default="poisson", help="capbench profile name or YAML path")
    parser.add_argument("--cb-rate", type=float, default=None, help="Profile rate (req/s)")
    parser.add_argument("--cb-duration", type=float, default=None, help="Profile duration (s)")
    parser.add_argument("--cb-workload", default="synthetic", help="capbench workload name or path")
    parser.add_argument("--cb-seed", type=int, default=0)
    parser.add_argument("--cb-api-key-env", default=None, help="Env var holding the API key")


@events.test_start.add_listener
def _config(environment, **_kw) -> None:
    o = environment.parsed_options
    if o is None or getattr(o, CONFIG_OPTION, None):
        return  # a capbench runner set the config already
    prof = profiles.load(o.cb_profile, {"rate": o.cb_rate, "duration": o.cb_duration})
    params = {k: v for k, v in prof.params.items() if not k.startswith("_")}
    setattr(o, CONFIG_OPTION, json.dumps({
        "target": environment.host, "model": o.model, "api_key_env": o.cb_api_key_env, "seed": o.cb_seed,
        "profile": {"name": prof.name, "type": prof.type, "params": params},
        "workload": workloads.load(o.cb_workload, o.cb_seed).to_dict(), "t0": time.time() + 1.0,
        "duration_s": prof.duration, "connections": max(1, o.num_users or 1)}))
