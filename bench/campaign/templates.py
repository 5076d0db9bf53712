"""Launch templates: the shell command that brings an SGLang deployment up elsewhere (ssh, srun, kubectl), and who
may write one. `capbench campaign FILE` is the user's own command: a template written in the file runs. `capbench
serve` runs what anyone who can open its page or write its queue folder submits: there a campaign names one of the
templates its operator gave at start (`--templates FILE`) and carries no shell command of its own; with none given
it launches nothing (twins and URLs only).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from pathlib import Path

from bench.campaign import guard
from bench.errors import BadInput

KEYS = {"start", "stop", "host"}
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


@dataclass(frozen=True)
class Template:
    start: str  # shell command with {command} and {port}
    stop: str | None = None
    host: str = "127.0.0.1"
    name: str | None = None  # one of the operator's templates, referred to by this name


def parse_template(problems: list, where: str, t: object, name: str | None = None) -> Template | None:
    """A template mapping {start, stop, host}; its problems appended as `where.key: what` lines."""
    if not isinstance(t, dict) or "start" not in t:
        problems.append(f"{where}: a mapping with start (and stop, host) is required")
        return None
    for key in t:
        if key not in KEYS:
            problems.append(f"{where}.{key}: unknown key (known: {', '.join(sorted(KEYS))})")
    if "{command}" not in str(t["start"]):
        problems.append(f"{where}.start: must contain {{command}} (capbench fills in the launch)")
    for key in ("start", "stop"):
        if t.get(key) and (wrong := guard.check_template_text(str(t[key]))) is not None:
            problems.append(f"{where}.{key}: {wrong}")
    return Template(str(t["start"]), str(t["stop"]) if t.get("stop") else None, str(t.get("host", "127.0.0.1")),
                    name)


def launch_by(problems: list, where: str, dep, templates: dict[str, Template], inline: bool):  # noqa: ANN001, ANN201
    """An SGLang deployment (spec.DeploymentSpec) with its template resolved: the operator's of the name it gives;
    one written in the campaign only if `inline`; none (a launch on this host) only if `inline` too."""
    if dep.kind != "sglang":
        return dep
    t = dep.template
    known = ", ".join(sorted(templates)) or "none; capbench serve --templates FILE names them"
    if t is not None and t.name is not None:
        if t.name not in templates:
            problems.append(f"{where}.sglang.template: no launch template named {t.name!r} (known: {known})")
            return dep
        return replace(dep, template=templates[t.name])
    if not inline:
        what = "carries its own shell command" if t is not None else "would launch SGLang on the service's host"
        problems.append(f"{where}.sglang.template: refused: a campaign queued on capbench serve {what}; name one of "
                        f"the operator's launch templates instead (known: {known})")
    return dep


def operator_templates(path: str | Path | None) -> dict[str, Template]:
    """The templates named at start (`capbench serve --templates FILE`, `capbench campaign --templates FILE`):
    a YAML mapping of name -> {start, stop, host}. BadInput listing every problem."""
    if not path:
        return {}
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise BadInput(f"--templates {path}: cannot be read ({e.strerror or type(e).__name__})") from None
    raw = guard.read_yaml(data, str(path))
    if not isinstance(raw, dict) or not raw:
        raise BadInput(f"{path}: a mapping of template name -> {{start, stop, host}} is required")
    problems: list[str] = []
    out = {}
    for name, t in raw.items():
        if not NAME.match(str(name)):
            problems.append(f"{name}: a name of letters, digits, . _ - is required")
        out[str(name)] = parse_template(problems, str(name), t, str(name))
    if problems:
        raise BadInput(f"{path}: {len(problems)} problem(s) in the templates file\n" + "\n".join(problems))
    return out
