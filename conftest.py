"""Hypothesis profiles for the conformance suite, and process-wide framework setup.

Choose a profile with ``--hypothesis-profile NAME`` or ``HYPOTHESIS_PROFILE=NAME``:
``ci`` (derandomised, fixed example counts, no deadline), ``dev`` (the default) or
``thorough`` (many more examples, for a nightly job); see conformance/profiles.py.
"""

import gc
import os
import sys


# XLA compiles every program of the suite anew, and its programs are small: at its default -O3 the
# compiles were a sixth of the ci run's CPU. Below the thorough profile they are compiled at -O0
# (a float32 result moves by a few units in the last place, a reduction's order; measured in
# docs/properties.md, "Speed"); the thorough profile and tests/test_harness.py's JAX port compile
# at XLA's defaults, as users do. A user's own XLA_FLAGS are left alone.
XLA_FAST_COMPILE = "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"
XLA_ONE_THREAD = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"

os.environ.setdefault("JAX_PLATFORMS", "cpu")
if os.environ.get("XLA_FLAGS") in (None, XLA_FAST_COMPILE):  # unset, or set by this file in xdist's controller
    flags = [XLA_FAST_COMPILE] if os.environ.get("HYPOTHESIS_PROFILE") != "thorough" else []
    flags += [XLA_ONE_THREAD] if os.environ.get("PYTEST_XDIST_WORKER") else []
    if flags:
        os.environ["XLA_FLAGS"] = " ".join(flags)
if os.environ.get("PYTEST_XDIST_WORKER"):
    # pytest-xdist's workers already fill the cores: one thread each for torch, XLA (above) and the
    # OpenBLAS MLX binds to, instead of a pool per worker contending for the same cores (the
    # suite's models are small: 87.5 s against 103.9 s side by side, docs/properties.md).
    # Set before any framework is imported.
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(var, "1")
    # A worker holds about a million long-lived objects (torch, JAX, hypothesis): at the default
    # thresholds each of its ~15 full collections walks them all. Collected less often, the
    # same cycles are freed later (docs/properties.md, "Speed").
    gc.set_threshold(10_000, 10, 100)

import pytest  # noqa: E402

from conformance import profiles  # noqa: E402

profiles.register()
profiles.load_default()


def pytest_collection_modifyitems(config, items):
    # The meta-tests that start their own pytest run take longest, and the modules with a test of
    # several seconds (XLA compiling a Flax model op by op, a JAX mutant in bfloat16): schedule
    # them first, so that pytest-xdist ends on short tests on both workers instead of one of
    # them waiting on a long one at the end.
    first = (
        "test_zoo.py",
        "test_plugin.py",
        "test_verify.py",
        "test_capture.py",
        "test_ports_as_written.py",
        "test_third_party.py",
        "test_diagnosis.py",
        # single tests of several seconds: torch.compile's recompiles, Keras's and Equinox's models, a meta-run
        "test_compiled.py",
        "test_keras.py",
        "test_equinox.py",
        "test_harness.py",
    )
    # Before them, side by side, the modules whose tests compile the same XLA program: the JAX
    # port's gradient of vit_test_token, for the reference check, the AdamW step and the optax
    # mutants. pytest-xdist's worksteal hands the front of the list to one worker and steals
    # from the back, so they run on that worker, where the program is cached.
    together = ("test_gradients.py", "test_gradients_checks.py")

    # The tests reading one module-scoped run of pytest (test_plugin's ``given_only``): together at the
    # front, on one worker, so that the run is made once, not once per worker that gets one of them.
    shared = ("given_only",)

    def order(item):
        name = item.path.name
        if item.get_closest_marker("long") or set(shared) & set(getattr(item, "fixturenames", ())):
            return (-1, 0)  # the longest single tests, before any other
        return (0, together.index(name)) if name in together else (1 if name in first else 2, 0)

    items.sort(key=order)


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_sessionfinish(session):
    yield
    if hasattr(session.config, "workerinput"):  # the worker itself (a pytest it starts inherits the env)
        # pytest-xdist has sent the worker's last report and its "workerfinished" (in its own
        # wrapper, inside this outermost one): what is left is the worker's unconfigure (two full
        # garbage collections) and its interpreter's teardown (JAX's backends, a million
        # objects), which the run's end would wait on while the other core idles.
        _exit_now()


def _exit_now():
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


# The built-in JAX port's share of each property's drawn cases: conformance.tests.helpers.drawn.
