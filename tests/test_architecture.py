"""The house rules of the import graph (docs/architecture.md), checked on the source with ast, lazy imports
inside functions included: no cycles; dashboard -> bench -> loadgen; bench/model pure; engine_patches reached only
by the CLI, lazily; outside a package, only its public names (its __init__) are imported."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("bench", "loadgen", "dashboard", "engine_patches")
SUBPACKAGES = ("bench.model", "bench.store", "bench.twin", "bench.report", "bench.cli", "bench.campaign")


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for path in (ROOT / pkg).rglob("*.py"):
            if "boot" in path.parts:  # engine_patches/boot: a sitecustomize put on SGLang's PYTHONPATH
                continue
            out[_module_name(path)] = path
    return out


MODULES = _modules()


def _resolve(name: str) -> str | None:
    """The longest known module that `name` is or lies in (`bench.model.fits.capacity.Deployment` -> the module)."""
    while name:
        if name in MODULES:
            return name
        name = name.rpartition(".")[0]
    return None


def _edges(module: str, path: Path, typing: bool = False) -> list[tuple[str, str, str | None, bool]]:
    """(imported module, module as written, name taken from it or None, lazy?) for every import of our packages;
    typing: also the imports made for annotations only (under TYPE_CHECKING)."""
    tree = ast.parse(path.read_text())
    is_pkg = path.name == "__init__.py"
    out = []

    def visit(node: ast.AST, lazy: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child.test) and not typing:
                continue  # annotations only: nothing is imported at run time
            inner = lazy or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef)
            if isinstance(child, ast.Import):
                for alias in child.names:
                    target = _resolve(alias.name)
                    if target:
                        out.append((target, alias.name, None, inner))
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    pkg = module if is_pkg else module.rpartition(".")[0]
                    for _ in range(child.level - 1):
                        pkg = pkg.rpartition(".")[0]
                    base = f"{pkg}.{base}" if base else pkg
                for alias in child.names:
                    full = f"{base}.{alias.name}"
                    target = full if full in MODULES else _resolve(base)
                    if target:
                        out.append((target, base, alias.name, inner))
            visit(child, inner)

    visit(tree, False)
    return [e for e in out if e[0] != module]


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


GRAPH = {m: _edges(m, p) for m, p in MODULES.items()}
TYPED_GRAPH = {m: _edges(m, p, typing=True) for m, p in MODULES.items()}


def _area(module: str) -> str:
    for sub in SUBPACKAGES:
        if module == sub or module.startswith(sub + "."):
            return sub
    return module.split(".")[0] if module.split(".")[0] != "bench" else module


def test_no_import_cycles():
    """No loops, those closed by imports made for annotations only included."""
    state: dict[str, int] = {}
    stack: list[str] = []
    cycles = []

    def dfs(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for target, *_ in TYPED_GRAPH[m]:
            if state.get(target) == 1:
                cycles.append(stack[stack.index(target):] + [target])
            elif target not in state:
                dfs(target)
        stack.pop()
        state[m] = 2

    for m in sorted(TYPED_GRAPH):
        if m not in state:
            dfs(m)
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)


# the foundation every part may import: the one error, the options' bounds and the one reader of users' files
FOUNDATION = ("bench", "bench.errors", "bench.checks", "bench.files")
# what each part of the house may import (besides itself and the FOUNDATION)
ALLOWED = {
    "loadgen": set(),
    "bench.model": {"loadgen"},
    "bench.store": {"bench.model"},
    "bench.twin": {"bench.model"},
    "bench.report": {"bench.model", "bench.store"},
    "dashboard": {"bench.model", "bench.store", "bench.report", "bench.campaign"},  # campaign: check and queue
    "engine_patches": set(),
}


@pytest.mark.parametrize("part", sorted(ALLOWED))
def test_imports_point_one_way(part):
    bad = []
    for m, edges in GRAPH.items():
        if _area(m) != part:
            continue
        for target, *_ in edges:
            area = _area(target)
            if area in (part, *FOUNDATION) or area in ALLOWED[part]:
                continue
            bad.append(f"{m} -> {target}")
    assert not bad, f"{part} may import only {sorted(ALLOWED[part]) or 'nothing else'}: " + ", ".join(bad)


def test_the_foundation_imports_only_itself():
    bad = [f"{m} -> {t}" for m in FOUNDATION for t, *_ in GRAPH[m] if t not in FOUNDATION]
    assert not bad, "the foundation modules import only each other: " + ", ".join(bad)


def test_engine_patches_only_from_the_cli_and_lazily():
    bad = [f"{m} -> {t}{'' if lazy else ' (at import time)'}" for m, edges in GRAPH.items()
           if not m.startswith("engine_patches")
           for t, _, _, lazy in edges if t.startswith("engine_patches") and not (m.startswith("bench.cli") and lazy)]
    assert not bad, "engine_patches is reached only by the CLI, inside a command: " + ", ".join(bad)


def test_nothing_imports_the_dashboard():
    bad = [f"{m} -> {t}" for m, edges in GRAPH.items() if not m.startswith("dashboard")
           for t, *_ in edges if t.startswith("dashboard")]
    assert not bad, ", ".join(bad)


def _public_names(package: str) -> set[str]:
    tree = ast.parse((ROOT / package.replace(".", "/") / "__init__.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets):
            return set(ast.literal_eval(node.value))
    return set()


@pytest.mark.parametrize("package", ["bench.model", "bench.store", "bench.twin", "bench.report", "bench.campaign"])
def test_callers_use_a_package_public_names(package):
    """Code outside a package imports from the package itself, and only the names its __init__ lists in __all__."""
    public = _public_names(package)
    assert public, f"{package}/__init__.py has no __all__"
    bad = []
    for m, edges in GRAPH.items():
        if m == package or m.startswith(package + "."):
            continue
        for _, base, name, _ in edges:
            if base in LAYER_PACKAGES and base.startswith(package + "."):
                if name not in _public_names(base):
                    bad.append(f"{m}: {name} is not in {base}.__all__")
            elif base.startswith(package + "."):
                bad.append(f"{m}: from {base} import {name}" if name else f"{m}: import {base}")
            elif base == package and name not in public:
                bad.append(f"{m}: {name} is not in {package}.__all__")
    assert not bad, "import from the package's public names: " + "; ".join(sorted(set(bad)))


# bench/model's layers, lowest first: a module imports from its own layer or a lower one, never a higher one
LAYERS = ("fits", "step", "serving", "evidence", "advice", "pd", "answer")
LAYER_PACKAGES = {f"bench.model.{x}" for x in LAYERS}


def _layer(module: str) -> int | None:
    parts = module.split(".")
    return LAYERS.index(parts[2]) if module.startswith("bench.model.") and parts[2] in LAYERS else None


def test_bench_model_is_layered():
    """Every bench/model module lives in a layer, and no layer imports a higher one (annotations included)."""
    loose = [m for m in MODULES if m.startswith("bench.model.") and _layer(m) is None]
    assert not loose, f"bench/model modules outside a layer package: {loose}"
    up = [f"{m} -> {t}" for m, edges in TYPED_GRAPH.items() if (lm := _layer(m)) is not None
          for t, *_ in edges if (lt := _layer(t)) is not None and lt > lm]
    assert not up, "a layer imports a higher one: " + ", ".join(up)
    for layer in LAYERS:
        assert _public_names(f"bench.model.{layer}"), f"bench/model/{layer}/__init__.py has no __all__"


def test_modules_stay_small():
    big = {str(p.relative_to(ROOT)): n for p in MODULES.values() if (n := len(p.read_text().splitlines())) > 400}
    assert not big, f"modules over 400 lines: {big}"


def test_the_graph_is_read():
    """The walker finds the imports it judges (a walker that reads nothing would pass everything)."""
    assert any(target == "bench.model.fits.capacity" for target, *_ in GRAPH["bench.model.step.perfmodel"])
    assert any(t == "bench.model.serving.simulate" for t, *_ in TYPED_GRAPH["bench.model.evidence.interval"])
    assert not any(t == "bench.model.serving.simulate" for t, *_ in GRAPH["bench.model.evidence.interval"])
    assert any(t.startswith("engine_patches") and lazy for m, e in GRAPH.items() if m.startswith("bench.cli")
               for t, _, _, lazy in e)
