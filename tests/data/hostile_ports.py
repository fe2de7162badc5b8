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


def nan_logits(config, state):
    """Correct taps, NaN logits: the most basic finding there is."""
    correct = _correct(config, state)

    def forward(images):
        out = correct(images)
        out["logits"] = np.full_like(out["logits"], np.nan)
        return out

    return forward


def overflowing_softmax(config, state):
    """Logits only, the first Inf (a softmax that overflowed) and the rest NaN."""

    def forward(images):
        logits = np.full((images.shape[0], config.num_classes), np.nan, np.float32)
        logits[:, 0] = np.inf
        return logits

    return forward


def factory_returns_a_tuple(config, state):
    return (lambda images: None, "not a forward")


def ragged_tap(config, state):
    correct = _correct(config, state)

    def forward(images):
        out = correct(images)
        out["embed"] = [[1.0, 2.0], [3.0]]
        return out

    return forward


def lazily_broadcast_huge(config, state):
    """Logits as a broadcast view of 2**40 float32 elements: 4 TB once materialised."""

    def forward(images):
        return np.broadcast_to(np.float32(0), (images.shape[0], 2**40 // images.shape[0]))

    return forward


def supports_that_raises(config, state):
    return _correct(config, state)


def _raising_predicate(value):
    raise RuntimeError("this predicate is broken")


supports_that_raises.supports = {"depth": _raising_predicate}


def starts_a_grandchild_and_hangs(config, state):
    """Starts a process in a session of its own (setsid), which records its pid in
    $VIT_TEST_GRANDCHILD_PID, then hangs: a cancelled verify must leave neither behind."""
    import subprocess

    def forward(images):
        child = subprocess.Popen(
            [sys.executable, "-c", "import time; time.sleep(600)"],
            start_new_session=True,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        path = os.environ.get("VIT_TEST_GRANDCHILD_PID")
        if path:
            with open(path + ".tmp", "w") as f:
                f.write(str(child.pid))
            os.replace(path + ".tmp", path)
        time.sleep(10**6)

    return forward


def _built(recipe):
    """A value from a JSON recipe (tests/test_robustness.py's fuzz draws them): arrays of a shape,
    dtype and fill (a number, "nan", "inf", "-inf"), lazily broadcast ones, lists, tuples, dicts
    and plain values."""
    kind, body = next(iter(recipe.items()))
    if kind == "array":
        return np.full(body["shape"], float(body["fill"]), dtype=body["dtype"])
    if kind == "broadcast":
        return np.broadcast_to(np.float32(float(body["fill"])), body["shape"])
    if kind == "list":
        return [_built(r) for r in body]
    if kind == "tuple":
        return tuple(_built(r) for r in body)
    if kind == "dict":
        return {k: _built(r) for k, r in body.items()}
    return body  # "value": a plain JSON value (a number, a string, None, a nested list)


def returns_the_drawn_output(config, state):
    """Returns what $VIT_TEST_RECIPE's JSON recipe builds, whatever the images."""
    import json

    with open(os.environ["VIT_TEST_RECIPE"]) as f:
        recipe = json.load(f)
    return lambda images: _built(recipe)


def _timm_unless_observed(config):
    """timm's ViT whose logits move when no hook is on any of its modules and no function mode is on:
    right whenever verify looks, wrong in its user's hands."""
    from torch.overrides import _get_current_function_mode_stack

    from conformance.examples import timm_vit

    model = timm_vit.build(config)

    class Hiding(type(model)):
        def forward(self, x):
            out = super().forward(x)
            hooked = any(m._forward_hooks or m._forward_pre_hooks for m in self.modules())
            if hooked or _get_current_function_mode_stack():
                return out
            return out + 0.01 * out.abs().max()

    model.__class__ = Hiding
    return model.eval()


def _unobserved():
    from conformance.capture import ModelPort
    from impls import VIT_FAMILY

    return ModelPort(_timm_unless_observed, rename={}, supports=VIT_FAMILY)


hides_when_unobserved = _unobserved()
