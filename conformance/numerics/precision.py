"""The floating-point formats the checks speak of, defined once: each dtype's unit roundoff (half
an ulp at 1, the u of every bound), significand bits, smallest normal and largest finite value.
bfloat16 has float32's exponent range and 8 significand bits; float16 11 bits and a range to
65504."""

from __future__ import annotations

import numpy as np

SIGNIFICAND_BITS = {"float16": 11, "bfloat16": 8, "float32": 24, "float64": 53}
UNIT_ROUNDOFF = {d: 2.0**-bits for d, bits in SIGNIFICAND_BITS.items()}
SMALLEST_NORMAL = {
    "float64": float(np.finfo(np.float64).tiny),
    "float32": float(np.finfo(np.float32).tiny),
    "float16": float(np.finfo(np.float16).tiny),
    "bfloat16": float(np.finfo(np.float32).tiny),
}
LARGEST = {
    "float64": float(np.finfo(np.float64).max),
    "float32": float(np.finfo(np.float32).max),
    "float16": float(np.finfo(np.float16).max),
    "bfloat16": float(np.finfo(np.float32).max),
}
# What verify, the plugin and the zoo offer a port; and what a port may be asked to compute in
# (float64 besides: the oracle's own, for the numpy port).
PORT_DTYPES = ("float32", "bfloat16", "float16")
DTYPES = (*PORT_DTYPES, "float64")


def coarsest(dtypes) -> str:
    """The dtype with the fewest significand bits."""
    return min(dtypes, key=SIGNIFICAND_BITS.__getitem__)


def rounded(x, dtype: str) -> np.ndarray:
    """``x`` rounded to ``dtype`` (to nearest, ties to even), back in float64."""
    if dtype == "bfloat16":
        import ml_dtypes

        return np.asarray(x).astype(ml_dtypes.bfloat16).astype(np.float64)
    return np.asarray(x).astype(dtype).astype(np.float64)
