"""`pytest --port`: the suite runs against a user's port from any directory, through the
pytest11 entry point, beside or instead of the built-in ports."""

import json
import os
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from conformance.tests.helpers import DATA_DIR
from tests.processes import running

DATA = DATA_DIR / "user_ports.py"
MAIN = "test_every_tap_of_every_port_matches_the_oracle"
NORMS = "test_each_layernorm_is_used_where_it_belongs"
TIMM = "test_port_equals_timm_at_every_stage"
GIVEN = ("correct", "shared_norm", "logits_only", "single_config", "single_config_shared_norm")
KINDS = "test_a_packed_or_quantized_port_conforms_on_drawn_configs"
# a correct port of packed batches and a quantized mutant: what the image properties cannot feed or bound
# (the MLX model's packed port: timm's NaFlexVit, conformance.examples.naflex_ports, verifies the same
# way in tests/test_naflex.py, and its process imports torch and timm)
VERIFIED = ("impls.mlx_vit:make_naflex", "conformance.zoo.quantized_mutants:bits_order_reversed")


def run_pytest(cwd, *args, select=f"{MAIN} or {NORMS}", suite=("conformance.tests",), **env_vars):
    env = dict(os.environ, PYTHONPATH=str(cwd), **env_vars)
    env.pop("HYPOTHESIS_PROFILE", None)
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "--pyargs",
        *suite,
        "-p",
        "no:cacheprovider",
        "-p",
        "conformance.quick_exit",  # the report is all these tests read: no teardown after it
        "-q",
        "--hypothesis-profile=zoo",
        *(["-k", select] if select else []),
        *args,
    ]
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    return proc.returncode, proc.stdout + proc.stderr


HAIKU_LIKE = """from conformance.capture import ModelPort

# a stand-in for a Haiku model (capture reads only the class hierarchy, tests/test_module_systems.py)
Transformed = type("Transformed", (), {"__module__": "haiku._src.transform"})
port = ModelPort(lambda config: Transformed(), rename={})
"""


# What conformance.quick_exit has to end, seen at the session's end before it runs: the given ports'
# processes and their directories in TMPDIR
WITNESS = """import json, os

from conformance import plugin


def pytest_sessionfinish(session):
    pids = [r.isolated.proc.pid for r in plugin._REMOTES.values() if r.isolated and r.isolated.proc]
    with open("witness.json", "w") as f:
        json.dump({"pids": pids, "tmp": os.listdir(os.environ["TMPDIR"])}, f)
"""


@pytest.fixture(scope="module")
def given_only(tmp_path_factory):
    """One run from a directory outside the project, of five user ports and no built-in one: two
    of them written for one config (and declaring it), and the timm comparison over presets."""
    d = tmp_path_factory.mktemp("elsewhere")
    shutil.copy(DATA, d / "user_ports.py")
    (d / "haiku_like.py").write_text(HAIKU_LIKE)
    (d / "witness.py").write_text(WITNESS)
    (d / "tmp").mkdir()
    code, out = run_pytest(
        d,
        "-p",
        "witness",
        "--only-given-ports",
        "-rs",
        f"--junitxml={d / 'r.xml'}",
        *[a for p in GIVEN for a in ("--port", f"user_ports:{p}")],
        *("--port", "haiku_like:port"),  # a model the tool cannot judge, beside ports with findings
        *[a for p in VERIFIED for a in ("--port", p)],
        # timm's comparison for the ports written for one config (what the tests below read of it)
        select=f"{MAIN} or {NORMS} or {KINDS} or "
        f"({TIMM} and project_init and single_config and (vit_test_token or vit_test_deep))",
        # the modules that hold them: the others' imports (JAX, transformers) are not this test's
        suite=(
            "conformance.tests.test_model",
            "conformance.tests.test_timm_reference",
            "conformance.tests.test_port_kinds",
        ),
        TMPDIR=str(d / "tmp"),
    )
    outcome = {}
    for case in ET.parse(d / "r.xml").getroot().iter("testcase"):
        status = (
            "failed"
            if case.find("failure") is not None
            else "skipped"
            if case.find("skipped") is not None
            else "passed"
        )
        outcome[case.get("name")] = status
    return d, code, out, outcome


