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
