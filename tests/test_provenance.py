"""The calibration says what produced it; a run on other versions is told so (a warning, not a failure)."""

import copy
import json
import warnings

from conformance.numerics.provenance import collect, differences
from conformance.numerics.tolerances import CALIBRATION


class ProvenanceWarning(UserWarning):
    """The running frameworks, BLAS or CPU differ from those the tolerances were calibrated on."""


def test_running_versions_match_the_calibrated_ones_or_warn():
    recorded = json.loads(CALIBRATION.read_text()).get("provenance")
    assert recorded and recorded.get("versions", {}).get("torch"), (
        "calibration.json records no provenance: rerun python -m conformance calibrate"
    )
    diff = differences(recorded)
    if diff:
        warnings.warn(
            ProvenanceWarning("tolerances were calibrated on other software or hardware: " + "; ".join(diff)),
            stacklevel=1,
        )


def test_differences_name_a_changed_framework_blas_and_cpu():
    running = collect()
    assert differences(running, running) == []
    recorded = copy.deepcopy(running)
    recorded["versions"]["torch"] = "2.0.0"
    # Whichever BLAS MLX runs on here (OpenBLAS where .ci/install-openblas could install it, its
    # built-in one elsewhere), the recorded one differs.
    other = "built-in" if running["blas"]["mlx"] != "built-in" else "/usr/lib/libopenblas.so.0"
    recorded["blas"]["mlx"] = other
    recorded["cpu"]["flags"] = ["avx"]
    diff = differences(recorded, running)
    assert any(line.startswith("torch: calibrated with 2.0.0, running ") for line in diff), diff
    assert any(line.startswith(f"mlx BLAS: calibrated with {other}, running ") for line in diff), diff
    assert any(line.startswith("CPU: calibrated on") for line in diff), diff