def test_a_correct_user_port_passes_from_another_directory(given_only):
    _, _, out, outcome = given_only
    assert outcome[f"{MAIN}[user_ports:correct]"] == "passed", out
    assert outcome[f"{NORMS}[user_ports:correct]"] == "passed", out


def test_a_broken_user_port_fails_and_the_report_names_port_and_stage(given_only):
    _, code, out, outcome = given_only
    assert code == 1
    assert outcome[f"{MAIN}[user_ports:shared_norm]"] == "failed", out
    assert outcome[f"{NORMS}[user_ports:shared_norm]"] == "failed", out
    assert "[user_ports:shared_norm] norm2 is not LayerNorm(x + attn; norm2 weights)" in out
    assert "first divergent stage: blocks.0.norm2" in out


def test_a_logits_only_port_is_checked_end_to_end_and_tap_properties_are_skipped(given_only):
    _, _, out, outcome = given_only
    assert outcome[f"{MAIN}[user_ports:logits_only]"] == "passed", out
    assert outcome[f"{NORMS}[user_ports:logits_only]"] == "skipped", out
    assert "does not apply to user_ports:logits_only" in out


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_the_run_ends_once_reported_and_leaves_no_port_process_or_directory(given_only):
    """The run above ends at its report (``-p conformance.quick_exit``: no teardown after it) with
    its exit status and JUnit XML (the tests around this one read them); the given ports'
    processes and directories, there at the session's end (the companion: what a quick exit
    without closing them would leave), are gone."""
    d, code, _, outcome = given_only
    witness = json.loads((d / "witness.json").read_text())
    ours = "vit-conformance-"  # (torch and MLX keep caches of their own there)
    assert len(witness["pids"]) >= 6 and len([n for n in witness["tmp"] if n.startswith(ours)]) >= 6
    assert not [pid for pid in witness["pids"] if running(pid)]
    assert not [p.name for p in (d / "tmp").iterdir() if p.name.startswith(ours)]
    assert code == 1 and outcome


def test_only_given_ports_leaves_the_builtin_ones_out(given_only):
    _, _, _, outcome = given_only
    assert {name for name in outcome if not name.startswith((TIMM, KINDS))} == {
        f"{t}[{p}]" for t in (MAIN, NORMS) for p in (*(f"user_ports:{p}" for p in GIVEN), "haiku_like:port")
    }
    assert all(any(f"[{p}" in name for p in ("user_ports:", "haiku_like:port", *VERIFIED)) for name in outcome)


def test_a_port_written_for_one_config_is_judged_on_it_and_others_are_reported_unsupported(given_only):
    """Drawn configs move to the one it declares: the correct port passes, its shared-norm twin
    fails only what concerns the norm; each other preset is a skip naming the option."""
    _, _, out, outcome = given_only
    mine = {name: status for name, status in outcome.items() if "user_ports:single_config" in name}
    assert {n for n, s in mine.items() if s == "failed"} == {
        f"{MAIN}[user_ports:single_config_shared_norm]",
        f"{NORMS}[user_ports:single_config_shared_norm]",
        f"{TIMM}[user_ports:single_config_shared_norm-vit_test_token-project_init]",
    }, out
    assert mine[f"{TIMM}[user_ports:single_config-vit_test_token-project_init]"] == "passed"
    assert mine[f"{MAIN}[user_ports:single_config]"] == mine[f"{NORMS}[user_ports:single_config]"] == "passed"
    assert mine[f"{TIMM}[user_ports:single_config-vit_test_deep-project_init]"] == "skipped"
    assert "config not supported by the port: " in out and "the port supports only vit_test_token" in out


def port_less_tests(suite: Path) -> list[str]:
    """Test functions of a suite that take none of the plugin's port parameters."""
    import ast

    from conformance.plugin import PORT_PARAMS

    out = []
    for path in sorted(suite.glob("test_*.py")):
        for node in ast.parse(path.read_text()).body:
            if (
                isinstance(node, ast.FunctionDef)
                and node.name.startswith("test_")
                and not {a.arg for a in node.args.args} & set(PORT_PARAMS)
            ):
                out.append(f"{path.name}::{node.name}")
    return out


