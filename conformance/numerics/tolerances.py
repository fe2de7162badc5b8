"""The tolerance policy: per stage kind, dtype and mode, the largest error ratio a correct port
may show (docs/tolerances.md).

The ratio is the error over the error model's bound (conformance/numerics/error_model.py): locally,
``max_i |port_i − oracle_i| / unit_bound_i`` with the stage computed from the port's own
inputs; end to end, ``max|port − oracle| / max|noisy oracle − oracle|``. Because the bound
already carries the conditioning (accumulation length, magnitudes summed, a LayerNorm's mean
against its spread, the logits' range) and the dtype's roundoff, one constant per stage kind
serves every checkpoint. The constants are not chosen by hand: each is ``MARGIN`` times the
largest ratio that ``python -m conformance.numerics.calibrate`` measured on the correct torch, MLX and
JAX ports (calibration.json beside this file, with the case behind each maximum and the
versions, BLAS and CPU it was measured on).
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

CALIBRATION = Path(__file__).with_name("calibration.json")
MARGIN = 4.0
MODES = ("local", "end-to-end")


@lru_cache(maxsize=1)
def calibration() -> dict:
    return json.loads(CALIBRATION.read_text())


@lru_cache(maxsize=1)
def measured() -> dict:
    """{dtype: {mode: {stage kind: largest ratio over the framework ports}}}."""
    return {
        dtype: {
            mode: {kind: max(p["max"] for p in ports.values()) for kind, ports in kinds.items()}
            for mode, kinds in modes.items()
        }
        for dtype, modes in calibration()["ratios"].items()
    }


def dtypes() -> list[str]:
    return list(measured())


def tolerance(kind: str, dtype: str = "float32", mode: str = "local") -> float:
    table = measured()
    if dtype not in table:
        raise ValueError(f"no tolerances for dtype {dtype!r}; calibrated: {sorted(table)}")
    if mode not in table[dtype]:
        raise ValueError(f"no tolerances for mode {mode!r}; known: {sorted(table[dtype])}")
    if kind not in table[dtype][mode]:
        raise ValueError(f"no tolerance for stage kind {kind!r}; known: {sorted(table[dtype][mode])}")
    return MARGIN * table[dtype][mode][kind]
