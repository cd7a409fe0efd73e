"""The package's structure: the engine is a boundary the rest of ort_hf imports through."""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "ort_hf"


def _imports(path: Path) -> list[str]:
    """Every ort_hf module ``path`` imports, at module level or inside functions, as dotted names."""
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
        elif isinstance(node, ast.Import):
            found.extend(alias.name for alias in node.names)
    return [name.removesuffix(".__init__") for name in found if name.startswith("ort_hf")]


def test_nothing_outside_the_engine_reaches_behind_its_boundary():
    reaching = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if PACKAGE / "engine" in path.parents:
            continue
        reaching += [f"{path.relative_to(PACKAGE.parent)} imports {name}" for name in _imports(path)
                     if name.startswith("ort_hf.engine.")]
    assert not reaching, "import from ort_hf.engine instead:\n" + "\n".join(reaching)
