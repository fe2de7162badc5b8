"""Parallel ViT ports (NumPy float64 oracle, PyTorch, MLX, JAX/Flax NNX) sharing one config.

Every port module exposes ``make(config, state)``: a *port factory* (see the README's
"Port protocol"). Frameworks are imported only when their port is used.
"""

from impls.protocol import (
    ORIGINAL_VIT,
    AdamW,
    PRESETS,
    VIT_FAMILY,
    NAFLEX_FAMILY,
    ConfigError,
    InputError,
    Loss,
    Perturbed,
    ViTConfig,
    check_images,
    get_config,
    tap_names,
    tap_shapes,
)

from weights import FRAMEWORKS
import importlib

# Port name -> "module:factory", the same form users pass to `--port`: one port per native
# layout of weights.FRAMEWORKS, the float64 oracle ("numpy") first.
PORTS = {framework: f"impls.{framework}_vit:make" for framework in FRAMEWORKS}
FRAMEWORK_PORTS = tuple(p for p in PORTS if p != "numpy")


def load_factory(spec: str):
    """Import ``pkg.module:callable`` (or a built-in port name) and return the callable."""

    spec = PORTS.get(spec, spec)
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"port {spec!r} must look like 'pkg.module:factory' or be one of {sorted(PORTS)}")
    module = importlib.import_module(module_name)
    try:
        return getattr(module, attr)
    except AttributeError:
        raise ValueError(f"module {module_name!r} has no attribute {attr!r}") from None


__all__ = [
    "Perturbed",
    "AdamW",
    "ORIGINAL_VIT",
    "VIT_FAMILY",
    "NAFLEX_FAMILY",
    "PRESETS",
    "PORTS",
    "FRAMEWORK_PORTS",
    "ConfigError",
    "InputError",
    "Loss",
    "ViTConfig",
    "check_images",
    "get_config",
    "load_factory",
    "tap_names",
    "tap_shapes",
]
