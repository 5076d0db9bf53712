"""Issue 39's cases, counted on the code it runs against (so `before` and `after` come from one script):

1. values are data: 7 shell payloads ($(...), backticks, ;, &&, a newline, quotes) x 8 fields (model path, scales
   path, flags of a colocated server; model path, scales path, prefill, decode and router flags of a disaggregated
   one) x 2 operator templates (`ssh gpu1 true {command}` through a stand-in ssh that runs its words with `sh -c`,
   as OpenSSH does, and `bash -c 'true {command}'`): campaigns accepted, and commands that ran (marker files);
2. key forms of a secret flag (abbreviations, one item with a space) accepted into a campaign, hence stored; owned
   fields set past the check by an abbreviation or alias;
3. forms of the key a server echoes (FORMS) left in the text after redaction; target URLs with a key in the
   query or path accepted;
6. `capbench campaign` (a fake SGLang through a template, every other one `setsid -w`) SIGKILLed at a random
   moment (2-14 s in, or 0-5 s after its server is up, in turn): processes it started still running 30 s later
   (those are then killed).

    python bench/benchmarks/hostile_probe.py [--kills 4] [--only values|redaction|orphans]   # this checkout
    PYTHONPATH=/path/to/other/checkout python bench/benchmarks/hostile_probe.py   # another one's code
"""

from __future__ import annotations

import argparse
import base64
import html
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import urllib.parse
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
KEY = "sk-live-Zq81/hostile+KEY-Xw9QpLm7RtVb"
_P7 = [KEY[i:i + 7] for i in range(0, 21, 7)]
FORMS = {  # what a server's error text may hold the key as
    "raw": KEY, "upper": KEY.upper(), "lower": KEY.lower(), "prefix-12": KEY[:12], "suffix-10": KEY[-10:],
    "json-slash": json.dumps(KEY).replace("/", "\\/"), "json-u": "".join(f"\\u{ord(c):04x}" for c in KEY),
    "json-U": "".join(f"\\u{ord(c):04X}" for c in KEY), "json-ensure-ascii": json.dumps({"k": KEY}),
    "base64": base64.b64encode(KEY.encode()).decode(), "base64-url": base64.urlsafe_b64encode(KEY.encode()).decode(),
    "base64-in-blob-1": base64.b64encode(b"x" + KEY.encode()).decode(),
    "base64-in-blob-2": base64.b64encode(b"{'k': '" + KEY.encode() + b"'}").decode(),
    "base64-unpadded": base64.b64encode(KEY.encode()).decode().rstrip("="),
    "hex": KEY.encode().hex(), "HEX": KEY.encode().hex().upper(), "hex-spaced": KEY.encode().hex(" "),
    "hex-colons": KEY.encode().hex(":"), "html-dec": "".join(f"&#{ord(c)};" for c in KEY),
    "html-hex": "".join(f"&#x{ord(c):x};" for c in KEY), "html-escaped": html.escape(KEY),
    "percent-all": "".join(f"%{b:02X}" for b in KEY.encode()), "quote": urllib.parse.quote(KEY, safe=""),
    "quote-plus": urllib.parse.quote_plus(KEY), "reversed": KEY[::-1], "reversed-upper": KEY[::-1].upper(),
    "pieces-7": f"part {_P7[0]} then {_P7[1]} and {_P7[2]}", "pieces-6": " / ".join(KEY[i:i + 6] for i in (0, 6, 12)),
    "spaced": " ".join(KEY), "spaced-newlines": "\n".join(KEY), "spaced-reversed": " ".join(KEY[::-1]),
    "tabbed-hex": "\t".join(f"{b:02x}" for b in KEY.encode()),
    "percent-of-json-u": urllib.parse.quote("".join(f"\\u{ord(c):04x}" for c in KEY)),
}
PAYLOADS = {"subst": "x$(touch {m})", "backticks": "x`touch {m}`", "semicolon": "x;touch {m}", "and": "x&&touch {m}",
            "newline": "x\ntouch {m}", "squote": "x';touch {m};'", "dquote": 'x";touch {m};"'}
HEAD = 'name: t\nslo: "ttft=10s,tpot=200ms"\nduration: 2\ndeployments:\n'
LOADS = "loads:\n  - {name: a, workload: chat, profile: poisson, rate: 1}\n"


