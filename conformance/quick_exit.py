"""A pytest plugin that ends pytest's process once the session has reported: ``-p
conformance.quick_exit``, for runs whose reader wants only their report (the zoo's runs, the
suite's own pytest runs).

By the end of ``pytest_sessionfinish`` the terminal summary, the JUnit XML and the exit status
are written; what is left is the unconfigure's full garbage collection and the interpreter's
teardown of torch, JAX and MLX: about 1.8 s of CPU and 1.7 s of the wall a run of the property
suite (tests/test_plugin.py's given-ports run with and without it, docs/properties.md). Every
port process still open (the given ports') is closed first and its directory removed, as the
unconfigure and the interpreter's exit would. A pytest-xdist worker leaves with 0 (its status is
not the run's: xdist's controller has its reports and its "workerfinished" by then)."""

import os
import sys

import pytest

from conformance.sandbox.isolated import close_all


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_sessionfinish(session):
    yield
    close_all()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0 if hasattr(session.config, "workerinput") else int(session.exitstatus))