def test_the_shipped_suite_holds_only_tests_of_ports(tmp_path):
    """--only-given-ports runs exactly the tests about the given ports because every test the
    package ships judges a port (the project's own tests are in tests/); the companion: a test
    that takes no port is named."""
    import conformance.tests

    suite = Path(conformance.tests.__file__).parent
    assert port_less_tests(suite) == []
    (tmp_path / "test_x.py").write_text("def test_config_round_trips():\n    pass\n")
    assert port_less_tests(tmp_path) == ["test_x.py::test_config_round_trips"]


def test_given_ports_run_beside_the_builtin_ones_by_default():
    """The parametrisation hook on a stand-in metafunc: the built-in ports, then the given ones;
    only the given ones with --only-given-ports (the run above shows it from another directory)."""
    from types import SimpleNamespace

    from conformance.plugin import pytest_generate_tests

    def ports(only):
        seen = {}
        option = SimpleNamespace(
            only_given_ports=only,
            port=["user_ports:correct"],
            attention_port=["user_ports:a"],
            grad_port=["user_ports:g"],
        )
        metafunc = SimpleNamespace(
            fixturenames=["port", "attention_path", "grad_port"],
            config=SimpleNamespace(option=option),
            parametrize=lambda name, values, ids: seen.__setitem__(name, values),
        )
        pytest_generate_tests(metafunc)
        return seen

    assert ports(False) == {
        "port": ["torch", "mlx", "jax", "user_ports:correct"],
        "attention_path": ["torch", "torch+fused", "mlx", "mlx+fused", "jax", "jax+fused", "user_ports:a"],
        "grad_port": ["torch", "mlx", "jax", "user_ports:g"],
    }
    assert ports(True) == {
        "port": ["user_ports:correct"],
        "attention_path": ["user_ports:a"],
        "grad_port": ["user_ports:g"],
    }


