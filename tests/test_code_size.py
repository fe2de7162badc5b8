"""The style's limits, checked: a module holds one concern in at most 600 lines (the four parallel
models excepted: their diff against each other is their review), a function at most 80."""

import ast
import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PORTS = {"impls/numpy_vit.py", "impls/torch_vit.py", "impls/mlx_vit.py", "impls/jax_vit.py"}
VENDORED = ("conformance/examples/vendor/",)  # third-party files kept as published


def sources():
    """The project's Python files: hidden folders (a virtual environment in the checkout, as CI's
    is) and build/ are not walked, only passed over."""
    found = []
    for folder, dirs, files in os.walk(ROOT):
        rel_folder = Path(folder).relative_to(ROOT).as_posix()
        dirs[:] = [d for d in dirs if not d.startswith(".") and (rel_folder, d) != (".", "build")]
        found += [f"{rel_folder}/{f}".removeprefix("./") for f in files if f.endswith(".py")]
    for rel in sorted(found):
        if not rel.startswith(VENDORED):
            yield rel, (ROOT / rel).read_text()


def too_long(text: str, limit: int = 80) -> list[str]:
    tree = ast.parse(text)
    return [
        f"{n.name} ({n.end_lineno - n.lineno + 1} lines)"
        for n in ast.walk(tree)
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.end_lineno - n.lineno + 1 > limit
    ]


def test_no_module_over_600_lines_but_the_four_models():
    long = {rel: text.count("\n") for rel, text in sources() if rel not in PORTS and text.count("\n") > 600}
    assert not long, long


def test_no_function_over_80_lines():
    long = {rel: found for rel, text in sources() if (found := too_long(text))}
    assert not long, long


def test_the_function_limit_names_a_function_of_81_lines_and_no_shorter_one():
    """The companion: a function of 81 lines is named, one of 80 is not."""
    body = "".join(f"    x{i} = {i}\n" for i in range(79))
    assert too_long(f"def f():\n{body}    return 0\n") == ["f (81 lines)"]
    assert too_long(f"def f():\n{body}") == []
