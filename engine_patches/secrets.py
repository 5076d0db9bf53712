"""SGLang's secret arguments given as `--api-key env:NAME`: filled in from the environment inside the server's own
process (a `python -c` wrapper around sglang.launch_server), never on a command line, and kept out of the server's
output."""

from __future__ import annotations

# SGLang reads its keys only from its command line. Given as `--api-key env:NAME`, the value is filled in inside the
# server's own process, before SGLang parses its arguments: no `ps` line or stored command holds it. SGLang logs its
# server_args (api_key included) and its processes print what they like, so their output (fds 1 and 2, which every
# child inherits) goes through a filter process that writes it on with each key, and its escaped forms, as ***.
SECRET_FLAGS = ("--api-key", "--admin-api-key", "--ssl-keyfile-password")
FILL_SECRETS = (
    "import json, os, runpy, sys\n"
    f"S = {SECRET_FLAGS!r}\n"
    "a, keys = sys.argv, []\n"
    "for i in range(1, len(a)):\n"
    "    f, eq, v = a[i].partition('=')\n"
    "    if eq and f in S and v.startswith('env:'):\n"
    "        keys.append(os.environ[v[4:]]); a[i] = f + '=' + keys[-1]\n"
    "    elif a[i - 1] in S and a[i].startswith('env:'):\n"
    "        keys.append(os.environ[a[i][4:]]); a[i] = keys[-1]\n"
    "forms = sorted({x.encode() for k in keys if k for x in (k, repr(k)[1:-1], json.dumps(k)[1:-1])}, key=len)[::-1]\n"
    "if forms:\n"
    "    r, w = os.pipe()\n"
    "    if os.fork() == 0:\n"
    "        os.close(w); buf, keep = b'', max(map(len, forms))\n"
    "        def out(b):\n"
    "            for x in forms: b = b.replace(x, b'***')\n"
    "            os.write(1, b)\n"
    "        while chunk := os.read(r, 65536):\n"
    "            buf += chunk; head, nl, buf = buf.rpartition(b'\\n')\n"
    "            if nl: out(head + nl)\n"
    "            if len(buf) > 65536: out(buf[:-keep]); buf = buf[-keep:]\n"
    "        out(buf); os._exit(0)\n"
    "    os.close(r); sys.stdout.flush(); sys.stderr.flush(); os.dup2(w, 1); os.dup2(w, 2); os.close(w)\n"
    "runpy.run_module('sglang.launch_server', run_name='__main__', alter_sys=True)\n")


def secret_refs(sglang_args: list[str]) -> list[str]:
    """The environment variables named by env:NAME values of SGLang's secret flags."""
    out = []
    for i, arg in enumerate(sglang_args):
        flag, eq, value = arg.partition("=")
        if eq and flag in SECRET_FLAGS and value.startswith("env:"):
            out.append(value[4:])
        elif i and sglang_args[i - 1] in SECRET_FLAGS and arg.startswith("env:"):
            out.append(arg[4:])
    return out
