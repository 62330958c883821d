"""The package's shape, read from its source: its modules import one another without a circle (a module that
needs another's names imports it, never the other way round as well, not even inside a function), and
`DistributedRun` is called as `Run` is (the arguments they share at the same positions, its own after them by
keyword)."""

import ast
import inspect

import pytest

from scripts import REPO

PACKAGE = REPO / "ppolab"


def package_imports(module: str, source: str) -> set[str]:
    """The package's modules that `source` (the module `module`, `ppolab.x`) imports anywhere in it: at the top,
    inside a function or under a condition, `import ppolab.y`, `from ppolab.y import z`, `from ppolab import y`
    and their relative forms."""
    modules = {f"ppolab.{path.stem}" for path in PACKAGE.glob("*.py") if path.stem != "__init__"}
    is_package = module == "ppolab"
    imported = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            imported.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: from the package itself (an __init__) or from the module's package
                base = "ppolab" if node.level == 1 or is_package else ""
                name = f"{base}.{node.module}" if node.module else base
            else:
                name = node.module
            imported.add(name)
            imported.update(f"{name}.{alias.name}" for alias in node.names)  # `from ppolab import checks`
    return {name for name in imported if name in modules} - {module}


def import_graph(sources: dict[str, str]) -> dict[str, set[str]]:
    """module -> the package's modules it imports, of the package's submodules (the package's __init__ imports
    its modules to offer their names: not an edge of a circle)."""
    return {module: package_imports(module, source) for module, source in sources.items() if module != "ppolab"}


def a_circle(graph: dict[str, set[str]]) -> list[str] | None:
    """One circle of imports in `graph` (a -> b -> ... -> a), or None."""
    done, path = set(), []

    def visit(module):
        if module in path:
            return path[path.index(module) :] + [module]
        if module in done:
            return None
        path.append(module)
        for imported in sorted(graph.get(module, ())):
            circle = visit(imported)
            if circle:
                return circle
        path.pop()
        done.add(module)
        return None

    for module in sorted(graph):
        circle = visit(module)
        if circle:
            return circle
    return None


def package_sources() -> dict[str, str]:
    return {
        "ppolab" if path.stem == "__init__" else f"ppolab.{path.stem}": path.read_text()
        for path in sorted(PACKAGE.glob("*.py"))
    }


def test_the_package_has_no_import_circle():
    """Every module can be read (and imported) after the modules it imports: none of them imports it back."""
    graph = import_graph(package_sources())
    assert graph["ppolab.checkpoints"] >= {"ppolab.checks"}  # the graph is read: an edge every version has
    assert a_circle(graph) is None, " -> ".join(a_circle(graph))


def test_the_circle_check_sees_an_import_inside_a_function():
    """The check itself: a module that imports another inside a function, which imports it back at the top."""
    sources = package_sources()
    sources["ppolab.checks"] += "\n\ndef late():\n    from ppolab.environments import env_module\n"
    assert a_circle(import_graph(sources)) == ["ppolab.checks", "ppolab.environments", "ppolab.checks"]
    sources["ppolab.stops"] = "from ppolab import checks\nfrom . import run\n"
    assert package_imports("ppolab.stops", sources["ppolab.stops"]) == {"ppolab.checks", "ppolab.run"}


# DistributedRun's methods with their signatures as Run's: the arguments they share at the same positions
METHODS = ["__init__", "start", "iteration", "evaluate_if_due", "checkpoint_if_due", "finish"]


@pytest.mark.parametrize("method", METHODS)
def test_distributed_run_is_called_as_run_is(method):
    """What a script passes to `run.<method>` means the same with either class: the positional parameters of
    DistributedRun's method are Run's, in Run's order, and whatever else it takes is keyword-only."""
    from ppolab.distributed import DistributedRun
    from ppolab.run import Run

    def positional(cls):
        parameters = inspect.signature(getattr(cls, method)).parameters.values()
        return [p.name for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL)]

    assert getattr(DistributedRun, method) is not getattr(Run, method)  # its own, which this compares
    assert positional(DistributedRun) == positional(Run)
