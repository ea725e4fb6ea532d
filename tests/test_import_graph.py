"""The import graph of agenttune_lib: no circles, no upward edge between layers unless allowed with a reason.

Built with the standard library's ``ast`` from the source (every import, also those inside functions: a lazy
import is still a dependency). Layers follow ``../shared/ARCHITECTURE.md``'s package map, lowest first:
the EventLog contract, then storage, then the building blocks, the agent spine, training and DECIDE,
evaluation, the loops composed of them, and the shells.
"""
from __future__ import annotations

import ast
import sys
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "agenttune_lib"

#: Layer per top-level package or module of agenttune_lib (0 = lowest). An edge between two of them must point
#: to a lower layer; within one package only circles are checked.
LAYERS: dict[str, int] = {
    "trajectory_formats": -1,                        # foreign shapes read into the contract's dict form; imports nothing
    "events": 0, "config": 0, "privacy": 0,          # the contract and dependency-free helpers
    "__init__": 1,                                   # the package itself: re-exports the contract, __version__
    "warehouse": 1, "corpus": 1,                     # storage of EventLogs, provenance and documents
    "tools": 2, "models": 2,                         # tools and model wrappers everything injects
    "spine": 3, "rag": 3,                            # strategies, harnesses, episodes; retrieval and synthesis
    "teachers": 4, "rl": 4, "decide": 4,             # what learns from the spine, and DECIDE workflows
    "evaluation": 5,                                 # scores adapters on suites run through the spine
    "closed_loop": 6, "multi_agent": 6, "lineage": 6,  # loops composed of the layers below
    "cli": 7, "service": 7,                          # shells: the agenttune command and the served API
}

#: Edges that point up a layer, each with the reason it is kept (importer, imported) -> why.
ALLOWED_UPWARD: dict[tuple[str, str], str] = {
    ("agenttune_lib.models.generate", "agenttune_lib.spine.state"):
        "the model wrapper returns the spine's Generation record (a dataclass of tokens and logprobs), imported at module level",
    ("agenttune_lib.models.serving", "agenttune_lib.decide.models"):
        "the served model hands DECIDE its own model adapter, imported lazily inside decide_model()",
    ("agenttune_lib.spine.project", "agenttune_lib.closed_loop"):
        "Project is the paper's one-object facade over the platform (§3.1): its detect step composes the closed loop, lazily",
    ("agenttune_lib.spine.project", "agenttune_lib.evaluation.trajectory"):
        "Project's evaluate step composes TrajectoryEvaluator, lazily (same facade)",
    ("agenttune_lib.spine.collect", "agenttune_lib.teachers.llm"):
        "teacher-trajectory collection runs an injected teacher's rejection sampling, imported lazily per call",
    ("agenttune_lib.spine.collect", "agenttune_lib.teachers.tau2"):
        "teacher-trajectory collection builds the tau2 expert teacher for tau2 tasks, imported lazily per call",
    ("agenttune_lib.warehouse.outcome", "agenttune_lib.evaluation.store"):
        "the run outcome reads evaluation_comparisons through evaluation's reader when installed, else the table directly",
}

#: Circles being broken on another branch: (name, why) -> the modules it may span. Remove each entry when its fix merges.
TEMPORARY_CIRCLES: dict[tuple[str, str], frozenset[str]] = {}

FORBIDDEN_TOP = ("dagster", "dagster_", "agenttune_assets")


def module_files(root: Path, package: str = PACKAGE) -> dict[str, tuple[Path, bool]]:
    """Dotted module name -> (file, is a package __init__) for every .py file under ``root/package``."""
    out: dict[str, tuple[Path, bool]] = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        is_pkg = parts[-1] == "__init__"
        out[".".join(parts[:-1] if is_pkg else parts)] = (path, is_pkg)
    return out


