"""The docs cannot go stale: generated tables equal what the code gives, and CI runs README's
commands exactly."""

import re
import shutil

from conformance.commands.docs import ROOT, stale_blocks

README = ROOT / "README.md"
CI = ROOT / ".ci" / "run"


def readme_commands(text: str) -> list[str]:
    """The commands of README's first bash block (install + main job, then the tests)."""
    block = re.search(r"```bash\n(.*?)```", text, re.S).group(1)
    return [line.strip() for line in block.splitlines() if line.strip() and not line.startswith("#")]


def commands_missing_from_ci(readme: str, ci: str) -> list[str]:
    """Each README command, split at '&&', that .ci/run does not run as a line of its own."""
    ci_lines = {line.strip() for line in ci.splitlines()}
    parts = [p.strip() for cmd in readme_commands(readme) for p in cmd.split("&&")]
    # .ci/run names its venv .venv-ci (so a developer's .venv is left alone) and sources it.
    parts = [
        p.replace("python -m venv .venv", "python3 -m venv .venv-ci").replace(
            ". .venv/bin/activate", ". .venv-ci/bin/activate"
        )
        for p in parts
    ]
    parts = [p.replace("pip install", "python -m pip install --quiet") if p.startswith("pip ") else p for p in parts]
    return [p for p in parts if p not in ci_lines]


def test_committed_docs_tables_equal_what_the_code_generates():
    stale = stale_blocks()
    assert not stale, f"stale generated tables {stale}: run python -m conformance docs"


def test_docs_check_notices_a_hand_edited_table(tmp_path):
    docs = tmp_path / "docs"
    shutil.copytree(ROOT / "docs", docs)
    zoo = docs / "zoo.md"
    zoo.write_text(zoo.read_text().replace("| `mlx_shared_layernorm` |", "| `mlx_shared_layer_norm` |", 1))
    assert stale_blocks(docs) == ["docs/zoo.md: zoo"]


def test_ci_runs_the_readme_commands_unchanged():
    assert len(readme_commands(README.read_text())) == 2
    missing = commands_missing_from_ci(README.read_text(), CI.read_text())
    assert not missing, f".ci/run does not run README's {missing}"


def test_ci_check_notices_a_readme_command_that_ci_does_not_run():
    readme = README.read_text().replace("pytest -n auto", "pytest -n 4 -x", 1)
    assert commands_missing_from_ci(readme, CI.read_text()) == ["pytest -n 4 -x"]


def test_readme_is_a_two_minute_read():
    lines = README.read_text().splitlines()
    assert len(lines) <= 160, f"README.md has {len(lines)} lines; reference material belongs in docs/"
    first_screen = "\n".join(lines[:40])
    assert "pip install" in first_screen and "pytest" in first_screen
    for link in re.findall(r"\]\(((?:docs|conformance)/[^)#]+)", README.read_text()):
        assert (ROOT / link).exists(), f"README links to missing {link}"


def readme_zoo_counts(text: str) -> tuple[int, int]:
    m = re.search(r"runs the (\d+) mutant ports of the \[bug zoo\]\(docs/zoo.md\) \((\d+) of them backward\)", text)
    return int(m.group(1)), int(m.group(2))


def test_readme_counts_the_zoo_as_the_catalogue_does():
    from conformance.zoo import MUTANTS

    backward = sum(1 for m in MUTANTS.values() if m.level == "gradient")
    assert readme_zoo_counts(README.read_text()) == (len(MUTANTS), backward)
    off_by_one = README.read_text().replace(f"the {len(MUTANTS)} mutant", f"the {len(MUTANTS) - 1} mutant")
    assert readme_zoo_counts(off_by_one) != (len(MUTANTS), backward)


def modules_missing_from_layout_table(table: str) -> list[str]:
    """Library modules (not tests, examples or data) that docs/layouts.md's repository table
    names neither by path nor by file name nor through their package's directory."""
    missing = []
    for package in ("impls", "weights", "conformance"):
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if "/tests/" in rel or "/examples/" in rel or path.name in ("__init__.py", "__main__.py"):
                continue
            parts = rel.split("/")
            suffixes = ["/".join(parts[k:]) for k in range(len(parts))]  # conformance/capture/plan.py, ..., plan.py
            folders = ["/".join(parts[k:-1]) + "/" for k in range(1, len(parts) - 1)]  # capture/
            named = any(f"`{name}`" in table for name in suffixes + folders)
            if not named:
                missing.append(rel)
    return missing


def test_the_repository_table_names_every_library_module():
    table = (ROOT / "docs" / "layouts.md").read_text().split("## Repository layout", 1)[1]
    assert modules_missing_from_layout_table(table) == []
    assert modules_missing_from_layout_table(table.replace("`builtin.py`", "`built-in`")) == ["conformance/builtin.py"]