def _q(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def colocated(field: str, value: str, template: str) -> str:
    extra = {"model_path": f"model_path: {_q(value)}", "kv_scales": f"kv_scales: {_q(value)}",
             "flags": f"flags: [--served-model-name, {_q(value)}]"}[field]
    return f"{HEAD}  - {{name: d, sglang: {{model: glm-4.6, tp: 8, template: {template}, {extra}}}}}\n{LOADS}"


def disaggregated(field: str, value: str, template: str) -> str:
    top = {"model_path": f"model_path: {_q(value)}\n      ", "kv_scales": f"kv_scales: {_q(value)}\n      "}
    fl = {r: (f", flags: [{'--policy' if r == 'router' else '--served-model-name'}, {_q(value)}]" if field == r
              else "") for r in ("prefill", "decode", "router")}
    return (f"{HEAD}  - name: pd\n    disaggregated:\n      model: glm-4.6\n      {top.get(field, '')}"
            f"nodes: {{g1: {template}}}\n      prefill: {{count: 1, tp: 8, node: g1{fl['prefill']}}}\n"
            f"      decode: {{count: 1, tp: 8, node: g1{fl['decode']}}}\n      router: {{node: g1{fl['router']}}}\n"
            f"{LOADS}")


def values(tmp: Path) -> None:
    import importlib

    from bench.campaign import launch_command, operator_templates, parse_campaign
    from bench.errors import BadInput

    # the launch internals, by module name: the probe runs on checkouts whose package exports differ
    spawn = importlib.import_module("bench.campaign.launch").spawn
    plan = importlib.import_module("bench.campaign.pd_launch").plan

    (tmp / "bin").mkdir()
    (tmp / "bin" / "ssh").write_text('#!/bin/sh\nshift\nexec sh -c "$*"\n')
    (tmp / "bin" / "ssh").chmod(0o755)
    os.environ["PATH"] = f"{tmp / 'bin'}{os.pathsep}{os.environ['PATH']}"
    ops = tmp / "ops.yaml"
    ops.write_text("ssh: {start: 'ssh gpu1 true {command}', host: 127.0.0.1}\n"
                   "bashc: {start: \"bash -c 'true {command}'\", host: 127.0.0.1}\n")
    templates = operator_templates(ops)
    tries = accepted = ran = 0
    for t in templates:
        for kind, payload in PAYLOADS.items():
            for make, fields in ((colocated, ("model_path", "kv_scales", "flags")),
                                 (disaggregated, ("model_path", "kv_scales", "prefill", "decode", "router"))):
                for field in fields:
                    tries += 1
                    marker = tmp / f"PWNED-{t}-{kind}-{make.__name__}-{field}"
                    try:
                        dep = parse_campaign(make(field, payload.format(m=marker), t), "q.yaml", templates)
                        dep = dep.deployments[0]
                    except BadInput:
                        continue
                    accepted += 1
                    cmds = [(launch_command(dep, 30000, "0.0.0.0", None), dep.template)] if dep.pd is None else \
                        [(part.argv, part.template) for part in plan(dep)]
                    for cmd, template in cmds:
                        try:
                            spawn("d", cmd, template, 30000, "127.0.0.1", tmp / "logs", None, "")[0].wait(30)
                        except Exception:  # noqa: BLE001 (refused by spawn: nothing ran)
                            pass
                    ran += marker.exists()
    print(f"1. {tries} hostile campaigns: {accepted} accepted, {ran} ran a command", flush=True)
    secret = [f"[--api-ke, {KEY}]", f"[--admin-api-k, {KEY}]", f"[--ssl-keyfile-pass, {KEY}]", f"['--api-key {KEY}']",
              f"['--api-ke={KEY}']", f"[--admin-api-key, {KEY}]", f"[--api-key, {KEY}]"]
    stored = owned = 0
    for flags in secret:
        try:
            parse_campaign(colocated("flags", "x", "ssh").replace('[--served-model-name, "x"]', flags), "q", templates)
            stored += 1
        except BadInput:
            pass
    owning = ("[--disaggregation-mo, decode]", "[--model, x]", "[--tensor-parallel-size, '4']",
              "[--kv-cache-dt, fp8_e5m2]", "[--config, /x.yaml]")
    for flags in owning:
        try:
            parse_campaign(disaggregated("prefill", "x", "ssh").replace('[--served-model-name, "x"]', flags), "q",
                           templates)
            owned += 1
        except BadInput:
            pass
    print(f"2. key forms stored: {stored} of {len(secret)}; owned fields set past the check: {owned} of "
          f"{len(owning)}", flush=True)


def redaction() -> None:
    import loadgen.responses
    from bench.checks import check_target
    from bench.errors import BadInput

    redact = getattr(loadgen.responses, "redact", None)
    if redact is None:
        from loadgen.redact import redact
    judge = _judge()
    left = [f for f, v in FORMS.items()
            if judge(redact(f'{{"error": {{"message": "invalid key", "echo": "{v}"}}}}', KEY))]
    print(f"3. key forms left after redaction: {len(left)} of {len(FORMS)}" + (f" ({', '.join(left)})" if left else ""))
    ok = 0
    for url in ("http://127.0.0.1:9/v1?api_key=" + KEY, "http://127.0.0.1:9/v1#" + KEY,
                f"http://127.0.0.1:9/{KEY}/v1", "http://127.0.0.1:9/token/abc/v1"):
        try:
            check_target(url)
            ok += 1
        except BadInput:
            pass
    print(f"3. target URLs with a key in the query or path accepted: {ok} of 4", flush=True)


def _judge():  # noqa: ANN202
    """Whether a text still holds 6 characters of the key in a row in any decoding: loadgen/redact.py of this
    file's checkout, loaded by path (the same judge whichever code is probed)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("_judge", ROOT / "loadgen" / "redact.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return lambda out: mod._encoded(out, KEY) or any(KEY[i:i + 6].lower() in out.lower()
                                                      for i in range(len(KEY) - 5))


def _live(pids: list[int]) -> list[int]:
    out = []
    for pid in pids:
        try:
            if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
                out.append(pid)
        except OSError:
            pass
    return out


def _marked(db: Path) -> list[int]:
    want = f"CAPBENCH_LAUNCHED_BY={db.resolve()}|".encode()
    out = []
    for e in Path("/proc").iterdir():
        try:
            if e.name.isdigit() and any(x.startswith(want) for x in (e / "environ").read_bytes().split(b"\0")):
                out.append(int(e.name))
        except OSError:
            pass
    return _live(out)


def orphans(kills: int) -> None:
    fake = ROOT / "tests" / "bench" / "campaign" / "fake_sglang.py"
    capbench = Path(sys.executable).parent / "capbench"
    total = 0
    for trial in range(kills):
        tmp = Path(tempfile.mkdtemp(prefix="probe39-"))
        pids, db, f = tmp / "pids", tmp / "c.duckdb", tmp / "c.yaml"
        pids.write_text("")
        start = f"{'setsid -w ' if trial % 2 == 0 else ''}{sys.executable} {fake} --port {{port}} --pids {pids} -- " \
                "{command}"
        f.write_text(f"{HEAD}  - {{name: s, health_timeout: 90, sglang: {{model: glm-4.6, tp: 8, template: {{start: "
                     f"'{start}', stop: 'true'}}}}}}\nstop_grace: 2\nduration: 3\n" + LOADS.replace(
                         "rate: 1}", "rate: 1}\n  - {name: b, workload: chat, profile: poisson, rate: 2}"))
        runner = subprocess.Popen([str(capbench), "campaign", str(f), "--db", str(db)], stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL, cwd=tmp)
        rng, t0 = random.Random(trial), time.monotonic()
        if trial % 2:  # a random moment once the server is up (on a loaded host that can take a while)
            while len(pids.read_text().split()) < 2 and runner.poll() is None and time.monotonic() - t0 < 120:
                time.sleep(0.1)
            time.sleep(rng.uniform(0.0, 5.0))
        else:  # a random moment from the start: before, during or after the launch
            time.sleep(rng.uniform(2.0, 14.0))
        when = time.monotonic() - t0
        runner.kill()
        runner.wait()
        time.sleep(30)
        started = [int(x) for x in pids.read_text().split()]
        left = sorted(set(_marked(db)) | set(_live(started)))
        print(f"6. kill {trial + 1}: at {when:.1f} s, {len(started)} server processes had started, {len(left)} left",
              flush=True)
        total += len(left)
        for pid in left:  # what this probe started, ended
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
    print(f"6. processes left after {kills} SIGKILLs: {total}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kills", type=int, default=4)
    ap.add_argument("--only", choices=("values", "redaction", "orphans"), default=None)
    a = ap.parse_args()
    if a.only in (None, "values"):
        with tempfile.TemporaryDirectory() as d:
            values(Path(d))
    if a.only in (None, "redaction"):
        redaction()
    if a.only in (None, "orphans"):
        orphans(a.kills)
