"""Fixtures shared by the project's own tests (not shipped)."""

import pytest


@pytest.fixture
def cli(capfd):
    """``python -m conformance verify ...`` or ``python -m weights convert ...`` in this process
    (verify starts the port's own process as on the command line)."""
    from conformance.commands.cli import main as conformance_main
    from weights.convert import main as weights_main

    def run(*args):
        try:
            code = (weights_main if args[0] == "convert" else conformance_main)(list(map(str, args)))
        except SystemExit as e:  # argparse's usage errors
            code = e.code
        out = capfd.readouterr()  # the file descriptors: the port's process writes to them too
        return code, out.out, out.err

    return run


@pytest.fixture
def small_fs(tmp_path):
    """A file system of 32 KB to fill (a tmpfs: mounting one needs root, as CI runs; where it cannot
    be mounted the tests that inject the same error cover the path)."""
    import subprocess

    small = tmp_path / "small"
    small.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=32k", "tmpfs", str(small)], capture_output=True).returncode:
        pytest.skip("a small file system to fill needs mount (root); the injected test covers the same path")
    yield small
    done = subprocess.run(["umount", str(small)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