def test_the_builtin_jax_port_draws_its_share_of_cases_and_every_other_port_all():
    """helpers.drawn: in the ci profile the built-in JAX port draws 1/JAX_SHARE of a property's
    cases and runs every explicit example; torch and a user's port named like a module draw all."""
    from collections import Counter

    from hypothesis import strategies as st

    from conformance.profiles import heavy
    from conformance.tests.helpers import JAX_SHARE, drawn

    calls = Counter()

    @drawn(4, examples=[dict(x=-1)], x=st.integers(0, 10**9))
    def prop(port, x):
        calls[port, x < 0] += 1

    for port in ("torch", "jax", "jax_port:make"):
        prop(port=port)
    assert calls["torch", True] == calls["jax", True] == calls["jax_port:make", True] == 1
    assert calls["torch", False] == calls["jax_port:make", False] == 4
    assert calls["jax", False] == (4 if heavy() else max(1, 4 // JAX_SHARE))


def test_the_builtin_jax_port_runs_the_first_entry_of_a_matrix_and_every_other_port_all():
    """helpers.jax_runs_the_first: in the ci profile the built-in JAX port (fused or not) skips a
    matrix's other entries; torch, a user's port named like a module and every first entry run."""
    from conformance.profiles import heavy
    from conformance.tests.helpers import jax_runs_the_first

    def runs(port, first):
        try:
            jax_runs_the_first(port, first, "the first")
        except pytest.skip.Exception:
            return False
        return True

    assert all(runs(port, True) for port in ("torch", "jax", "jax+fused", "jax_port:make"))
    assert runs("torch", False) and runs("mlx+fused", False) and runs("jax_port:make", False)
    assert runs("jax", False) == runs("jax+fused", False) == heavy()


def test_a_given_port_that_does_not_load_stops_the_run_before_any_test(tmp_path):
    """One line naming the port (pytest's usage error, exit 4), not a failing test per property."""
    code, out = run_pytest(tmp_path, "--port", "no_such_module:make", select=None)
    assert code == 4 and "--port 'no_such_module:make' cannot be loaded: ModuleNotFoundError" in out, out[-800:]
    assert " passed" not in out and " failed" not in out


ENDS = {
    "os_exit_0_in_forward": "exited with status 0",
    "exit_0_in_forward": "sys.exit(0)",
    "hangs_in_forward": "no answer in 1 s",
}


@pytest.mark.long
@pytest.mark.parametrize("workers", [[], ["-n", "2"]], ids=["one process", "xdist"])
def test_a_given_port_that_exits_or_hangs_fails_its_tests_with_and_without_xdist(tmp_path, workers):
    """Each given port runs in a process of its own, as verify runs it: os._exit(0) in its forward
    once ended pytest itself with exit 0 (no xdist worker to lose). The companion, a correct
    given port passing the same test in its own process, is test_a_correct_user_port_passes_from_another_directory."""
    from conformance.profiles import heavy

    if workers and not heavy():
        pytest.skip(
            "thorough profile: under xdist a worker that dies was already a failure; ci runs the one-process run"
        )
    shutil.copy(Path(__file__).parent / "data" / "hostile_ports.py", tmp_path / "hostile_ports.py")
    ports = [a for p in ENDS for a in ("--port", f"hostile_ports:{p}")]
    code, out = run_pytest(
        tmp_path,
        "--only-given-ports",
        "--vit-timeout",
        "1",
        "-rf",
        *workers,
        *ports,
        select=MAIN,
        suite=("conformance.tests.test_model",),
    )
    failed = [line for line in out.splitlines() if line.startswith("FAILED")]
    assert code == 1 and len(failed) == len(ENDS), out[-3000:]
    for port, reason in ENDS.items():  # each port's test failed, each for verify's reason
        assert any(f"[hostile_ports:{port}]" in line for line in failed) and reason in out, (port, failed)


def test_a_model_the_tool_cannot_judge_fails_with_verify_s_line_and_a_finding_beside_it_keeps_exit_1(given_only):
    """The companion of the usage error below: in the run with ports that have findings, the model
    of a module system no adapter reads fails with verify's one line, and the run stays exit 1 (a
    finding is never lost behind a usage error)."""
    _, code, out, outcome = given_only
    assert code == 1 and outcome[f"{MAIN}[haiku_like:port]"] == "failed", out[-2000:]
    assert "vit-conformance: the tool does not take this model's module system: Transformed is a Haiku model" in out


@pytest.mark.parametrize("workers", [[], ["-n", "2"]], ids=["one process", "xdist"])
def test_a_given_model_the_tool_cannot_judge_ends_the_run_as_a_usage_error(tmp_path, workers):
    """A model port of a module system no adapter reads, alone: its test fails with verify's one
    line and the run is pytest's usage error (exit 4), not a finding (exit 1)."""
    from conformance.profiles import heavy

    if workers and not heavy():
        pytest.skip("thorough profile: the same reports through xdist's controller; ci runs the one-process run")
    (tmp_path / "haiku_like.py").write_text(HAIKU_LIKE)
    ports = ["--port", "haiku_like:port"]
    if workers:  # and a model the config cannot express (timm's ViT without a qkv bias or class token)
        shutil.copy(Path(__file__).parent / "data" / "unexpressed_ports.py", tmp_path / "unexpressed_ports.py")
        ports += ["--port", "unexpressed_ports:port"]
    suite = ("conformance.tests.test_model",)
    code, out = run_pytest(tmp_path, "--only-given-ports", *workers, *ports, select=MAIN, suite=suite)
    assert code == 4, out[-2000:]
    assert "vit-conformance: the tool does not take this model's module system: Transformed is a Haiku model" in out
    assert not workers or "vit-conformance: the config cannot express this model: " in out, out[-2000:]


def test_packed_and_quantized_ports_are_judged_by_verify_on_drawn_configs(given_only):
    """A port of packed batches and a quantized port are given the property verify's own judgement
    is (conformance/tests/test_port_kinds.py), on configs drawn inside what each declares (grids of
    their own; widths the quantizer's groups of 64 divide), never images or a 2-wide model: the
    correct packed port passes, the quantized mutant fails at its stage, and neither is given the
    image properties; the image ports are not given theirs."""
    _, _, out, outcome = given_only
    assert outcome[f"{KINDS}[{VERIFIED[0]}]"] == "passed", out[-3000:]
    assert outcome[f"{KINDS}[{VERIFIED[1]}]"] == "failed" and "first divergent stage blocks.0.attn.q" in out
    assert not any(f"[{p}]" in name for p in VERIFIED for name in outcome if not name.startswith(KINDS))
    assert {name for name in outcome if name.startswith(KINDS)} == {f"{KINDS}[{p}]" for p in VERIFIED}
