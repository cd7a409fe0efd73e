"""The package's structure: the engine is a boundary the rest of ort_hf imports through."""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "ort_hf"


def _imports(path: Path, with_names: bool = False) -> list[str]:
    """Every ort_hf module ``path`` imports, at module level or inside functions, as dotted names;
    ``with_names``: also ``pkg.name`` for each ``from pkg import name`` (a module, or not)."""
    module = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = package.split(".")
            if node.level:
                base = base[: len(base) - node.level + 1]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            found.append(name)
            if with_names:
                found.extend(f"{name}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            found.extend(alias.name for alias in node.names)
    return [name.removesuffix(".__init__") for name in found if name.startswith("ort_hf")]


def _engine_submodules() -> set[str]:
    engine = PACKAGE / "engine"
    return {
        "ort_hf.engine." + ".".join(p.relative_to(engine).with_suffix("").parts).removesuffix(".__init__")
        for p in engine.rglob("*.py")
        if p.name != "__init__.py" or p.parent != engine
    }


def test_nothing_outside_the_engine_reaches_behind_its_boundary():
    """Neither ``from ort_hf.engine.x import y`` nor ``from ort_hf.engine import x`` (a submodule)."""
    submodules = _engine_submodules()
    reaching = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if PACKAGE / "engine" in path.parents:
            continue
        reaching += [
            f"{path.relative_to(PACKAGE.parent)} imports {name}"
            for name in _imports(path, with_names=True)
            if name in submodules or any(name.startswith(m + ".") for m in submodules)
        ]
    assert not reaching, "import from ort_hf.engine instead:\n" + "\n".join(reaching)


def _module_name(path: Path) -> str:
    name = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return name.removesuffix(".__init__")


def test_no_import_cycle_in_the_package():
    """Between ort_hf's modules, function-level imports included (a package's own __init__ aside:
    importing ``pkg.mod`` runs ``pkg/__init__`` first by Python's rules, which is not a cycle of ours)."""
    modules = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph = {}
    for name, path in modules.items():
        targets = set()
        for imported in _imports(path, with_names=True):
            while imported and imported not in modules:  # `from pkg import name`: name is not a module
                imported = imported.rpartition(".")[0]
            if imported and imported != name and not name.startswith(imported + "."):
                targets.add(imported)
        graph[name] = targets
    cycles, state = [], {}

    def visit(node, stack):
        state[node] = "open"
        for target in sorted(graph[node]):
            if state.get(target) == "open":
                cycles.append(" -> ".join(stack[stack.index(target) :] + [target]))
            elif target not in state:
                visit(target, stack + [target])
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def test_only_ort_hf_trl_imports_trl():
    """TRL knowledge lives in ort_hf/trl/: no other module imports ``trl`` (at module level or in functions)."""
    importing = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if PACKAGE / "trl" in path.parents:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [node.module or ""]
                if isinstance(node, ast.ImportFrom) and not node.level
                else [alias.name for alias in node.names]
                if isinstance(node, ast.Import)
                else []
            )
            importing += [
                f"{path.relative_to(PACKAGE.parent)} imports {n}" for n in names if n == "trl" or n.startswith("trl.")
            ]
    assert not importing, "\n".join(importing)