def imported_names(path: Path, module: str, is_pkg: bool) -> list[str]:
    """Every absolute dotted name ``path`` imports (``from a import b`` gives ``a.b``), relative imports resolved."""
    base = module if is_pkg else module.rpartition(".")[0]
    names: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = base.split(".")
                parts = parts[: len(parts) - (node.level - 1)]
                target = ".".join(parts + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            names += [f"{target}.{a.name}" for a in node.names]
    return names


def import_graph(root: Path, package: str = PACKAGE) -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """(edges between the package's modules, every name each module imports from outside the package)."""
    modules = module_files(root, package)

    def resolve(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    edges: dict[str, set[str]] = defaultdict(set)
    external: dict[str, set[str]] = defaultdict(set)
    for module, (path, is_pkg) in modules.items():
        for name in imported_names(path, module, is_pkg):
            if name == package or name.startswith(package + "."):
                target = resolve(name)
                if target is not None and target != module:
                    edges[module].add(target)
            else:
                external[module].add(name)
    return dict(edges), dict(external)


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    nodes = sorted(set(edges) | {t for ts in edges.values() for t in ts})
    for start in nodes:
        if start in index:
            continue
        work = [(start, iter(sorted(edges.get(start, ()))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return sorted(found)


def top_package(module: str) -> str:
    """``agenttune_lib.spine.harness`` -> ``spine``; the package itself -> ``__init__``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def upward_edges(edges: dict[str, set[str]], layers: dict[str, int]) -> list[tuple[str, str]]:
    """Edges between two top-level packages that do not point to a strictly lower layer."""
    out = []
    for source, targets in edges.items():
        for target in targets:
            a, b = top_package(source), top_package(target)
            if a != b and layers[b] >= layers[a]:
                out.append((source, target))
    return sorted(out)


def unexplained_circles(found: list[list[str]]) -> list[list[str]]:
    """Circles not inside a TEMPORARY_CIRCLES entry."""
    return [c for c in found if not any(set(c) <= mods for mods in TEMPORARY_CIRCLES.values())]


# ---------------------------------------------------------------- the tests on agenttune_lib


@pytest.fixture(scope="module")
def graph() -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    return import_graph(ROOT)


def test_every_package_has_a_layer(graph):
    edges, _ = graph
    unknown = sorted({top_package(m) for m in module_files(ROOT)} - set(LAYERS))
    assert unknown == [], f"add these packages to LAYERS in tests/test_import_graph.py: {unknown}"


def test_no_import_circles(graph):
    edges, _ = graph
    bad = unexplained_circles(circles(edges))
    assert bad == [], "import circles (move the shared type to the lower module, or split the module):\n" + "\n".join(
        " <-> ".join(c) for c in bad)


def test_no_upward_edge_without_a_reason(graph):
    edges, _ = graph
    bad = [e for e in upward_edges(edges, LAYERS) if e not in ALLOWED_UPWARD]
    assert bad == [], "edges to a higher or equal layer (fix, or add to ALLOWED_UPWARD with why):\n" + "\n".join(
        f"{a} -> {b}" for a, b in bad)


def test_allow_lists_have_no_stale_entries(graph):
    # an entry whose edge or circle is gone would silently allow it again later: remove it with the fix
    edges, _ = graph
    assert sorted(set(ALLOWED_UPWARD) - set(upward_edges(edges, LAYERS))) == []
    found = circles(edges)
    stale = [name for name, mods in TEMPORARY_CIRCLES.items() if not any(set(c) <= mods for c in found)]
    assert stale == [], f"TEMPORARY_CIRCLES entries whose circle is gone (remove them): {stale}"
    assert all(reason.strip() for reason in ALLOWED_UPWARD.values())


def test_agenttune_lib_never_imports_dagster_or_the_assets(graph):
    _, external = graph
    bad = sorted(f"{m} imports {n}" for m, names in external.items() for n in names
                 if n.split(".")[0] in ("dagster", "agenttune_assets") or n.startswith("dagster_"))
    assert bad == []


def test_events_imports_only_the_standard_library(graph):
    # the contract reads foreign shapes through trajectory_formats, which imports nothing of the package
    edges, external = graph
    assert edges.get("agenttune_lib.events", set()) <= {"agenttune_lib.trajectory_formats"}
    assert edges.get("agenttune_lib.trajectory_formats", set()) == set()
    outside = sorted(n for m in ("agenttune_lib.events", "agenttune_lib.trajectory_formats") for n in external.get(m, set())
                     if n.split(".")[0] not in sys.stdlib_module_names and n.split(".")[0] != "__future__")
    assert outside == []


def test_events_stays_a_small_module():
    # the paper's EventLog is one small module: fast paths belong to the warehouse, foreign shapes to trajectory_formats
    lines = (ROOT / PACKAGE / "events.py").read_text().count("\n")
    assert lines < 400, f"agenttune_lib/events.py has {lines} lines; keep the contract under 400"


# ---------------------------------------------------------------- the checks can fail


def _write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_the_checks_find_a_circle_an_upward_edge_and_a_lazy_import(tmp_path):
    _write(tmp_path, {
        "agenttune_lib/__init__.py": "",
        "agenttune_lib/events.py": "def f():\n    from agenttune_lib.spine import harness\n",  # lazy, and upward
        "agenttune_lib/spine/__init__.py": "",
        "agenttune_lib/spine/harness.py": "from .strategies import x\nimport dagster\n",
        "agenttune_lib/spine/strategies.py": "from agenttune_lib.spine.harness import y\nfrom agenttune_lib import events\n",
    })
    edges, external = import_graph(tmp_path)
    assert edges["agenttune_lib.spine.harness"] == {"agenttune_lib.spine.strategies"}
    assert edges["agenttune_lib.spine.strategies"] == {"agenttune_lib.spine.harness", "agenttune_lib.events"}
    assert circles(edges) == [
        ["agenttune_lib.events", "agenttune_lib.spine.harness", "agenttune_lib.spine.strategies"]]
    assert upward_edges(edges, LAYERS) == [("agenttune_lib.events", "agenttune_lib.spine.harness")]
    assert external["agenttune_lib.spine.harness"] == {"dagster"}
    assert unexplained_circles([["agenttune_lib.rl.data", "agenttune_lib.rl.rollout"]]) == [["agenttune_lib.rl.data", "agenttune_lib.rl.rollout"]]
    assert unexplained_circles([["agenttune_lib.rl.data", "agenttune_lib.spine.state"]]) == [
        ["agenttune_lib.rl.data", "agenttune_lib.spine.state"]]
