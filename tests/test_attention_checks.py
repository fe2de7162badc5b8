"""The companions of conformance/tests/test_attention.py: each of its properties fails on a deliberately
broken port (and the project's checks that take no port). Not shipped."""

import numpy as np
from conformance import properties as P
from conformance.tests.helpers import expect_failure


def test_fully_masked_row_check_fails_on_the_mean_of_the_values():
    """Companion: MLX's kernel left to itself gives a fully masked row the mean of the values."""
    rng = np.random.default_rng(0)
    bias = rng.normal(size=6).astype(np.float32)
    out = np.broadcast_to(bias, (2, 4, 6)).copy()
    out[:, 1] += rng.normal(size=(2, 6)).astype(np.float32)  # proj(mean of v) instead of proj(0)
    expect_failure(P.check_fully_masked_row, "mean_of_values", out, None, 1, bias, match="proj's bias")
    weights = np.full((2, 3, 4, 5), 0.2, np.float32)
    expect_failure(
        P.check_fully_masked_row,
        "uniform_weights",
        np.broadcast_to(bias, (2, 4, 6)),
        weights,
        1,
        bias,
        match="zero weights",
    )
