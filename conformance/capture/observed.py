"""What a captured model computes when nothing of capture is attached (docs/verify.md, "What
capture sees"): capture reads a model through hooks, function wrappers and a second pass, so a
model that computes otherwise when observed would be judged on what its user never runs. The
determinism re-run (``conformance.sandbox.portside``) calls it once more with no hook and no
function mode and compares every array it returns, bitwise, with the observed call's."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from conformance.capture.recorder import Recorder, arrays_in

if TYPE_CHECKING:
    from conformance.capture.captured import CapturedForward


def _float64(adapter, arrays) -> list[np.ndarray]:
    return [np.asarray(adapter.numpy(a), np.float64) for a in arrays]


def unobserved(forward: CapturedForward, images) -> str | None:
    """How the model's output on ``images`` with nothing of capture attached differs from its
    output on its own path when observed (``forward``'s last call's first pass), or None where
    every array it returns is bitwise the same."""
    images = np.asarray(images)
    x = images.transpose(0, 2, 3, 1) if forward.port.images == "NHWC" else images
    inputs = forward.adapter.to_input(np.ascontiguousarray(x), forward.input_dtype)
    recorder = Recorder(forward.adapter, forward.config, images.shape[0], forward.plan.blocks)
    out = forward.adapter.run(inputs, recorder, {}, functions=False)
    plain = _float64(forward.adapter, arrays_in(out, forward.adapter.is_array))
    observed = _float64(forward.adapter, forward.observed or [])  # held as the framework's: converted here
    if len(plain) != len(observed) or any(a.shape != b.shape for a, b in zip(plain, observed)):
        shapes = [a.shape for a in plain], [b.shape for b in observed]
        return f"the model returns arrays of shapes {shapes[0]} unobserved, {shapes[1]} observed"
    for i, (a, b) in enumerate(zip(plain, observed)):
        if not np.array_equal(a, b, equal_nan=True):
            return (
                f"the model's output (its array {i + 1} of {len(plain)}) without capture's hooks differs from its "
                f"output observed (max |difference| {np.nanmax(np.abs(a - b)):.3g}; two observed calls are bitwise "
                "the same): a model that computes otherwise when observed cannot be verified by observing it"
            )
    return None
