"""`pytest --port`: the suite runs against a user's port from any directory, through the
pytest11 entry point, beside or instead of the built-in ports."""

import os
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

DATA = Path(__file__).with_name("data") / "user_ports.py"
MAIN = "test_every_tap_of_every_port_matches_the_oracle"
NORMS = "test_each_layernorm_is_used_where_it_belongs"


def run_pytest(cwd, *args):
    env = dict(os.environ, PYTHONPATH=str(cwd))
    env.pop("HYPOTHESIS_PROFILE", None)
    cmd = [sys.executable, "-m", "pytest", "--pyargs", "conformance.tests", "-p", "no:cacheprovider", "-q",
           "--hypothesis-profile=zoo", "-k", f"{MAIN} or {NORMS}", *args]
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    return proc.returncode, proc.stdout + proc.stderr


@pytest.fixture(scope="module")
def given_only(tmp_path_factory):
    """One run from a directory outside the project, of three user ports and no built-in one."""
    d = tmp_path_factory.mktemp("elsewhere")
    shutil.copy(DATA, d / "user_ports.py")
    code, out = run_pytest(d, "--only-given-ports", "-rs", f"--junitxml={d / 'r.xml'}",
                           *[a for p in ("correct", "shared_norm", "logits_only") for a in ("--port", f"user_ports:{p}")])
    outcome = {}
    for case in ET.parse(d / "r.xml").getroot().iter("testcase"):
        status = "failed" if case.find("failure") is not None else "skipped" if case.find("skipped") is not None else "passed"
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


def test_only_given_ports_leaves_the_builtin_ones_out(given_only):
    _, _, _, outcome = given_only
    assert set(outcome) == {f"{t}[user_ports:{p}]" for t in (MAIN, NORMS) for p in ("correct", "shared_norm", "logits_only")}


def test_given_ports_run_beside_the_builtin_ones_by_default(given_only):
    d = given_only[0]
    code, out = run_pytest(d, "--port", "user_ports:correct", "--collect-only")
    assert code == 0, out
    for port in ("torch", "mlx", "jax", "user_ports:correct"):
        assert f"{MAIN}[{port}]" in out, out
