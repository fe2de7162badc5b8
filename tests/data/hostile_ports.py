"""Ports that misbehave as real ones do (or as a hostile one might): they exit, kill their own
process, hang, leave threads, patch NumPy, change NumPy's error handling or the working
directory. verify must give each the verdict its outputs deserve (tests/test_robustness.py)."""

import os
import sys
import threading
import time

import numpy as np


def _correct(config, state):
    """The float64 NumPy port with float32 taps: correct, and no framework for the port's process
    to import (these tests start one per port). Imported here: a port that exits, crashes or hangs
    before computing anything has its process import neither it nor scipy."""
    from impls import numpy_vit

    forward = numpy_vit.make(config, state)
    return lambda images: {k: np.asarray(v, np.float32) for k, v in forward(images).items()}


def exit_0_in_forward(config, state):
    def forward(images):
        sys.exit(0)

    return forward


def exit_0_in_factory(config, state):
    sys.exit(0)


def os_exit_0_in_forward(config, state):
    def forward(images):
        os._exit(0)

    return forward


def segfault_in_forward(config, state):
    def forward(images):
        import ctypes

        ctypes.string_at(0)  # reads address 0: SIGSEGV

    return forward


def hangs_in_forward(config, state):
    def forward(images):
        time.sleep(10**6)

    return forward


def keyboard_interrupt_in_forward(config, state):
    def forward(images):
        raise KeyboardInterrupt

    return forward


def zeros_with_numpy_abs_patched(config, state):
    """Zeros for every output, and numpy.abs made to return zeros: within tolerance if verify
    measured its errors with this process's numpy."""
    np.abs = lambda x, *a, **k: np.zeros(np.shape(x))
    np.absolute = np.abs

    def forward(images):
        return {"logits": np.zeros((len(images), config.num_classes), np.float32)}

    return forward


def _mlx(config, state):
    # MLX: arithmetic that owes NumPy nothing, and a lighter import than torch's
    from impls import mlx_vit

    return mlx_vit.make(config, state)


def correct_with_numpy_exp_patched(config, state):
    """An MLX port (its arithmetic owes NumPy nothing) that leaves numpy.exp wrong."""
    np.exp = lambda x, *a, **k: np.full(np.shape(x), 1.5)
    return _mlx(config, state)


def correct_with_numpy_errors_raising(config, state):
    np.seterr(all="raise")
    return _mlx(config, state)


def correct_that_changes_directory(config, state):
    os.chdir("/")
    return _correct(config, state)


def correct_that_leaves_a_thread(config, state):
    threading.Thread(target=time.sleep, args=(600,), daemon=False).start()
    return _correct(config, state)


def prints_to_stdout(config, state):
    forward = _correct(config, state)

    def noisy(images):
        print("a port that prints")
        return forward(images)

    return noisy


def raises_on_the_second_call(config, state):
    """Correct once; the determinism re-run's second call raises (not randomness: an exception)."""
    forward, calls = _correct(config, state), []

    def once(images):
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("only once")
        return forward(images)

    return once


def random_logits_in_one_buffer(config, state):
    """Randomness at inference that a port returns in the same buffer on every call (an output
    array reused): the first call's logits are overwritten by the second's unless they were
    written out before it."""
    forward, buffer, calls = _correct(config, state), {}, []

    def reused(images):
        out = forward(images)
        calls.append(1)
        logits = buffer.setdefault("logits", np.empty_like(out["logits"]))
        logits[...] = out["logits"] + np.float32(1e-3 * (len(calls) - 1))  # a built port's first call exact
        return {**out, "logits": logits}

    return reused


def allocates_8_gb(config, state):
    def forward(images):
        return np.ones((2**30,), np.float64)  # 8 GB

    return forward


def grad_exits(config, state):
    def grad(images, loss):
        os._exit(3)

    return grad


def attention_exits(state, **options):
    def attention(x, context, mask):
        sys.exit(0)

    return attention
