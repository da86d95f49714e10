"""The package import graph: no cycles between modules, and no room imports a room above it.

The graph is read from the source (ast), so nothing is imported and every `import` counts:
module level, inside functions and under `if TYPE_CHECKING:` alike, because each is a
dependency a reader has to follow. A package's `__init__` is a node of its own.
ROOMS is the floor plan of docs/architecture.md's "How it fits together" Floors table; a test keeps the two in step.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("pretrain", "megatron_ext", "data_prep")

# (floor, room, module prefixes). A module belongs to the room with the longest matching prefix; a prefix
# ending in "$" is one module only (the `pretrain` package itself, so that a new subpackage is not housed by accident).
# An import between two rooms must go to a strictly lower floor; rooms on one floor are independent.
# A room is whole folders or top-level modules: a module carved out of a folder that another room holds would let
# the modules below that folder import it (lazily or not) while the rest of its folder sits above them, which is how
# the trainer reached the task suite and evaluation reached experiments before issue 43. The one carve-out:
CARVED_OUT = {
    "megatron_ext.import_shims": "the import shims data_prep needs too; no Megatron extension code",
    "megatron_ext.cpu_compat": "the CPU patches beside the import shims; no Megatron extension code",
    "megatron_ext.versions": "the tested megatron-core range, read by data_prep's import shim",
}
ROOMS: list[tuple[int, str, tuple[str, ...]]] = [
    (-1, "Megatron compat", ("megatron_ext.import_shims", "megatron_ext.cpu_compat", "megatron_ext.versions")),
    (-1, "command-line grammar", ("pretrain.cli",)),
    (-1, "write faults", ("pretrain.faults",)),
    (-1, "process locks", ("pretrain.locks",)),
    (0, "positions", ("megatron_ext.positions",)),
    (0, "data", ("data_prep",)),
    (0, "console", ("pretrain.console",)),
    (1, "megatron extension", ("megatron_ext",)),
    (2, "sizes, methods, run names", ("pretrain.table", "pretrain.naming")),
    (3, "trainer", ("pretrain.trainer",)),
    (4, "hf interop", ("pretrain.hf",)),
    (4, "run discovery", ("pretrain.runs",)),
    (5, "evaluation", ("pretrain.evaluation",)),
    (5, "task suite", ("pretrain.tasks",)),
    (5, "plan", ("pretrain.plan",)),
    (6, "experiments", ("pretrain.experiments",)),
    (6, "entry points", ("pretrain$", "pretrain.__main__", "pretrain.preflight", "pretrain.selfcheck",
                         "pretrain.selfcheck_reaches")),
]


def _modules() -> dict[str, Path]:
    modules = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join(parts)] = path
    return modules


def _targets(node: ast.Import | ast.ImportFrom, module: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """Our modules that one import statement names (`from pkg import sub` names the submodule)."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        base = node.module or ""
        if node.level:
            package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
            package = package[: len(package) - (node.level - 1)]
            base = ".".join(package + ([node.module] if node.module else []))
        names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]
    found = set()
    for name in names:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        if name and name != module:
            found.add(name)
    return found


def import_graph() -> dict[str, set[str]]:
    """module -> the modules of ours it imports anywhere in its source."""
    modules = _modules()
    graph = {}
    for module, path in modules.items():
        edges: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                edges |= _targets(node, module, path, modules)
        graph[module] = edges
    return graph


