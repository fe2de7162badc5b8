"""The companions of conformance/tests/test_timm_reference.py: each of its properties fails on a deliberately
broken port (and the project's checks that take no port). Not shipped."""

import pytest
import torch
from conformance.numerics.compare import error
from conformance.references import timm_taps, timm_vit
from conformance.tests.helpers import run
from impls import get_config, tap_names, tap_shapes
from weights import init_state
from conformance.tests.test_timm_reference import CONFIGS, images_for  # noqa: F401


@pytest.mark.parametrize("name", CONFIGS)
def test_oracle_equals_timm_in_float64_at_every_stage(name):
    """The spec in code and timm agree to float64 rounding: the oracle means what timm means."""
    config = get_config(name)
    state = init_state(config, seed=11)
    x = images_for(config)
    ref = timm_taps(timm_vit(config, state, dtype=torch.float64), x, tap_shapes(config, len(x)))
    oracle = run("numpy", config, state, x)
    assert sorted(ref) == sorted(tap_names(config))
    for stage in tap_names(config):
        _, rel = error(oracle[stage], ref[stage])
        assert rel < 1e-12, f"{stage}: oracle vs timm float64 rel_err {rel:.3e}"
