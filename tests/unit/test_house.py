"""The shape of the house (docs/architecture.md), checked on the source itself.

Every module under src/servelab has a layer (`LAYERS`; a new file fails here until it is placed), and a
module imports only modules of its own layer or of a layer below it. An import is counted wherever it is:
at the top, inside a function, under `if TYPE_CHECKING:` (an annotation names a room just as an import
does), and as a string handed to `importlib.import_module("servelab...")` (a run-time import by name is
still an import). Over the same graph there is no import circle. The imports that still run up a floor are
listed in `KNOWN_EXCEPTIONS`, each with its reason; the list only shrinks (an entry no longer needed fails).
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"

CONTRACT, KNOWLEDGE, MACHINE, MECHANISMS, STUDY, WORKFLOWS, AGENT, FRONTS = range(8)
LAYER_NAMES = (
    "contract",
    "knowledge",
    "machine I/O",
    "mechanisms",
    "the study",
    "workflows",
    "agent",
    "fronts",
)


def _room(layer: int, package: str, *modules: str) -> dict[str, int]:
    """A package and the modules in it, all on one layer (each named: a new file must be placed)."""
    return {package: layer, **{f"{package}.{m}": layer for m in modules}}


LAYERS: dict[str, int] = {
    # 0. contract: what every room may know
    "servelab": CONTRACT,  # __init__: __version__
    "servelab.errors": CONTRACT,
    "servelab.paths": CONTRACT,
    "servelab.naming": CONTRACT,
    "servelab.redact": CONTRACT,
    "servelab.results": CONTRACT,
    "servelab.load": CONTRACT,  # load kinds: pure vocabulary every room may speak (imports nothing of ours)
    "servelab.objectives": CONTRACT,  # objectives as types, likewise
    "servelab.energy": CONTRACT,  # a level's energy and cost: pure, imports nothing of ours
    "servelab.applied": CONTRACT,
    "servelab.crashpoint": CONTRACT,
    "servelab.tasks": CONTRACT,
    "servelab.jsontypes": CONTRACT,  # JsonObject: JSON as a type, for what is only passed through or written
    "servelab.events": CONTRACT,  # progress as typed events: what rooms report, what fronts render
    "servelab.startup": CONTRACT,  # a launch's start-up phases as a type: engines read, store keeps, fronts show
    "servelab.arguments": CONTRACT,  # the options a CLI command and its MCP tool share, declared once
    # 1. knowledge: pure models of models, engines, plans and the simulated server
    **_room(
        KNOWLEDGE,
        "servelab.model",
        *[
            "architecture",
            "calibrate",
            "comm",
            "context",
            "explain",
            "factors",
            "hardware",
            "layouts",
            "memory",
            "observations",
            "predict",
            "quant",
            "silicon",
            "step",
        ],
    ),
    **_room(
        KNOWLEDGE,
        "servelab.engines",
        *[
            "base",
            "external",
            "flagdump",
            "flags",
            "flagschema",
            "llamacpp",
            "lognorm",
            "logparse",
            "options",
            "registry",
            "sglang",
            "signatures",
            "sim",
            "startup",
            "transformers",
            "vllm",
        ],
    ),
    **_room(KNOWLEDGE, "servelab.plan", *["checks", "formats", "items", "machine", "study"]),
    **{
        f"servelab.sim.{m}": KNOWLEDGE
        for m in [
            "app",
            "engine_args",
            "faults",
            "http",
            "personalities",
            "prefix",
            "render",
            "routes",
            "scheduler",
            "server",
            "startup",
            "state",
            "telemetry",
            "text",
            "virtual",
            "wire",
        ]
    },
    # 2. machine I/O: one machine, this one or reached through the transport
    **_room(
        MACHINE,
        "servelab.host",
        *[
            "agent_op",
            "commprobe",
            "doctor",
            "flagschema",
            "gpu_memory",
            "gpus",
            "logs",
            "observe",
            "ops",
            "ports",
            "processes",
            "shm",
            "systemd",
            "topology",
            "transport",
            "wire",
        ],
    ),
    # 3. mechanisms: a server's life, a benchmark, the store, output verification
    **_room(
        MECHANISMS, "servelab.lifecycle", "handle", "local", "ops", "probe", "ready", "remote", "serving"
    ),
    **_room(
        MECHANISMS,
        "servelab.bench",
        *[
            "capacity",
            "client",
            "config",
            "costs",
            "export",
            "fit",
            "level",
            "load",
            "remote",
            "metrics",
            "probe",
            "prompts",
            "runner",
            "saturation",
            "scrape",
            "sessions",
            "telemetry",
            "traces",
            "workload",
        ],
    ),
    **_room(
        MECHANISMS,
        "servelab.store",
        *["bench", "calibrations", "copy", "db", "dialect", "leases", "migrations", "plans", "studies"],
    ),
    **_room(
        MECHANISMS,
        "servelab.verify",
        *[
            "calls",
            "compare",
            "determinism",
            "garbage",
            "hfref",
            "known",
            "reference",
            "result",
            "service",
            "simref",
        ],
    ),
    # 4. the study: the study file's model, and the statistics over a study's levels
    **_room(STUDY, "servelab.config", "loading", "matrix", "problems", "sections", "study"),
    "servelab.space": STUDY,  # the study file's [search.space], checked by config (was search/space.py)
    "servelab.analyze": STUDY,
    # 5. workflows
    **_room(WORKFLOWS, "servelab.trial", "outcome", "pipeline", "prepare", "telemetry"),
    **_room(WORKFLOWS, "servelab.search", *["base", "driver", "prior", "prune", "runner", "strategies"]),
    **_room(WORKFLOWS, "servelab.executors", "base", "ray"),
    **_room(
        WORKFLOWS,
        "servelab.tune",
        "driver",
        "flagcheck",
        "options",
        "ordering",
        "plansync",
        "recorder",
        "spread",
    ),
    **_room(
        WORKFLOWS,
        "servelab.deploy",
        *[
            "compose",
            "containers",
            "install",
            "kubernetes",
            "ops",
            "preflight",
            "records",
            "source",
            "spec",
            "systemd",
            "unit_state",
        ],
    ),
    **_room(WORKFLOWS, "servelab.status", "judge", "probes", "service", "stored"),
    **_room(
        WORKFLOWS,
        "servelab.report",
        *[
            "data",
            "figures",
            "host",
            "html",
            "markdown",
            "model",
            "pareto",
            "plots",
            "runreport",
            "search",
            "startup",
            "text",
            "top",
        ],
    ),
    # 6. the agent: the host-side half, on top of every room whose operations it runs
    **_room(
        AGENT,
        "servelab.agent",
        "__main__",
        "ops_bench",
        "ops_core",
        "ops_deploy",
        "ops_logs",
        "ops_observe",
        "registry",
        "serve",
    ),
    # 7. fronts
    "servelab.__main__": FRONTS,
    **_room(
        FRONTS,
        "servelab.cli",
        *[
            "aio",
            "args",
            "bench",
            "benchviews",
            "calibrate",
            "costs",
            "db",
            "deploy",
            "logs",
            "main",
            "mcp",
            "output",
            "plan",
            "plan_docs",
            "predict",
            "remote",
            "report",
            "runs",
            "sim",
            "status",
            "tune",
            "ui",
            "verify",
        ],
    ),
    **_room(
        FRONTS,
        "servelab.mcp",
        *[
            "base",
            "models",
            "progress",
            "server",
            "studies",
            "tools_deploy",
            "tools_measure",
            "tools_observe",
            "tools_plan",
            "tools_predict",
            "tools_study",
        ],
    ),
    **_room(FRONTS, "servelab.ui", "pages", "server"),
}

# Beyond the layers: rooms that must not know each other although the layers would let them (a sibling on
# the same layer, or a room below that is not theirs to use). A room on the left imports none on the right.
APART: dict[str, tuple[str, ...]] = {
    # the data contract: nothing of ours but errors, paths, redact, energy (its LevelEnergy, LevelCost) and
    # jsontypes (JsonObject: what it keeps as stored JSON)
    "servelab.results": ("servelab",),
    "servelab.model": ("servelab.engines", "servelab.sim", "servelab.bench", "servelab.store"),
    "servelab.store": ("servelab.bench", "servelab.model", "servelab.engines", "servelab.sim"),
    "servelab.analyze": ("servelab.store", "servelab.bench"),  # pure, over digests
    # the search proposes and learns; the tuner runs what it proposes (the driver gets it as search.runner's
    # TrialRunner protocol)
    "servelab.search": (
        "servelab.bench",
        "servelab.engines",
        "servelab.executors",
        "servelab.trial",
        "servelab.tune",
    ),
    "servelab.executors": ("servelab.bench", "servelab.trial", "servelab.tune"),
    "servelab.trial": ("servelab.tune", "servelab.deploy"),  # tune and deploy import the one trial pipeline
    "servelab.tune": ("servelab.deploy",),
    # a front beside the CLI: it runs the commands as children and reads the store, never runs a study in
    # its own process (a study's driver is a `servelab tune` child holding the lease)
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
    "servelab.ui": ("servelab.cli",),
}
APART_ALLOWED = {
    "servelab.errors",
    "servelab.paths",
    "servelab.redact",
    "servelab.energy",
    "servelab.jsontypes",
}

# (importer, imported) pairs that still run up a floor or close a circle, each with why it is not yet fixed.
# The list only shrinks: an entry that neither runs up a floor nor closes a circle any more fails the test.
KNOWN_EXCEPTIONS: dict[tuple[str, str], str] = {}


@dataclass(frozen=True)
class Edge:
    importer: str
    imported: str
    file: str  # relative to the repository (src/servelab/...)
    line: int
    how: str  # "import", "TYPE_CHECKING" or "import_module"

    def where(self) -> str:
        return f"{self.file}:{self.line}"


def _modules(root: Path = SRC) -> dict[str, Path]:
    out = {}
    for p in (root / "servelab").rglob("*.py"):
        parts = p.relative_to(root).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = p
    return out


def _resolve(name: str, mods: Iterable[str]) -> str | None:
    """The module `name` is, or is in (`servelab.x.y.attr` → `servelab.x.y`)."""
    known = set(mods)
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def _imports(tree: ast.AST, mods: dict[str, Path]) -> list[tuple[str, int, str]]:
    """(imported module, line, how) for every import of ours in `tree`, wherever it stands."""
    found: list[tuple[str, int, str]] = []

    def walk(node: ast.AST, how: str) -> None:
        for child in ast.iter_child_nodes(node):
            sub_how = how
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                for n in child.body:
                    walk_one(n, "TYPE_CHECKING")
                for n in child.orelse:
                    walk_one(n, how)
                continue
            walk_one(child, sub_how)

    def walk_one(node: ast.AST, how: str) -> None:
        if (
            isinstance(node, ast.ImportFrom)
            and node.level == 0
            and (node.module or "").startswith("servelab")
        ):
            assert node.module is not None
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                target = sub if sub in mods else _resolve(node.module, mods)
                if target:
                    found.append((target, node.lineno, how))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("servelab") and (target := _resolve(alias.name, mods)):
                    found.append((target, node.lineno, how))
        elif isinstance(node, ast.Call):
            fn = node.func
            name = fn.attr if isinstance(fn, ast.Attribute) else fn.id if isinstance(fn, ast.Name) else ""
            arg = node.args[0] if node.args else None
            if (
                name == "import_module"
                and isinstance(arg, ast.Constant)
                and isinstance(arg.value, str)
                and arg.value.startswith("servelab")
                and (target := _resolve(arg.value, mods))
            ):
                found.append((target, node.lineno, "import_module"))
        walk(node, how)

    walk(tree, "import")
    return found


def _edges(root: Path = SRC) -> list[Edge]:
    """One edge per importer, imported module and line."""
    mods = _modules(root)
    out: dict[tuple[str, str, int], Edge] = {}
    for name, path in sorted(mods.items()):
        for target, line, how in _imports(ast.parse(path.read_text()), mods):
            if target != name and not name.startswith(target + "."):  # a package's own __init__
                out.setdefault(
                    (name, target, line), Edge(name, target, str(path.relative_to(root.parent)), line, how)
                )
    return list(out.values())


def _graph(edges: Iterable[Edge]) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for e in edges:
        graph.setdefault(e.importer, set()).add(e.imported)
    return graph


def _layer_of(edge_end: str) -> str:
    n = LAYERS[edge_end]
    return f"{n} ({LAYER_NAMES[n]})"


def _up_the_floor(edges: list[Edge]) -> list[Edge]:
    return [
        e
        for e in edges
        if e.importer in LAYERS and e.imported in LAYERS and LAYERS[e.imported] > LAYERS[e.importer]
    ]


def _within(name: str, room: str) -> bool:
    return name == room or name.startswith(room + ".")


def _apart(edges: list[Edge]) -> list[Edge]:
    """The imports of a room that APART says must not know the other."""
    return [
        e
        for e in edges
        if e.imported not in APART_ALLOWED
        and any(
            _within(e.importer, room)
            and not _within(e.imported, room)
            and any(_within(e.imported, other) for other in others)
            for room, others in APART.items()
        )
    ]


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components of more than one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                circles.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return circles


def test_every_module_has_a_layer() -> None:
    mods = _modules()
    unplaced = sorted(set(mods) - set(LAYERS))
    assert unplaced == [], f"modules with no layer in tests/unit/test_house.py LAYERS: {unplaced}"
    gone = sorted(set(LAYERS) - set(mods))
    assert gone == [], f"LAYERS names modules that no longer exist: {gone}"


def test_no_import_runs_up_a_floor() -> None:
    wrong = [
        f"{e.where()}: {e.importer} [layer {_layer_of(e.importer)}] imports {e.imported} "
        f"[layer {_layer_of(e.imported)}] ({e.how})"
        for e in _up_the_floor(_edges())
        if (e.importer, e.imported) not in KNOWN_EXCEPTIONS
    ]
    assert wrong == [], "imports up a floor:\n" + "\n".join(wrong)


def test_rooms_kept_apart_do_not_import_each_other() -> None:
    wrong = [
        f"{e.where()}: {e.importer} [layer {_layer_of(e.importer)}] imports {e.imported} "
        f"[layer {_layer_of(e.imported)}] ({e.how}), a room APART keeps it from"
        for e in _apart(_edges())
        if (e.importer, e.imported) not in KNOWN_EXCEPTIONS
    ]
    assert wrong == [], "imports between rooms kept apart:\n" + "\n".join(wrong)


def test_every_known_exception_is_still_needed() -> None:
    """An exception is an import that runs up a floor or between rooms kept apart, or one that closes a
    circle; once it does none of these (or is gone), it leaves the list: the list only shrinks."""
    edges = _edges()
    needed = {(e.importer, e.imported) for e in [*_up_the_floor(edges), *_apart(edges)]}
    for comp in _circles(_graph(edges)):
        inside = set(comp)
        needed |= {(e.importer, e.imported) for e in edges if e.importer in inside and e.imported in inside}
    stale = sorted(set(KNOWN_EXCEPTIONS) - needed)
    assert stale == [], f"no longer up a floor, apart or in a circle: remove from KNOWN_EXCEPTIONS: {stale}"


def test_no_import_circle() -> None:
    edges = [e for e in _edges() if (e.importer, e.imported) not in KNOWN_EXCEPTIONS]
    circles = _circles(_graph(edges))
    detail = []
    for comp in circles:
        inside = set(comp)
        detail.append(
            f"circle of {len(comp)}: "
            + "; ".join(
                f"{e.where()} {e.importer} [{_layer_of(e.importer)}] -> {e.imported} [{_layer_of(e.imported)}]"
                for e in edges
                if e.importer in inside and e.imported in inside
            )
        )
    assert circles == [], "\n".join(detail)


def test_the_checker_counts_every_kind_of_import(tmp_path: Path) -> None:
    """Function-level imports (the way circles hide), TYPE_CHECKING blocks and import_module strings."""
    src = (
        "import importlib\nfrom typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from servelab.b import X\n"
        "def f():\n    from servelab.c import Y\n"
        "def g():\n    return importlib.import_module('servelab.d')\n"
        "def h():\n    from importlib import import_module\n    return import_module('servelab.e.sub')\n"
    )
    mods = {m: tmp_path for m in ("servelab.b", "servelab.c", "servelab.d", "servelab.e")}
    found = {(t, how) for t, _, how in _imports(ast.parse(src), mods)}
    assert found == {
        ("servelab.b", "TYPE_CHECKING"),
        ("servelab.c", "import"),
        ("servelab.d", "import_module"),
        ("servelab.e", "import_module"),
    }


def test_the_checker_sees_a_circle() -> None:
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_the_checker_names_file_line_and_both_layers(tmp_path: Path) -> None:
    """An import up a floor, even by name through import_module, is found with where it stands."""
    pkg = tmp_path / "servelab"
    (pkg / "cli").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "cli" / "__init__.py").write_text("")
    (pkg / "errors.py").write_text(
        "import importlib\n\n\ndef f():\n    importlib.import_module('servelab.cli')\n"
    )
    (up,) = _up_the_floor(_edges(tmp_path))
    assert (up.importer, up.imported, up.line, up.how) == (
        "servelab.errors",
        "servelab.cli",
        5,
        "import_module",
    )
    assert up.where().endswith("servelab/errors.py:5")
    assert (_layer_of(up.importer), _layer_of(up.imported)) == ("0 (contract)", "7 (fronts)")


# ---- untyped data between rooms (issue 30) ----
OPEN_DICT = "dict[str, Any]"
# The count of that text in src only falls: lower it when you type more (it was 608 before issue 30).
OPEN_DICT_CEILING = 66


def _room_of(module: str) -> str:
    """A room is a package or a top-level module under servelab (`servelab.tune.driver` → `servelab.tune`)."""
    return ".".join(module.split(".")[:2])


def _open_signatures(root: Path = SRC) -> list[str]:
    """Functions and methods of layers 3–7 with an open dict in their signature that another room names.

    "Names" means: a module of another room imports the defining module (or a name from it) and uses the
    function's (or its class's) name. A front's own JSON documents stay inside the fronts' rooms, so
    they are not counted unless another room calls them."""
    mods = _modules(root)
    trees = {m: ast.parse(p.read_text()) for m, p in mods.items()}
    importers: dict[str, set[str]] = {}
    for m, tree in trees.items():
        for target, _, _ in _imports(tree, mods):
            importers.setdefault(target, set()).add(m)
    names = {
        m: {n.id for n in ast.walk(t) if isinstance(n, ast.Name)}
        | {n.attr for n in ast.walk(t) if isinstance(n, ast.Attribute)}
        | {a.asname or a.name for n in ast.walk(t) if isinstance(n, ast.ImportFrom) for a in n.names}
        for m, t in trees.items()
    }

    def open_defs(body: list[ast.stmt], cls: str | None) -> Iterable[tuple[str, int]]:
        for n in body:
            if isinstance(n, ast.ClassDef):
                yield from open_defs(n.body, n.name)
            elif isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) and (
                not n.name.startswith("_") or n.name == "__init__"  # a private one stays in its room
            ):
                a = n.args
                anns = [x.annotation for x in a.posonlyargs + a.args + a.kwonlyargs if x.annotation]
                anns += [n.returns] if n.returns else []
                if any(OPEN_DICT in ast.unparse(x) for x in anns):
                    yield (cls or n.name, n.lineno)

    out = []
    for m, tree in trees.items():
        if LAYERS.get(m, FRONTS) < MECHANISMS:
            continue
        for name, line in open_defs(tree.body, None):
            users = [u for u in importers.get(m, ()) if _room_of(u) != _room_of(m) and name in names[u]]
            if users:
                out.append(f"{mods[m]}:{line} {name} (used by {', '.join(sorted(users))})")
    return out


def test_open_dicts_in_src_stay_under_the_ceiling() -> None:
    count = sum(p.read_text().count(OPEN_DICT) for p in _modules().values())
    assert count <= OPEN_DICT_CEILING, (
        f"{count} open dicts in src (ceiling {OPEN_DICT_CEILING}): type the new ones"
    )


def test_no_open_dict_in_a_signature_between_rooms() -> None:
    assert _open_signatures() == []


def test_the_signature_checker_sees_an_open_dict_used_by_another_room(tmp_path: Path) -> None:
    pkg = tmp_path / "servelab"
    (pkg / "bench").mkdir(parents=True)
    (pkg / "tune").mkdir()
    for d in (pkg, pkg / "bench", pkg / "tune"):
        (d / "__init__.py").write_text("")
    (pkg / "bench" / "runner.py").write_text(
        "from typing import Any\n\n\ndef run() -> dict[str, Any]:\n    return {}\n\n\n"
        "def quiet() -> dict[str, Any]:\n    return {}\n"
    )
    (pkg / "tune" / "driver.py").write_text("from servelab.bench.runner import run\n\nrun()\n")
    (found,) = _open_signatures(tmp_path)
    assert "runner.py:4 run (used by servelab.tune.driver)" in found


def test_no_source_file_over_700_lines() -> None:
    """A file past 700 lines mixes concepts (issue 30 split plan.py, lifecycle.py, tune.py ... on that line)."""
    long = {str(p): n for p in _modules().values() if (n := len(p.read_text().splitlines())) > 700}
    assert long == {}
