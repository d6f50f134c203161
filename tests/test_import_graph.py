"""The package's modules import each other without cycles (function-level imports included), so that each module
can be read, tested and loaded on its own."""

import ast
from pathlib import Path

import hf_headattn

PACKAGE = Path(hf_headattn.__file__).parent


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path, modules: set[str]) -> set[str]:
    """The package's modules that `path` imports anywhere in its body (relative or absolute)."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            # `from . import x` imports submodule x; the package itself only as its (lazy) __init__
            candidates = [base] * bool(node.module) + [f"{base}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Import):
            candidates = [alias.name for alias in node.names]
        else:
            continue
        found |= {candidate for candidate in candidates if candidate in modules and candidate != name}
    return found


def import_graph() -> dict[str, set[str]]:
    paths = [path for path in PACKAGE.rglob("*.py") if "evaluate_modules" not in path.parts]
    modules = {module_name(path) for path in paths}
    # a package's __init__ that imports lazily (hf_headattn/__init__.py) names submodules in strings, not imports
    return {module_name(path): imported_modules(path, modules) for path in paths}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    visiting, done = [], set()

    def visit(node):
        if node in visiting:
            return visiting[visiting.index(node):] + [node]
        if node in done:
            return None
        visiting.append(node)
        for neighbour in sorted(graph.get(node, ())):
            if cycle := visit(neighbour):
                return cycle
        visiting.pop()
        done.add(node)
        return None

    for node in sorted(graph):
        if cycle := visit(node):
            return cycle
    return None


def test_no_module_of_the_package_imports_itself_through_others():
    graph = import_graph()
    assert "hf_headattn.translation" in graph and "hf_headattn.runtime.modeling_headattn" in graph
    assert "hf_headattn.metrics" in graph["hf_headattn.training.trainer"]  # function-level and module-level imports count
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_a_cycle_is_found_when_there_is_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None
