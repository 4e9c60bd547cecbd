"""The shape of the house (docs/architecture.md), checked on the source itself: no import circle, even one
hidden by a function-level import, and no import that runs back up a floor."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"

# A room on the left never imports a room on the right (a floor above it, or a sibling it must not know).
FLOORS: dict[str, tuple[str, ...]] = {
    "servelab.results": ("servelab",),  # the contract: nothing of ours below it but itself
    "servelab.store": (
        "servelab.bench",
        "servelab.model",
        "servelab.engines",
        "servelab.sim",
        "servelab.tune",
        "servelab.trial",
        "servelab.deploy",
        "servelab.report",
        "servelab.ui",
        "servelab.cli",
    ),
    "servelab.model": (
        "servelab.bench",
        "servelab.store",
        "servelab.engines",
        "servelab.sim",
        "servelab.tune",
        "servelab.trial",
        "servelab.deploy",
        "servelab.report",
        "servelab.ui",
        "servelab.cli",
    ),
    "servelab.bench": (
        "servelab.tune",
        "servelab.trial",
        "servelab.deploy",
        "servelab.report",
        "servelab.ui",
        "servelab.cli",
    ),
    "servelab.analyze": (
        "servelab.store",
        "servelab.bench",
        "servelab.tune",
        "servelab.trial",
        "servelab.cli",
    ),
    # the search proposes and learns; the tuner runs what it proposes (search.driver gets the tuner passed in)
    "servelab.search": (
        "servelab.bench",
        "servelab.engines",
        "servelab.executors",
        "servelab.trial",
        "servelab.tune",
        "servelab.deploy",
        "servelab.report",
        "servelab.ui",
        "servelab.cli",
    ),
    "servelab.executors": (
        "servelab.bench",
        "servelab.trial",
        "servelab.tune",
        "servelab.deploy",
        "servelab.report",
        "servelab.ui",
        "servelab.cli",
    ),
    "servelab.trial": ("servelab.tune", "servelab.deploy", "servelab.cli"),
    "servelab.tune": ("servelab.deploy", "servelab.cli"),
    # a front end beside the CLI: it runs the commands as children and reads the store, never runs a
    # study in its own process (a study's driver is a `servelab tune` child holding the lease)
    "servelab.mcp": (
        "servelab.tune",
        "servelab.trial",
        "servelab.search",
        "servelab.executors",
        "servelab.bench",
        "servelab.deploy",
        "servelab.report",
        "servelab.ui",
        "servelab.cli",
    ),
}
ALLOWED = {"servelab.errors", "servelab.paths", "servelab.redact"}


def _modules() -> dict[str, Path]:
    out = {}
    for p in (SRC / "servelab").rglob("*.py"):
        parts = p.relative_to(SRC).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = p
    return out


def _imports(tree: ast.AST, mods: dict[str, Path], out: set[str]) -> None:
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            continue  # annotations only: never executed
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("servelab"):
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                out.add(sub if sub in mods else node.module)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.startswith("servelab"))
        _imports(node, mods, out)


def _graph() -> dict[str, set[str]]:
    mods = _modules()
    graph = {}
    for name, path in mods.items():
        found: set[str] = set()
        _imports(ast.parse(path.read_text()), mods, found)
        graph[name] = {d for d in found if d in mods and d != name and not name.startswith(d + ".")}
    return graph


def _within(name: str, room: str) -> bool:
    return name == room or name.startswith(room + ".")


def test_no_import_circle_even_through_function_level_imports() -> None:
    graph = _graph()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                circles.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    assert circles == []


def test_no_import_runs_back_up_a_floor() -> None:
    graph = _graph()
    wrong = []
    for name, deps in sorted(graph.items()):
        for room, above in FLOORS.items():
            if not _within(name, room):
                continue
            wrong += [
                f"{name} -> {d}"
                for d in sorted(deps)
                if d not in ALLOWED and not _within(d, room) and any(_within(d, a) for a in above)
            ]
        if not _within(name, "servelab.cli") and name != "servelab.__main__":
            wrong += [f"{name} -> {d}" for d in sorted(deps) if _within(d, "servelab.cli")]
    assert wrong == []


def test_the_checker_sees_a_circle_when_there_is_one(tmp_path: Path) -> None:
    """The scan reads function-level imports (the way circles hide) and skips TYPE_CHECKING blocks."""
    src = (
        "import os\nif TYPE_CHECKING:\n    from servelab.b import X\ndef f():\n    from servelab.c import Y\n"
    )
    mods = {"servelab.b": tmp_path, "servelab.c": tmp_path}
    found: set[str] = set()
    _imports(ast.parse(src), mods, found)
    assert found == {"servelab.c"}
