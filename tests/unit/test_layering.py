"""The package layering holds: no module imports a package above its own, and no two packages import each other.

The layers are the ones docs/architecture.md draws (bottom to top). Every import counts, including
the ones inside functions: a lazy import upward is still a dependency upward, it only hides it.
Packages in one layer may use each other, as long as the graph among them has no cycle.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import vlmserve

PACKAGE_ROOT = Path(vlmserve.__file__).parent

# Bottom to top. A name is a top-level module (without .py) or a sub-package of src/vlmserve.
LAYERS: list[tuple[str, set[str]]] = [
    (
        "foundation",
        {
            "__init__",
            "errors",
            "paths",
            "vllm_flags",
            "vllm_names",
            "async_tasks",
            "routing",
            "quiet_gc",
            "bounded_read",
            "http1",
            "json_types",
            "prometheus_text",
        },
    ),
    ("vision", {"vision"}),
    ("media", {"media"}),
    ("discovery", {"discovery"}),
    ("spec", {"spec", "autoscale"}),
    ("recipes", {"recipes"}),
    ("results", {"results"}),
    ("sched", {"sched"}),
    ("hardware", {"hardware"}),
    ("engines", {"engines"}),
    ("capabilities", {"gateway", "bench", "batch", "plan", "observe", "export", "interop"}),
    ("deploy", {"deploy"}),
    ("orchestration", {"sweep", "report", "demo", "tune"}),
    ("cli", {"cli", "__main__"}),
]
LAYER_OF: dict[str, int] = {name: rank for rank, (_, names) in enumerate(LAYERS) for name in names}


def _unit_of(module_path: Path) -> str:
    """The top-level unit a source file belongs to: its sub-package, or its own module name."""
    relative = module_path.relative_to(PACKAGE_ROOT)
    return relative.parts[0] if len(relative.parts) > 1 else relative.stem


def _imported_units(module_path: Path) -> set[str]:
    """Every vlmserve unit the file imports (absolute or relative, top level or inside functions)."""
    own = ["vlmserve", *module_path.relative_to(PACKAGE_ROOT).with_suffix("").parts]
    if module_path.name == "__init__.py":
        own = own[:-1]
        own.append("__init__")
    found: set[str] = set()
    for node in ast.walk(ast.parse(module_path.read_text(), filename=str(module_path))):
        names: list[str] = []
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = own[: len(own) - node.level]
                names.append(".".join(base + ([node.module] if node.module else [])))
            elif node.module:
                names.append(node.module)
            if names and names[0] == "vlmserve":  # `from vlmserve import x`: x is the unit
                names = [f"vlmserve.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        for name in names:
            parts = name.split(".")
            if parts[0] == "vlmserve":
                found.add(parts[1] if len(parts) > 1 else "__init__")
    return found


def _package_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = defaultdict(set)
    for path in PACKAGE_ROOT.rglob("*.py"):
        unit = _unit_of(path)
        for target in _imported_units(path):
            if target != unit:
                graph[unit].add(target)
    return graph


def test_every_unit_has_a_layer() -> None:
    units = {_unit_of(path) for path in PACKAGE_ROOT.rglob("*.py")}
    unplaced = sorted(units - LAYER_OF.keys())
    assert not unplaced, f"place these in LAYERS (and docs/architecture.md): {unplaced}"


def test_no_import_reaches_up_a_layer() -> None:
    upward = sorted(
        f"{source} ({LAYERS[LAYER_OF[source]][0]}) imports {target} ({LAYERS[LAYER_OF[target]][0]})"
        for source, targets in _package_graph().items()
        for target in targets
        if source in LAYER_OF and target in LAYER_OF and LAYER_OF[target] > LAYER_OF[source]
    )
    assert not upward, "imports up a layer:\n" + "\n".join(upward)


def test_no_cycle_between_packages() -> None:
    graph = _package_graph()
    cycles: list[str] = []
    state: dict[str, int] = {}  # 1 visiting, 2 done
    trail: list[str] = []

    def visit(unit: str) -> None:
        state[unit] = 1
        trail.append(unit)
        for target in sorted(graph.get(unit, ())):
            if state.get(target) == 1:
                cycles.append(" -> ".join(trail[trail.index(target) :] + [target]))
            elif target not in state:
                visit(target)
        trail.pop()
        state[unit] = 2

    for unit in sorted(graph):
        if unit not in state:
            visit(unit)
    assert not cycles, "package cycles:\n" + "\n".join(cycles)
