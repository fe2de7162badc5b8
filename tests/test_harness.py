"""The suite's own harness (the root conftest.py): what it does to make the run fast keeps every
result. Its xdist workers leave as soon as their last report is sent (``pytest_sessionfinish``)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.long
def test_a_failing_test_under_xdist_still_fails_the_run_with_every_result_reported(tmp_path):
    (tmp_path / "test_f.py").write_text(
        "import sys\n\n\n"
        "def test_the_root_conftest_runs_in_the_worker():\n"
        f"    assert sys.modules['conftest'].__file__ == {str(ROOT / 'conftest.py')!r}\n\n\n"
        "def test_bad():\n"
        "    assert 1 == 2\n"
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("PYTEST_XDIST_WORKER", None)  # a run of its own, not a worker of this one
    cmd = [sys.executable, "-m", "pytest", "-p", "conftest", "-n", "2", "-q", "-p", "no:cacheprovider", str(tmp_path)]
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "1 failed, 1 passed" in proc.stdout, proc.stdout
    # a worker gone before pytest-xdist's "workerfinished" is a crash, replaced by another
    assert "node down" not in proc.stdout + proc.stderr, proc.stdout


# the built-in JAX port verified on three of verify's cases, in float32 and bfloat16
AT_XLAS_DEFAULTS = """
import os
from conformance.verify.forward import verify
from impls import get_config, load_factory
from tests.capture_cases import quick_cases

assert "XLA_FLAGS" not in os.environ
config = get_config("vit_test_token")
for dtype in ("float32", "bfloat16"):
    report = verify(load_factory("jax"), config, port="jax", cases=quick_cases(config), dtype=dtype)
    assert report.conformant and len(report.stages) == 25, (dtype, report.failures)
"""


def test_the_jax_port_compiled_at_xlas_defaults_is_conformant():
    """The root conftest.py has XLA compile the suite's programs at -O0 below the thorough profile:
    here the built-in JAX port compiled as users compile it (no XLA_FLAGS), in a process of its own."""
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "PYTEST_XDIST_WORKER")}
    env["PYTHONPATH"] = str(ROOT)
    proc = subprocess.run(
        [sys.executable, "-c", AT_XLAS_DEFAULTS], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
