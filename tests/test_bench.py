"""The benchmark's arithmetic (its timings live in the README, not in tests)."""

import pytest

from conformance.bench import matmul_peak, time_forward, vit_flops
from impls import get_config


@pytest.mark.parametrize(
    "name, gmacs", [("vit_tiny_patch16_224", 1.3), ("vit_small_patch16_224", 4.6), ("vit_base_patch16_224", 17.6)]
)
def test_flop_count_matches_timms_published_gmacs(name, gmacs):
    """timm's model cards give 1.3, 4.6 and 17.6 GMACs for ViT-Ti, S and B/16 at 224."""
    assert round(vit_flops(get_config(name), 1) / 2 / 1e9, 1) == gmacs
    assert vit_flops(get_config(name), 8) == 8 * vit_flops(get_config(name), 1)


def test_timing_and_peak_helpers_return_numbers():
    peak = matmul_peak(n=64, repeats=1)
    assert set(peak) == {"torch", "numpy"} and all(v > 0 for v in peak.values())
    seconds, _ = time_forward(lambda x: sum(x), [1, 2, 3], warmup=1, repeats=3, base=0)
    assert seconds >= 0
