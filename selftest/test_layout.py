"""The project's shape, read from its imports (at any depth in a file, lazily or not): no circle among the
library's modules or among the self-tests'; no library import that climbs back up (the launch code one way down,
reached only from the top-level wiring; sparkgate.proc below everything); no self-test importing a test module
or conftest.py; no acceptance check reaching into the plugin's session."""

import ast
from pathlib import Path

import networkx as nx
import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE, SELFTEST, CHECKS = ROOT / "sparkgate", ROOT / "selftest", ROOT / "tests"
# The top-level wiring: the only modules outside launch/ that may import the launchers. A name that is no module
# (yet) imports nothing, so the rule holds whether or not it exists.
WIRING = {"sparkgate.plugin", "sparkgate.session", "sparkgate.cli"}


def _modules(folder: Path) -> dict[str, Path]:
    """Every .py file under `folder`, by its dotted name from the repository root."""
    return {".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__"): path
            for path in sorted(folder.rglob("*.py")) if "__pycache__" not in path.parts}


def _imported(name: str, path: Path, known: set[str]) -> set[str]:
    """The modules among `known` that the module `name` (at `path`) imports: relative and absolute, `import a.b`,
    `from a import b` (b a module or a name in a) and `from . import b`."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            candidates = [[alias.name] for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
            target = (f"{base}.{node.module}" if node.module else base) if node.level else node.module or ""
            candidates = [[f"{target}.{alias.name}", target] for alias in node.names]
        else:
            continue
        found.update(m for names in candidates if (m := _resolve(names, known)) is not None)
    return found - {name}


def _resolve(names: list[str], known: set[str]) -> str | None:
    """The module an import of `names` (the submodule, then the module it is a name of) brings in: the first known,
    else the deepest known package above it (`import a.b.c` imports a.b.c, else a.b, else a)."""
    for dotted in names:
        if dotted in known:
            return dotted
    for dotted in names:
        parts = dotted.split(".")
        for prefix in (".".join(parts[:i]) for i in range(len(parts) - 1, 0, -1)):
            if prefix in known:
                return prefix
    return None


def imports(folder: Path, of: Path | None = None) -> nx.DiGraph:
    """module -> the modules it imports, for every module under `folder`; `of`: the modules imported are those
    under `of` (by default `folder`'s own)."""
    modules = _modules(folder)
    known = set(_modules(of)) if of is not None else set(modules)
    graph = nx.DiGraph()
    graph.add_nodes_from(modules)
    for name, path in modules.items():
        graph.add_edges_from((name, target) for target in _imported(name, path, known))
    return graph


def _edges(edges) -> str:
    return "\n  ".join(f"{a} -> {b}" for a, b in sorted(edges))


def _launch(module: str) -> bool:
    return module == "sparkgate.launch" or module.startswith("sparkgate.launch.")


def _test_module(module: str) -> bool:
    last = module.rpartition(".")[2]
    return last.startswith("test_") or last == "conftest"


def test_no_module_of_the_library_imports_itself_back():
    cycles = sorted(nx.simple_cycles(imports(PACKAGE)))
    assert cycles == [], "import circles among the library's modules:\n  " + "\n  ".join(
        " -> ".join([*c, c[0]]) for c in cycles)


def test_no_self_test_module_imports_itself_back():
    cycles = sorted(nx.simple_cycles(imports(SELFTEST)))
    assert cycles == [], "import circles among the self-test modules:\n  " + "\n  ".join(
        " -> ".join([*c, c[0]]) for c in cycles)


def test_the_launch_code_imports_point_down_only():
    """base below everything in launch/; the lifecycle on top; nothing below imports one above it."""
    order = ["base", "container_spec", "docker_engine", "process_launcher", "docker_launcher", "lifecycle"]
    rank = {f"sparkgate.launch.{m}": i for i, m in enumerate(order)}
    up = [(a, b) for a, b in imports(PACKAGE).edges if a in rank and b in rank and rank[b] >= rank[a]]
    assert up == [], f"imports that climb back up within launch/:\n  {_edges(up)}"


def test_only_the_launch_code_and_the_top_level_wiring_import_the_launchers():
    """The plugin, the session and the CLI wire the launchers in; every other library module is below them."""
    up = [(a, b) for a, b in imports(PACKAGE).edges if _launch(b) and not _launch(a) and a not in WIRING]
    assert up == [], f"library modules that reach above themselves into the launchers:\n  {_edges(up)}"


def test_the_process_utilities_import_nothing_of_the_library():
    """sparkgate.proc is below everything: the launchers, the host lock and the embedded weights all use it."""
    graph = imports(PACKAGE)
    assert "sparkgate.proc" in graph, "no sparkgate/proc.py"
    up = list(graph.out_edges("sparkgate.proc"))
    assert up == [], f"sparkgate.proc imports the library:\n  {_edges(up)}"


def test_no_self_test_module_imports_a_test_module_or_a_conftest():
    """What several self-tests share is selftest/helpers.py's; test modules and conftest.py are imported by
    pytest alone."""
    bad = [(a, b) for a, b in imports(SELFTEST).edges if _test_module(b)]
    assert bad == [], f"self-test modules importing a test module or a conftest.py:\n  {_edges(bad)}"


def test_no_acceptance_check_imports_the_plugin_or_its_session():
    """The checks under tests/ see the run through fixtures, never the plugin's module state."""
    bad = [(a, b) for a, b in imports(CHECKS, of=PACKAGE).edges if b in ("sparkgate.plugin", "sparkgate.session")]
    assert bad == [], f"acceptance checks importing the plugin or its session:\n  {_edges(bad)}"


def test_a_check_that_asks_for_testinfras_host_is_refused_naming_the_fixture_that_is_the_box(pytester):
    """testinfra's `host` is the machine pytest runs on (HOST-MEM-FREE once read the GPU memory of a container there,
    not on the box): a check that asks for it MUST be a usage error that names `target_host`, never a local read."""
    pytester.makepyfile(test_box="def test_reads_the_box(host):\n    host.run('true')\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    assert result.ret != pytest.ExitCode.OK and "1 error" in result.stdout.str(), result.stdout.str()
    result.stdout.fnmatch_lines(["*test_reads_the_box asks for testinfra's `host` fixture, which is the machine pytest "
                                 "runs on, not the box under test: ask for `target_host`*"])
