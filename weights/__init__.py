"""One canonical weight format (timm names and layouts, float32 safetensors) and its conversions."""

from weights.canonical import (
    WeightError,
    check_exact_match,
    expected_shapes,
    load_state,
    mha_shapes,
    read_config,
    save_state,
    validate_state,
)
from weights.init import init_params, init_state
from weights.native import FRAMEWORKS, from_native, to_native

__all__ = [
    "FRAMEWORKS",
    "WeightError",
    "check_exact_match",
    "expected_shapes",
    "from_native",
    "init_params",
    "init_state",
    "load_state",
    "mha_shapes",
    "read_config",
    "save_state",
    "to_native",
    "validate_state",
]
