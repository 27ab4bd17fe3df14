"""The library's shape, read from its imports: no circle among its modules, and the launch code one way down."""

import ast
from pathlib import Path

import networkx as nx

PACKAGE = Path(__file__).resolve().parent.parent / "sparkgate"


def imports() -> nx.DiGraph:
    """module -> the sparkgate modules it imports (at any depth in the file, lazily or not)."""
    graph = nx.DiGraph()
    for path in PACKAGE.rglob("*.py"):
        name = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts).removesuffix(".__init__")
        graph.add_node(name)
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                target = f"{base}.{node.module}" if node.module else base
                for alias in node.names:  # `from . import embedded` imports a module
                    graph.add_edge(name, f"{target}.{alias.name}" if not node.module else target)
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("sparkgate"):
                graph.add_edge(name, node.module)
    return nx.DiGraph((a, b) for a, b in graph.edges if b in graph and a != b)


def test_no_module_of_the_library_imports_itself_back():
    cycles = list(nx.simple_cycles(imports()))
    assert cycles == [], f"import circles: {cycles}"


def test_the_launch_code_imports_point_down_only():
    """base below everything in launch/; the lifecycle on top; nothing below imports the lifecycle or the plugin."""
    graph = imports()
    order = ["base", "container_spec", "docker_engine", "process_launcher", "docker_launcher", "lifecycle"]
    rank = {f"sparkgate.launch.{m}": i for i, m in enumerate(order)}
    up = [(a, b) for a, b in graph.edges if a in rank and b in rank and rank[b] >= rank[a]]
    assert up == [], f"imports that climb back up: {up}"
    for module in graph:
        if not module.startswith(("sparkgate.launch", "sparkgate.plugin", "sparkgate.cli")):
            assert not any(b.startswith("sparkgate.launch") and b != "sparkgate.launch.base"
                           for b in graph.successors(module)), f"{module} reaches above itself into the launchers"
