"""The package's modules form layers: no chain of imports leads from a module back to itself.

Every import of a smoothsk module counts, at module level or inside a
function: an import moved into a function to dodge a cycle leaves the cycle
in place, only deferred to the first call. Importing ``a.b.c`` runs the
``__init__`` of the package ``a.b`` first, so it counts as an import of that
package too, unless ``a.b`` holds the importing module: then its ``__init__``
is already running (the root ``smoothsk``'s, above every module, imports the
estimator). ``from smoothsk import name`` reads a name of the root's
``__init__``, and counts.
"""

import ast
from collections import deque
from pathlib import Path

import smoothsk

PACKAGE = "smoothsk"


def module_names(package_dir, package=PACKAGE):
    """Dotted name -> (source file, whether it is a package ``__init__``) for every module under ``package_dir``."""
    modules = {}
    for path in sorted(Path(package_dir).rglob("*.py")):
        parts = [package, *path.relative_to(package_dir).with_suffix("").parts]
        is_package = parts[-1] == "__init__"
        modules[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    return modules


def imported_modules(node, module, is_package, modules, package=PACKAGE):
    """The modules of ``modules`` that the import statement ``node`` in ``module`` runs."""
    if isinstance(node, ast.Import):
        targets = [alias.name for alias in node.names]
    elif node.level:  # relative: from the module's own package, one level up per extra dot
        base = module.split(".")[:len(module.split(".")) - node.level + is_package]
        targets = [".".join(base + (node.module.split(".") if node.module else []))]
    else:
        targets = [node.module]
    found = set()
    for target in targets:
        if not (target == package or target.startswith(package + ".")):
            continue
        if isinstance(node, ast.ImportFrom):  # ``from target import name``: a submodule, or a name of target's
            submodules = {f"{target}.{alias.name}" for alias in node.names} & set(modules)
            found |= submodules
            if len(submodules) < len(node.names):
                found.add(target)
        else:
            found.add(target)
    # Each package above an imported module runs its __init__ first, unless it holds ``module`` (running already).
    running = {".".join(module.split(".")[:end]) for end in range(1, len(module.split(".")) + is_package)}
    for name in list(found):
        parts = name.split(".")
        found |= {".".join(parts[:end]) for end in range(1, len(parts))} - running
    return found & set(modules)


def import_graph(package_dir, package=PACKAGE):
    """Module -> {module it imports: line of its first import there}, for every module of the package."""
    modules = module_names(package_dir, package)
    graph = {}
    for module, (path, is_package) in modules.items():
        edges = {}
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for target in imported_modules(node, module, is_package, modules, package):
                    edges[target] = min(edges.get(target, node.lineno), node.lineno)
        edges.pop(module, None)  # a package's __init__ importing its own submodules runs them, not itself
        graph[module] = edges
    return graph


def reachable(graph, start):
    """Every module an import chain from ``start`` reaches."""
    seen, queue = set(), deque([start])
    while queue:
        for target in graph[queue.popleft()]:
            if target not in seen:
                seen.add(target)
                queue.append(target)
    return seen


def shortest_cycle(graph, start):
    """A shortest import chain from ``start`` back to itself, as a list of modules ending in ``start``."""
    previous, queue = {start: None}, deque([start])
    while queue:
        module = queue.popleft()
        for target in sorted(graph[module]):
            if target == start:
                chain = [start]
                while module is not None:
                    chain.append(module)
                    module = previous[module]
                return chain[::-1]
            if target not in previous:
                previous[target] = module
                queue.append(target)
    return None


def cycles(graph):
    """The strongly connected groups of modules (each one's modules import one another in a chain), sorted."""
    within = {module: reachable(graph, module) for module in graph}
    groups = {frozenset(other for other in within[module] if module in within[other])
              for module in graph if module in within[module]}
    return sorted(sorted(group) for group in groups)


def describe(graph, group):
    """A group of modules in a cycle: one shortest cycle through it, then every import within the group."""
    chain = shortest_cycle(graph, group[0])
    lines = [f"{len(group)} modules import one another, e.g. {' -> '.join(chain)}; their imports of one another:"]
    lines += [f"  {module} (line {line}) imports {target}"
              for module in group for target, line in sorted(graph[module].items()) if target in group]
    return "\n".join(lines)


def test_the_package_imports_without_cycles():
    graph = import_graph(Path(smoothsk.__file__).parent)
    assert "smoothsk.estimator" in graph and graph["smoothsk.estimator"]
    found = cycles(graph)
    assert not found, "import cycles:\n" + "\n\n".join(describe(graph, group) for group in found)


def test_a_cycle_through_a_function_local_import_is_found(tmp_path):
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("from .top import Top\n")
    (package / "top.py").write_text("from .sub.low import low\n\nclass Top:\n    pass\n")
    (package / "sub" / "__init__.py").write_text("")
    (package / "sub" / "low.py").write_text("def low():\n    from ..top import Top\n    return Top\n")
    (package / "other.py").write_text("from . import top\n")
    graph = import_graph(package, "pkg")
    assert graph["pkg.other"] == {"pkg.top": 1}
    assert graph["pkg.sub.low"] == {"pkg.top": 2}
    assert cycles(graph) == [["pkg.sub.low", "pkg.top"]]
    assert describe(graph, ["pkg.sub.low", "pkg.top"]).splitlines() == [
        "2 modules import one another, e.g. pkg.sub.low -> pkg.top -> pkg.sub.low; their imports of one another:",
        "  pkg.sub.low (line 2) imports pkg.top",
        "  pkg.top (line 1) imports pkg.sub.low"]
