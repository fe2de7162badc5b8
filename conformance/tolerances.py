"""The tolerance policy: per stage kind, dtype and regime, the largest relative error a correct
port may show against the float64 oracle.

The error of a stage is ``max|port - oracle| / max|oracle|`` over the stage's tensor, so one
number serves tiny and huge inputs alike. The thresholds are not chosen by hand: they are
``MARGIN`` times the largest error that ``python -m conformance.calibrate`` measured on the
correct torch, MLX and JAX ports over hundreds of drawn cases (calibration.json beside this
file, with the case that produced each maximum), floored at float32's machine epsilon.
Regime "stress" is the weight scale where attention logits are large (strategies.STRESS_SCALES).
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

import numpy as np

CALIBRATION = Path(__file__).with_name("calibration.json")
MARGIN = 4.0
FLOOR = {"float32": float(np.finfo(np.float32).eps)}


@lru_cache(maxsize=1)
def measured() -> dict:
    """{dtype: {regime: {stage kind: largest rel_err over the framework ports}}}."""
    data = json.loads(CALIBRATION.read_text())
    return {
        "float32": {
            regime: {kind: max(p["max"] for p in ports.values()) for kind, ports in kinds.items()}
            for regime, kinds in data["errors"].items()
        }
    }


def tolerance(kind: str, dtype: str = "float32", regime: str = "normal") -> float:
    table = measured()
    if dtype not in table or regime not in table[dtype]:
        known = [(d, r) for d in table for r in table[d]]
        raise ValueError(f"no tolerances for dtype {dtype!r}, regime {regime!r}; known: {known}")
    if kind not in table[dtype][regime]:
        raise ValueError(f"no tolerance for stage kind {kind!r}; known: {sorted(table[dtype][regime])}")
    return MARGIN * max(table[dtype][regime][kind], FLOOR[dtype])
