"""A campaign file: deployments x loads, with an SLO, read and checked before anything launches.

Every problem found is one line (`deployments[2].sglang.kv_dtype: ...`); the CLI prints them all and exits 2.
The schema is documented in data/campaigns/README.md. Rates and SLOs are of the deployment's own GPUs; a twin
deployment runs `time_scale` times faster, so its offered rates are multiplied and its SLO divided by it.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field, replace
from pathlib import Path

from bench.campaign import eval_stage, guard
from bench.campaign import flags as server_flags
from bench.campaign.keys import with_caps, with_gpu_metrics, with_repeats, with_stop_grace, workload_path
from bench.campaign.pd_spec import PDSpec, parse_pd, resolve
from bench.campaign.problems import Problems
from bench.campaign.templates import Template, check_runtime_use, launch_by, parse_template, runtime_keys
from bench.errors import BadInput
from bench.model import Deployment, Slo, catalog, parse_slo
from bench.model.pd import disagg

KINDS = ("twin", "sglang", "url", "disaggregated")
DEPLOYMENT_KEYS = {"name", "baseline", "health_timeout", "stop_grace", "model", "gpu", "gpus", "gpu_metrics", *KINDS}
SGLANG_KEYS = {"model", "model_path", "gpu", "tp", "dp", "ep", "kv_dtype", "weights", "kv_scales", "kv_checksum",
               "port", "flags", "template", "python", "image"}
LOAD_KEYS = {"name", "workload", "profile", "rate", "users", "slo", "sweep", "duration", "repeats", "max_concurrency",
             "eval"}
SWEEP_KEYS = {"start", "factor", "max_stages", "refine", "min_gain", "from_model", "resolution"}
TOP_KEYS = {"name", "description", "slo", "duration", "health_timeout", "stop_grace", "deployments", "loads",
            "python", "image"}
KV_DTYPES = ("bf16", "fp8_e4m3", "fp8_e5m2")
WEIGHTS = ("native", "bf16", "fp8", "int4-g32", "int4-g128")
CHECKSUMS = ("off", "verify", "strict")
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


@dataclass(frozen=True)
class Sweep:
    start: float  # first offered rate, requests/s of the deployment's GPUs
    factor: float = 1.5  # each next rate while the SLO holds and goodput rises
    max_stages: int = 8
    refine: int = 6  # most bisections between the last rate within the SLO and the first past it
    min_gain: float = 0.05  # goodput that rises by less than this counts as no longer rising
    from_model: bool = False  # start the measured sweep at the model's answer (fewer stages)
    resolution: float = 0.05  # bisect until the bracket around the highest rate within the SLO is this narrow


@dataclass(frozen=True)
class Load:
    name: str
    workload: str
    profile: str  # sweep | poisson | users
    slo: Slo
    duration_s: float
    rate: float | None = None
    users: int | None = None
    sweep: Sweep | None = None
    repeats: int = 1  # the whole sweep (or load point) this many times, seeds 0..N-1: its figures get intervals
    max_concurrency: int | None = None  # open loop: at most this many in flight, arrivals wait in the client
    eval: eval_stage.EvalStage | None = None  # suites run on the cell's server after (or during) its load


@dataclass(frozen=True)
class DeploymentSpec:
    name: str
    kind: str  # twin | sglang | url | disaggregated
    twin: str | None = None  # `twin:...` spec
    url: str | None = None
    sglang: dict = field(default_factory=dict)
    template: Template | None = None
    pd: PDSpec | None = None  # a disaggregated deployment's roles and nodes (bench/campaign/pd_spec.py)
    model: str | None = None  # catalog ids, for predictions and cost (None: a URL of unknown make)
    gpu: str = "h200"
    gpus: int = 8
    kv_dtype: str = "bf16"
    weights: str = "native"
    kv_checksum: str = "off"
    time_scale: float = 1.0
    baseline: str | None = None
    health_timeout_s: float = 600.0
    stop_grace_s: float = 30.0  # after SIGTERM, before SIGKILL: SGLang's own shutdown
    gpu_metrics: tuple[str, ...] = ()  # its GPU nodes' Prometheus endpoints (DCGM exporter), scraped in its runs

    def deployment(self) -> Deployment | None:
        """What the model predicts for (capacity, rate within the SLO, cost); None without a catalog model."""
        if self.model is None:
            return None
        if self.twin:
            from bench.twin import parse_twin_spec

            return parse_twin_spec(self.twin).deployment()
        return Deployment(catalog.model(self.model), catalog.gpu(self.gpu), self.gpus, kv_dtype=self.kv_dtype,
                          weights=self.weights)

    def pd_shape(self) -> disagg.Shape | None:
        """The prefill/decode deployment a disaggregated twin plays (None for any other deployment)."""
        if not self.twin:
            return None
        from bench.twin import parse_twin_spec, pd_shape

        config = parse_twin_spec(self.twin)
        return pd_shape(config) if config.prefill_tp else None


@dataclass(frozen=True)
class Campaign:
    name: str
    description: str
    deployments: list[DeploymentSpec]
    loads: list[Load]
    text: str  # the file as given, kept with the campaign
    digest: str  # of the text: --resume continues the latest unfinished campaign with this name and digest

    def cells(self) -> list[tuple[DeploymentSpec, Load]]:
        return [(d, x) for d in self.deployments for x in self.loads]

    def deployment(self, name: str) -> DeploymentSpec:
        return next(d for d in self.deployments if d.name == name)


def cell_key(dep: DeploymentSpec, load: Load) -> str:
    return f"{dep.name}/{load.name}"


def load_campaign(path: str | Path, templates: dict[str, Template] | None = None) -> Campaign:
    """A campaign file (a path, also relative to the checkout, or a built-in name), run by its own user: templates
    written in it are accepted, and `templates` are the ones it may name."""
    p = guard.campaign_path(str(path), Path(__file__).resolve().parents[2])
    if p is None:
        raise BadInput(f"no campaign file {str(path)[:200]} (a path, or a built-in name of data/campaigns/)")
    return parse_campaign(guard.read_file(p), str(p), templates, inline_templates=True)


def parse_campaign(text: str | bytes, source: str = "campaign", templates: dict[str, Template] | None = None,
                   inline_templates: bool = False) -> Campaign:
    """The campaign in `text`, or BadInput listing every problem, one per line. A launch template is one of
    `templates` by name; one written in the campaign itself is accepted only with `inline_templates` (the user's own
    file on the command line, never what `capbench serve` is given)."""
    raw = guard.read_yaml(text, source)
    text = text.decode() if isinstance(text, bytes) else text
    problems = Problems()
    if not isinstance(raw, dict):
        raise BadInput(f"{source}: a campaign is a mapping with deployments and loads")
    _unknown(problems, "", raw, TOP_KEYS)
    guard.check_ranges(problems, "", raw)
    name = str(raw.get("name") or "")
    if not NAME.match(name):
        problems.add("name", f"a name of letters, digits, . _ - is required, got {name!r}")
    slo = _slo(problems, "slo", raw.get("slo"), Slo())
    duration = _number(problems, "duration", raw.get("duration", 10.0))
    timeout = _number(problems, "health_timeout", raw.get("health_timeout", 600.0))
    deps = [_deployment(problems, f"deployments[{i}]", d, timeout)
            for i, d in enumerate(_list(problems, "deployments", raw.get("deployments")))]
    deps = with_gpu_metrics(problems, raw, with_stop_grace(problems, raw, deps))
    base = Path(source).parent if Path(source).is_file() else None
    loads = [_load(problems, f"loads[{i}]", x, slo, duration, base)
             for i, x in enumerate(_list(problems, "loads", raw.get("loads")))]
    loads = eval_stage.with_eval(problems, raw, with_caps(problems, raw, with_repeats(problems, raw, loads)))
    deps, loads = [d for d in deps if d], [x for x in loads if x]
    for kind, items in (("deployments", deps), ("loads", loads)):
        names = [x.name for x in items]
        for dup in sorted({n for n in names if names.count(n) > 1}):
            problems.add(kind, f"name {dup!r} is used twice")
    for i, d in enumerate(deps):
        if d.baseline and d.baseline not in {x.name for x in deps}:
            problems.add(f"deployments[{i}].baseline", f"no deployment named {d.baseline!r}")
    everywhere = runtime_keys(problems, "", raw)  # campaign-wide python / image: each sglang deployment's default
    deps = [replace(d, sglang={**everywhere, **d.sglang}) if d.kind == "sglang" else d for d in deps]
    deps = [launch_by(problems, f"deployments[{i}]", d, templates or {}, inline_templates) if d.pd is None else
            replace(d, pd=resolve(problems, f"deployments[{i}].disaggregated", d.pd, templates or {},
                                  inline_templates)) for i, d in enumerate(deps)]
    for i, d in enumerate(deps):
        check_runtime_use(problems, f"deployments[{i}]", d)
    if problems:
        raise BadInput(f"{source}: {len(problems)} problem(s) in the campaign file\n" + "\n".join(problems))
    return Campaign(name, str(raw.get("description") or ""), deps, loads, text,
                    hashlib.sha256(text.encode()).hexdigest()[:12])


def _unknown(problems: Problems, where: str, raw: dict, known: set[str]) -> None:
    for key in raw:
        if key not in known:
            problems.add(f"{where}{'.' if where else ''}{key}", f"unknown key (known: {', '.join(sorted(known))})")


def _list(problems: Problems, where: str, value: object) -> list:
    if not isinstance(value, list) or not value:
        problems.add(where, "a non-empty list is required")
        return []
    return value


def _number(problems: Problems, where: str, value: object, kind: type = float) -> float | None:
    try:
        v = kind(value)
    except (TypeError, ValueError):
        problems.add(where, f"expected a number, got {value!r}")
        return None
    if not v > 0:
        problems.add(where, f"must be positive, got {value!r}")
        return None
    return v


def _slo(problems: Problems, where: str, value: object, default: Slo) -> Slo:
    if value is None:
        return default
    try:
        if isinstance(value, dict):
            value = ",".join(f"{k}={v}" for k, v in value.items())
        return parse_slo(str(value))
    except BadInput as e:
        problems.add(where, str(e))
        return default


def _choice(problems: Problems, where: str, value: object, choices: tuple) -> str:
    if value is False and "off" in choices:  # YAML reads a bare `off` as false
        value = "off"
    if value not in choices:
        problems.add(where, f"{value!r} is not one of {', '.join(choices)}")
    return str(value)


def _catalog(problems: Problems, where: str, model: str | None, gpu: str) -> bool:
    ok = True
    if model is not None and model not in catalog.models():
        problems.add(f"{where}.model", f"unknown model {model!r} (known: {', '.join(sorted(catalog.models()))})")
        ok = False
    if gpu not in catalog.gpus():
        problems.add(f"{where}.gpu", f"unknown GPU {gpu!r} (known: {', '.join(sorted(catalog.gpus()))})")
        ok = False
    return ok


def _deployment(problems: Problems, where: str, raw: object, timeout: float | None) -> DeploymentSpec | None:
    if not isinstance(raw, dict):
        problems.add(where, "a deployment is a mapping with a name and one of twin, sglang, url")
        return None
    _unknown(problems, where, raw, DEPLOYMENT_KEYS)
    name = str(raw.get("name") or "")
    if not NAME.match(name):
        problems.add(f"{where}.name", f"a name of letters, digits, . _ - is required, got {name!r}")
    kinds = [k for k in KINDS if k in raw]
    if len(kinds) != 1:
        problems.add(where, f"exactly one of {', '.join(KINDS)} is required, got {kinds or 'none'}")
        return None
    common = {"name": name, "kind": kinds[0], "baseline": raw.get("baseline"),
              "health_timeout_s": _number(problems, f"{where}.health_timeout",
                                          raw.get("health_timeout", timeout or 600.0)) or 600.0}
    if kinds[0] == "twin":
        return _twin(problems, where, raw, common)
    if kinds[0] == "url":
        url = str(raw["url"])
        if (wrong := guard.check_url(url)) is not None:
            problems.add(f"{where}.url", wrong)
        model, gpu = raw.get("model"), str(raw.get("gpu", "h200"))
        gpus = _number(problems, f"{where}.gpus", raw.get("gpus", 8), int) or 8
        if not _catalog(problems, where, model, gpu):
            return None
        return DeploymentSpec(**common, url=url.rstrip("/"), model=model, gpu=gpu, gpus=int(gpus))
    if kinds[0] == "disaggregated":
        return _disaggregated(problems, f"{where}.disaggregated", raw["disaggregated"], common)
    return _sglang(problems, f"{where}.sglang", raw["sglang"], common)


def _engine(problems: Problems, where: str, raw: dict, kv_default: str) -> tuple:
    """(model, gpu, whether both are in the catalog, KV dtype, expert weights, KV checksum) of an SGLang launch."""
    model, gpu = raw.get("model"), str(raw.get("gpu", "h200"))
    if model is None:
        problems.add(f"{where}.model", "the catalog model id is required (e.g. kimi-k2-thinking)")
    ok = _catalog(problems, where, model, gpu)
    kv = _choice(problems, f"{where}.kv_dtype", raw.get("kv_dtype", kv_default), KV_DTYPES)
    weights = _choice(problems, f"{where}.weights", raw.get("weights", "native"), WEIGHTS)
    checksum = _choice(problems, f"{where}.kv_checksum", raw.get("kv_checksum", "off"), CHECKSUMS)
    return model, gpu, ok, kv, weights, checksum


def _disaggregated(problems: Problems, where: str, raw: object, common: dict) -> DeploymentSpec | None:
    raw = raw if isinstance(raw, dict) else {}
    model, gpu, ok, kv, weights, checksum = _engine(problems, where, raw, "fp8_e4m3")
    pd = parse_pd(problems, where, raw or None, gpu if ok else "h200")
    if not ok or pd is None:
        return None
    gpus = pd.prefill.count * pd.prefill.tp + pd.decode.count * pd.decode.tp
    return DeploymentSpec(**common, pd=pd, model=model, gpu=gpu, gpus=gpus, kv_dtype=kv, weights=weights,
                          kv_checksum=checksum)


def _twin(problems: Problems, where: str, raw: dict, common: dict) -> DeploymentSpec | None:
    from bench.twin import parse_twin_spec

    text = str(raw["twin"])
    text = text if text.startswith("twin:") else f"twin:{text}"
    try:
        config = parse_twin_spec(text)
    except BadInput as e:
        problems.add(f"{where}.twin", str(e))
        return None
    for wrong in guard.check_finite(config, {"time_scale": 1e6}):
        problems.add(f"{where}.twin", wrong)
    return DeploymentSpec(**common, twin=text, model=config.model, gpu=config.gpu, gpus=config.tp + config.prefill_tp,
                          kv_dtype=config.kv_dtype, weights=config.weights, time_scale=config.time_scale)


def _sglang(problems: Problems, where: str, raw: object, common: dict) -> DeploymentSpec | None:
    if not isinstance(raw, dict):
        problems.add(where, "a mapping with model, tp, kv_dtype, ... is required")
        return None
    _unknown(problems, where, raw, SGLANG_KEYS)
    model, gpu, ok, kv, weights, checksum = _engine(problems, where, raw, "bf16")
    for key in ("tp", "dp", "ep", "port"):
        if key in raw:
            _number(problems, f"{where}.{key}", raw[key], int)
    flags = raw.get("flags", [])
    if not isinstance(flags, list) or not all(isinstance(f, str | int | float) for f in flags):
        problems.add(f"{where}.flags", "a list of SGLang arguments is required, e.g. [--mem-fraction-static, 0.85]")
        flags = []
    flags = [str(f) for f in flags]
    guard.check_words(problems, f"{where}.flags", flags)
    server_flags.check_server_flags(problems, f"{where}.flags", flags)
    for key in ("model_path", "kv_scales"):
        if raw.get(key) is not None:
            guard.check_words(problems, f"{where}.{key}", [raw[key]])
    runtime_keys(problems, where, raw)
    template = None
    if isinstance(raw.get("template"), str):
        template = Template("", name=raw["template"])  # the operator's, resolved by name in launch_by
    elif "template" in raw:
        template = parse_template(problems, f"{where}.template", raw["template"])
    tp = _number(Problems(), f"{where}.tp", raw.get("tp", 8), int)  # its problem is said above
    if not ok or tp is None:
        return None
    spec = {**raw, "flags": flags, "tp": tp}
    return DeploymentSpec(**common, sglang=spec, template=template, model=model, gpu=gpu, gpus=tp, kv_dtype=kv,
                          weights=weights, kv_checksum=checksum)


def _load(problems: Problems, where: str, raw: object, slo: Slo, duration: float | None,
          base: Path | None = None) -> Load | None:
    if not isinstance(raw, dict):
        problems.add(where, "a load is a mapping with a name, a workload and a profile")
        return None
    _unknown(problems, where, raw, LOAD_KEYS)
    name = str(raw.get("name") or raw.get("workload") or "")
    if not NAME.match(name):
        problems.add(f"{where}.name", f"a name of letters, digits, . _ - is required, got {name!r}")
    workload = workload_path(str(raw.get("workload", "chat")), base)
    from bench.model import workload_names

    if workload not in workload_names() and not Path(workload).is_file():
        problems.add(f"{where}.workload", f"unknown workload {workload!r} (built-in: {', '.join(workload_names())})")
    elif workload not in workload_names() and (wrong := guard.check_workload_file(workload)) is not None:
        problems.add(f"{where}.workload", wrong)
    profile = _choice(problems, f"{where}.profile", raw.get("profile", "sweep"), ("sweep", "poisson", "users"))
    load_slo = _slo(problems, f"{where}.slo", raw.get("slo"), slo)
    if profile == "sweep" and not load_slo.bounded:
        problems.add(f"{where}.slo", "a sweep to saturation needs an SLO (here or at the top)")
    secs = _number(problems, f"{where}.duration", raw.get("duration", duration or 10.0)) or 10.0
    rate = users = sweep = None
    if profile == "poisson":
        rate = _number(problems, f"{where}.rate", raw.get("rate"))
    elif profile == "users":
        users = _number(problems, f"{where}.users", raw.get("users"), int)
    else:
        s = raw.get("sweep") or {}
        if not isinstance(s, dict) or "start" not in s:
            problems.add(f"{where}.sweep", "a mapping with start (the first rate, req/s) is required")
            return None
        _unknown(problems, f"{where}.sweep", s, SWEEP_KEYS)
        values = {k: _number(problems, f"{where}.sweep.{k}", s[k], int if k in ("max_stages", "refine") else float)
                  for k in SWEEP_KEYS - {"from_model"} if k in s}
        if "from_model" in s:
            if not isinstance(s["from_model"], bool):
                problems.add(f"{where}.sweep.from_model", f"true or false, got {s['from_model']!r}")
            values["from_model"] = bool(s["from_model"])
        for k in ("refine", "min_gain"):  # these may be 0
            if s.get(k) == 0:
                values[k] = 0
                problems[:] = [p for p in problems if not p.startswith(f"{where}.sweep.{k}:")]
        if values.get("factor") is not None and values["factor"] <= 1:
            problems.add(f"{where}.sweep.factor", "must be above 1")
        if None in values.values():
            return None
        sweep = Sweep(**values)
    return Load(name, workload, profile, load_slo, secs, rate, users, sweep)
