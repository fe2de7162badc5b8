"""The tolerance policy: per stage kind, dtype and mode, the largest error ratio a correct port
may show (docs/tolerances.md).

The ratio is the error over the error model's bound (conformance/numerics/error_model.py): locally,
``max_i |port_i − oracle_i| / unit_bound_i`` with the stage computed from the port's own
inputs; end to end, ``max|port − oracle| / max|noisy oracle − oracle|``. Because the bound
already carries the conditioning (accumulation length, magnitudes summed, a LayerNorm's mean
against its spread, the logits' range) and the dtype's roundoff, one constant per stage kind
serves every checkpoint. The constants are not chosen by hand: each is ``MARGIN`` times the
largest ratio that ``python -m conformance calibrate`` measured on the correct torch, MLX and
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
# A stage whose propagated spread (the noisy runs' largest deviation) reaches this share of its
# largest magnitude is past the error model's linear regime: rounding alone moves it by a tenth of
# its range (a saturated softmax flipping between near-ties: weights x64 from the fifth block of a
# deep model on). There a correct port's error is another noisy run's, not a fraction of one, so
# its end-to-end ratio climbs toward 1 whatever its stage kind (measured: at most 0.12 below this
# share in float32, 0.30 just above it, 1.0 where the spread exceeds the value). Such a stage is
# judged end to end by its kind's tolerance or the chaotic one, the larger: ``MARGIN`` times the
# largest ratio calibrated on chaotic stages of every kind (``CHAOTIC_KIND``).
CHAOTIC = 0.1
CHAOTIC_MODE, CHAOTIC_KIND = "chaotic", "every kind"


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
    # A stage no correct port ever erred on (a selection: the distillation token's features) is
    # held to its bound itself, one rounding of its input: a ratio of 1 is what the model allows.
    return MARGIN * table[dtype][mode][kind] or 1.0


def is_chaotic(relative_spread: float) -> bool:
    return relative_spread >= CHAOTIC


def end_to_end_tolerance(kind: str, dtype: str = "float32", relative_spread: float = 0.0) -> float:
    """A stage's end-to-end tolerance given its propagated spread over its largest magnitude."""
    tol = tolerance(kind, dtype, "end-to-end")
    if is_chaotic(relative_spread):
        tol = max(tol, tolerance(CHAOTIC_KIND, dtype, CHAOTIC_MODE))
    return tol
