"""The import graph of impls, weights and conformance: no cycle (function-local imports
included, and ``if TYPE_CHECKING:`` ones), no library module importing a
test module, and the commands on their own floor: no module below conformance.commands imports
one (``if TYPE_CHECKING:`` imports counted too: a type is a dependency). Read from the source
with ast, so nothing is imported to check it."""

import ast
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("impls", "weights", "conformance")


def _modules() -> dict[str, Path]:
    out = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _runtime_imports(tree: ast.AST, typing: bool = False):
    """Every import statement outside ``if TYPE_CHECKING:`` blocks (``typing``: inside them too)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and getattr(node.test, "id", getattr(node.test, "attr", "")) == "TYPE_CHECKING":
            node.body = node.body if typing else []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node


@cache  # read once: each test takes its own copy
def _graph(typing: bool = False) -> dict[str, frozenset[str]]:
    modules = _modules()
    graph = {m: set() for m in modules}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in _runtime_imports(ast.parse(path.read_text()), typing):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                base = node.module or ""
                if node.level:
                    parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(parts + ([base] if base else []))
                targets = [base] + [f"{base}.{a.name}" for a in node.names]
            for target in targets:
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if target and target != name:
                    graph[name].add(target)
    return {m: frozenset(deps) for m, deps in graph.items()}


def import_graph(typing: bool = False) -> dict[str, set[str]]:
    return {m: set(deps) for m, deps in _graph(typing).items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_no_import_cycle():
    """Function-local imports included, and ``if TYPE_CHECKING:`` ones: a type is a dependency too
    (the adapters read the captured forward through base.Captured, the runs their chain through
    runs.Stages: narrow protocols, not the modules above them)."""
    assert cycles(import_graph()) == [] and cycles(import_graph(typing=True)) == []


def test_the_cycle_check_finds_a_cycle():
    """The companion: a graph with a two-module cycle (hidden in a function, as verify and
    verify_grad's was) is found."""
    graph = import_graph()
    graph["conformance.numerics.compare"] = graph["conformance.numerics.compare"] | {"conformance.verify.forward"}
    assert any({"conformance.numerics.compare", "conformance.verify.forward"} <= set(c) for c in cycles(graph))


COMMANDS = "conformance.commands"  # the floor of every command (python -m conformance's subcommands)


def _in(module: str, packages) -> bool:
    return any(module == p or module.startswith(p + ".") for p in packages)


def crossing(graph: dict[str, set[str]], above, below=None) -> dict[str, list[str]]:
    """The modules of ``below`` (None: every module not in ``above``) that import one of ``above``."""
    found = {
        m: sorted(d for d in deps if _in(d, above))
        for m, deps in graph.items()
        if (not _in(m, above) if below is None else _in(m, below))
    }
    return {m: d for m, d in found.items() if d}


# the commands' floor, the package's entry point (conformance.__main__) its own door
FLOOR = (COMMANDS, "conformance.__main__")
SANDBOX = "conformance.sandbox"  # the port's side: below every check
TESTS = ("conformance.tests",)
# each layering rule: the imports that break it, and the companion's edge (module, import) it must find
LAYERS = {
    "no library module imports a command": (
        lambda graph: crossing(graph, FLOOR),
        ("conformance.zoo.run", "conformance.commands.docs"),  # as zoo.run did before the move
    ),
    "the sandbox imports no check, command, plugin or zoo": (
        lambda graph: crossing(
            graph, ("conformance.verify", COMMANDS, "conformance.plugin", "conformance.zoo"), (SANDBOX,)
        ),
        ("conformance.sandbox.portside", "conformance.verify.report"),  # as portside did before the split
    ),
    "no library module imports a test module": (
        lambda graph: crossing(graph, TESTS),
        ("conformance.verify.forward", "conformance.tests.helpers"),
    ),
}


@pytest.mark.parametrize("rule", LAYERS)
def test_the_layering_holds(rule):
    breaking, _ = LAYERS[rule]
    assert breaking(import_graph(typing=True)) == {}


@pytest.mark.parametrize("rule", LAYERS)
def test_the_layering_check_finds_an_import_across_it(rule):
    """The companion: the graph with one import across the rule's line added is found breaking it."""
    breaking, (module, imported) = LAYERS[rule]
    graph = import_graph(typing=True)
    graph[module] = graph[module] | {imported}
    assert breaking(graph) == {module: [imported]}


_PORT_PROCESS = """
import sys
{before}
import numpy as np
from conformance.verify.cases import Case
from conformance.sandbox.portside import InProcess, default_config, load_port
from impls import get_config
from weights import init_state

make = load_port("forward", "impls.numpy_vit:make")
config = default_config(make)
out, findings = InProcess(make, "oracle", copy=False).forward(
    Case("c", np.zeros((1, 3, *config.img_size), np.float32), init_state(config)), config, "float32"
)
assert findings == [] and "logits" in out, findings
print(sorted(m for m in ("hypothesis", "conformance.numerics.error_model", "conformance.properties") if m in sys.modules))
"""


def _port_process_imports(before: str = "") -> list[str]:
    import subprocess
    import sys

    code = _PORT_PROCESS.format(before=before)
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    return ast.literal_eval(run.stdout.strip())


def test_the_port_s_process_imports_neither_hypothesis_nor_the_error_model():
    """What ``conformance.sandbox.child`` runs for a case (load the port, its default config, a
    forward through ``InProcess``) imports no property, error model or hypothesis: the port's own
    process starts in the time its framework takes. The companion: the properties and the drawn
    inputs, imported, are seen."""
    assert _port_process_imports() == []
    assert _port_process_imports("import conformance.properties, conformance.strategies") == [
        "conformance.numerics.error_model",
        "conformance.properties",
        "hypothesis",
    ]
