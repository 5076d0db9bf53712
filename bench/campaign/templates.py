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

KEYS = {"start", "stop", "host", "python", "image"}
RUNTIME = ("python", "image")  # the SGLang interpreter and the container image: campaign-wide, per deployment
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
CONTAINER_PYTHON = "python3"  # the interpreter inside an image when none is named (SGLang's images have it)


@dataclass(frozen=True)
class Template:
    start: str  # shell command with {command} and {port} (and {host}, {python}, {image})
    stop: str | None = None
    host: str = "127.0.0.1"
    name: str | None = None  # one of the operator's templates, referred to by this name
    python: str | None = None  # the operator's SGLang interpreter for this template
    image: str | None = None  # the operator's container image for this template


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
    for key in RUNTIME:
        if key in t and (wrong := guard.check_runtime(key, t[key])) is not None:
            problems.append(f"{where}.{key}: {wrong}")
    if "host" in t and (wrong := guard.check_host(t["host"])) is not None:
        problems.append(f"{where}.host: {wrong}")
    return Template(str(t["start"]), str(t["stop"]) if t.get("stop") else None, str(t.get("host", "127.0.0.1")),
                    name, t.get("python"), t.get("image"))


def runtime_keys(problems: list, where: str, raw: dict) -> dict:
    """The `python` and `image` keys of a mapping (the campaign's top level, or a deployment's sglang), checked."""
    out = {}
    for key in RUNTIME:
        if key in raw:
            wrong = guard.check_runtime(key, raw[key])
            if wrong is None:
                out[key] = raw[key]
            else:
                problems.append(f"{where}{'.' if where else ''}{key}: {wrong}")
    return out


def runtime(dep) -> tuple[str | None, str | None]:  # noqa: ANN001
    """(interpreter, image) a deployment launches with: its own keys, else its template's; an image without a named
    interpreter runs the image's python3. (None, None): `capbench sglang-launch` of this checkout."""
    t = dep.template
    python = dep.sglang.get("python") or (t.python if t else None)
    image = dep.sglang.get("image") or (t.image if t else None)
    return python or (CONTAINER_PYTHON if image else None), image


def check_runtime_use(problems: list, where: str, dep) -> None:  # noqa: ANN001
    """An image runs only through a template that places it ({image} in start), and {image} needs an image."""
    if dep.kind != "sglang":
        return
    _, image = runtime(dep)
    start = dep.template.start if dep.template else ""
    if image and "{image}" not in start:
        problems.append(f"{where}.sglang.image: a container image runs through a template whose start places "
                        "{image}, e.g. docker run --rm --gpus all --network host {image} {command}")
    elif "{image}" in start and not image:
        problems.append(f"{where}.sglang.template: start places {{image}} but no image is named (image: in the "
                        "campaign, the deployment or the template)")


def launch_by(problems: list, where: str, dep, templates: dict[str, Template], inline: bool):  # noqa: ANN001, ANN201
    """An SGLang deployment (spec.DeploymentSpec) with its template resolved: the operator's of the name it gives;
    one written in the campaign only if `inline`; none (a launch on this host) only if `inline` too."""
    if dep.kind != "sglang":
        return dep
    t = dep.template
    known = ", ".join(sorted(templates)) or "none; capbench serve --templates FILE names them"
    if not inline and (own := [k for k in RUNTIME if k in dep.sglang]):
        problems.append(f"{where}.sglang.{own[0]}: refused: a campaign queued on capbench serve does not choose "
                        "what runs; the operator's launch template names the interpreter or image")
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
    a YAML mapping of name -> {start, stop, host, python, image}. BadInput listing every problem."""
    if not path:
        return {}
    raw = guard.read_yaml(guard.read_file(path, "templates"), str(path))
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