def room_of(module: str) -> tuple[int, str] | None:
    """(floor, room) of a module, or None when no room claims it."""
    best = None
    for floor, room, prefixes in ROOMS:
        for prefix in prefixes:
            exact = prefix.endswith("$")
            prefix = prefix.rstrip("$")
            matches = module == prefix or (not exact and module.startswith(prefix + "."))
            if matches and (best is None or len(prefix) > best[0]):
                best = (len(prefix), floor, room)
    return None if best is None else (best[1], best[2])


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle (as a path a -> ... -> a) per strongly connected component with more than one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components = []

    def visit(node: str) -> None:  # Tarjan; the graph is small enough for recursion
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(set(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return [_cycle_through(component, graph) for component in components]


def _cycle_through(component: set[str], graph: dict[str, set[str]]) -> list[str]:
    """A shortest cycle from the component's first module back to itself (breadth first)."""
    start = min(component)
    previous = {start: None}
    queue = [start]
    while queue:
        node = queue.pop(0)
        for target in sorted(graph[node] & component):
            if target == start:
                path = [node]
                while previous[path[-1]] is not None:
                    path.append(previous[path[-1]])
                return [*reversed(path), start]
            if target not in previous:
                previous[target] = node
                queue.append(target)
    raise AssertionError(f"no cycle through {start}")


def test_every_module_has_a_room():
    unplaced = sorted(m for m in import_graph() if room_of(m) is None)
    assert not unplaced, f"modules in no room: {unplaced}; add them to ROOMS here and to docs/architecture.md's room map"


def test_no_module_imports_itself_back_through_others():
    cycles = find_cycles(import_graph())
    assert not cycles, "import cycles:\n" + "\n".join("  " + " -> ".join(cycle) for cycle in cycles)


def test_no_room_imports_a_room_on_its_floor_or_above():
    upward = []
    for module, targets in sorted(import_graph().items()):
        here = room_of(module)
        for target in sorted(targets):
            there = room_of(target)
            if here and there and there[1] != here[1] and there[0] >= here[0]:
                upward.append(f"  {module} (floor {here[0]}, {here[1]}) -> {target} (floor {there[0]}, {there[1]})")
    assert not upward, "imports that do not go down a floor:\n" + "\n".join(upward)


def test_no_room_is_a_module_carved_out_of_another_rooms_folder():
    modules = _modules()
    carved = []
    for floor, room, prefixes in ROOMS:
        for prefix in prefixes:
            if prefix.endswith("$") or prefix not in modules or modules[prefix].name == "__init__.py":
                continue  # the pretrain package itself, or a whole folder
            folder = room_of(prefix.rpartition(".")[0])
            folder_is_claimed = folder is not None and not any(
                p == prefix.rpartition(".")[0] + "$" for _, r, ps in ROOMS if r == folder[1] for p in ps)
            if folder_is_claimed and folder[1] != room and prefix not in CARVED_OUT:
                carved.append(f"  {prefix} (floor {floor}, {room}) inside the folder of {folder[1]} (floor {folder[0]})")
    assert not carved, "modules carved out of another room's folder; move them to a folder of their own:\n" + \
        "\n".join(carved)


def test_an_import_inside_a_function_is_an_edge_like_one_at_module_level():
    source = (ROOT / "pretrain/evaluation/all_runs.py").read_text()
    assert "\n    from pretrain.runs import discover\n" in source  # a lazy import, inside evaluate_all
    assert "pretrain.runs" in import_graph()["pretrain.evaluation.all_runs"]


def test_a_new_subpackage_is_in_no_room_until_it_is_placed():
    assert room_of("pretrain.newpackage.module") is None
    assert room_of("pretrain") == (6, "entry points") and room_of("pretrain.trainer.loop") == (3, "trainer")


def test_the_cycle_finder_reports_a_cycle_as_a_closed_path():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert find_cycles(graph) == [["a", "b", "c", "a"]]


def test_readme_floor_table_lists_the_rooms_of_this_plan():
    import re

    readme = (ROOT / "docs" / "architecture.md").read_text()
    rows = re.findall(r"^\| (-?\d) \| (.+) \|$", readme, re.M)
    assert rows, "docs/architecture.md has no Floors table"
    documented = {(int(floor), path.rstrip("/").removesuffix(".py").replace("/", "."))
                  for floor, cells in rows for path in re.findall(r"`([^`]*/[^`]*)`", cells)}
    planned = {(floor, prefix) for floor, _, prefixes in ROOMS for prefix in prefixes if not prefix.endswith("$")}
    assert documented == planned, (f"only in README: {sorted(documented - planned)}; "
                                   f"only in ROOMS: {sorted(planned - documented)}")
