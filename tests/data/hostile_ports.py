"""Ports that misbehave as real ones do (or as a hostile one might): they exit, kill their own
process, hang, leave threads, patch NumPy, change NumPy's error handling or the working
directory. verify must give each the verdict its outputs deserve (tests/test_robustness.py)."""

import os
import sys
import threading
import time

import numpy as np

from impls import torch_vit


def _correct(config, state, dtype="float32"):
    return torch_vit.make(config, state) if dtype == "float32" else torch_vit.make(config, state, dtype=dtype)


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


def correct_with_numpy_exp_patched(config, state):
    np.exp = lambda x, *a, **k: np.full(np.shape(x), 1.5)
    return _correct(config, state)


def correct_with_numpy_errors_raising(config, state):
    np.seterr(all="raise")
    return _correct(config, state)


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
