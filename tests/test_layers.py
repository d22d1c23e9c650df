"""The layers of the package, read from the source (ast; nothing is imported or run).

Every unit of gnn_dist (a subpackage, a top-level module, or one of the folders installed inside it: partition/,
kernels/, benchmarks/) states in its docstring which units it may import, on one line (continued, when long, on
lines indented by four spaces):

    May import: comm, device, kernels, partition

The tests hold the code to those lines: every import between units is one its importer declares (imports inside
functions and literal importlib.import_module targets included), the declared relation has no cycle (so the
units form layers), no two files import each other however indirectly, and docs/architecture.md's table says
what the docstrings say.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# Folders of the repository that install inside gnn_dist (setup.py)
MAPPED = ("partition", "kernels", "benchmarks")
MAY_IMPORT = re.compile(r"^May import: (.+(?:\n    .+)*)$", re.M)  # continued on lines indented by four


def source_files() -> dict[str, Path]:
    """Dotted module name (as installed) -> file."""
    modules = {}
    for package, folder in [("gnn_dist", ROOT / "gnn_dist")] + [(f"gnn_dist.{m}", ROOT / m) for m in MAPPED]:
        for path in folder.rglob("*.py"):
            parts = list(path.relative_to(folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            modules[".".join([package, *parts])] = path
    return modules


MODULES = source_files()


def unit_of(module: str) -> str:
    """gnn_dist.halo.blocks -> halo; gnn_dist.cli -> cli; gnn_dist -> gnn_dist (the package's own __init__)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "gnn_dist"


def unit_file(unit: str) -> Path:
    """The file whose docstring declares a unit's line: a package's __init__, or the module itself."""
    return MODULES["gnn_dist" if unit == "gnn_dist" else f"gnn_dist.{unit}"]


def declared_imports(unit: str) -> set[str] | None:
    """The units `unit` may import, from its docstring; None when it declares anything (the package root)."""
    doc = ast.get_docstring(ast.parse(unit_file(unit).read_text())) or ""
    found = MAY_IMPORT.findall(doc)
    assert len(found) == 1, f"{unit_file(unit).relative_to(ROOT)}: its docstring needs one 'May import: ...' line"
    text = " ".join(found[0].split())
    if text.startswith("anything"):
        return None
    if text == "nothing of gnn_dist":
        return set()
    return {name.strip() for name in text.split(",")}


def resolve(name: str) -> str | None:
    """The module a dotted import name lands in (a name imported from a module belongs to that module)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def imports_of(module: str) -> list[tuple[str, int]]:
    """(module imported, line) for every import statement anywhere in the file and every importlib.import_module
    call with a literal target; relative imports resolved."""
    path = MODULES[module]
    tree = ast.parse(path.read_text())
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            names = [f"{base}.{alias.name}" for alias in node.names]
        elif (isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None)) == "import_module"
              and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            names = [node.args[0].value]
        for name in names:
            if name.split(".")[0] == "gnn_dist":
                target = resolve(name)
                if target is not None and target != module:
                    found.append((target, node.lineno))
    return found


EDGES = {module: imports_of(module) for module in MODULES}
UNITS = sorted({unit_of(m) for m in MODULES})
TABLE = {unit: declared_imports(unit) for unit in UNITS}


def test_every_unit_declares_only_units_that_exist():
    for unit, allowed in TABLE.items():
        if allowed is not None:
            assert allowed <= set(UNITS) - {unit}, f"{unit} declares {sorted(allowed - set(UNITS))}, which are not units"


def test_every_import_between_units_is_one_the_importer_declares():
    wrong = []
    for module, targets in EDGES.items():
        allowed = TABLE[unit_of(module)]
        for target, line in targets:
            if unit_of(target) != unit_of(module) and allowed is not None and unit_of(target) not in allowed:
                wrong.append(f"{MODULES[module].relative_to(ROOT)}:{line} imports {target}: "
                             f"'{unit_of(module)}' may import {', '.join(sorted(allowed)) or 'nothing of gnn_dist'}")
    assert not wrong, "\n".join(wrong)


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan's algorithm, iterative)."""
    index, low, on_stack, stack, found = {}, {}, set(), [], []
    counter = 0
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
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
    return found


def test_the_declared_layers_have_no_cycle():
    declared = {unit: (allowed if allowed is not None else set()) for unit, allowed in TABLE.items()}
    assert not cycles(declared), cycles(declared)


def test_no_two_files_import_each_other_however_indirectly():
    graph = {module: {target for target, _ in targets} for module, targets in EDGES.items()}
    assert not cycles(graph), "import cycles between files: " + "; ".join(" <-> ".join(c) for c in cycles(graph))


def test_the_cycle_finder_finds_a_cycle_and_the_resolver_a_deferred_import():
    # The checks above must be able to fail: a three-file ring and a self-contained tree.
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []
    deferred = [target for target, _ in EDGES["gnn_dist.cli"]]
    assert "gnn_dist.benchmarks.harness" in deferred  # imported inside a function only


def test_only_the_communicator_imports_mpi4py():
    importers = []
    for module, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            if any(name.split(".")[0] == "mpi4py" for name in names):
                importers.append(module)
    # benchmarks/common.py asks which MPI library is installed, for the machine line of its tables
    assert set(importers) - {"gnn_dist.benchmarks.common"} == {"gnn_dist.comm.communicator"}, importers


def test_at_most_twelve_modules_sit_directly_in_gnn_dist():
    top = sorted(p.name for p in (ROOT / "gnn_dist").glob("*.py"))
    assert len(top) <= 12, top


def architecture_table() -> dict[str, set[str] | None]:
    """The rows `| unit | may import |` of docs/architecture.md's layer table."""
    rows = {}
    text = (ROOT / "docs" / "architecture.md").read_text()
    section = text.split("## Which unit may import which", 1)[1].split("\n## ", 1)[0]
    for line in section.splitlines():
        cells = [c.strip().strip("`") for c in line.strip().strip("|").split("|")]
        if len(cells) >= 3 and cells[0] and not set(cells[0]) <= set("-: ") and cells[0] != "unit":
            imports = cells[2]
            rows[cells[0]] = None if imports.startswith("anything") else \
                set() if imports == "nothing of gnn_dist" else {n.strip() for n in imports.split(",")}
    return rows


def test_the_architecture_page_lists_the_layers_the_code_declares():
    assert architecture_table() == TABLE


@pytest.mark.parametrize("unit", [u for u in UNITS if u not in ("gnn_dist", "__main__")])
def test_a_units_declared_imports_are_all_used_or_below_one_it_uses(unit):
    # A declaration wider than the code is allowed only where it names a layer the unit reaches anyway: each
    # declared unit is imported directly, or is below one that is (so the line reads as the unit's place in
    # the layers, not as a wish list).
    allowed = TABLE[unit]
    if allowed is None:
        return
    used = {unit_of(t) for m, targets in EDGES.items() if unit_of(m) == unit for t, _ in targets} - {unit}

    def below(name, seen=()):
        declared = TABLE.get(name) or set()
        return declared | {deeper for d in declared if d not in seen for deeper in below(d, seen + (name,))}

    reachable = used | {deeper for u in used for deeper in below(u)}
    assert allowed <= reachable, f"{unit} declares {sorted(allowed - reachable)} but reaches none of them"
