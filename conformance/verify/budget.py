"""What a verification will cost, estimated from the config alone before anything is built: a
config that would not fit in this machine's memory is refused with the figure (``--force``
tries anyway), so ``depth: 10000`` or ``img_size: 100000`` is an answer in a second, not a
MemoryError after minutes of allocating.

The model: peak memory = a fixed cost of the frameworks, plus so many bytes per element of one
image's taps (the float64 oracle's stages and their noisy runs, for every case) and per
parameter (each case's weights, in float32 and float64). The constants are fitted to the peak
resident memory measured on the 2-core VM (docs/performance.md, ``python -m conformance bench
--verify`` once it exists): ViT-Ti 3.0 GB and ViT-B 18.5 GB (issue 24's table), checked again on
ViT-Ti when this was written (``MEASURED``).
"""

from __future__ import annotations

import os

import numpy as np

from impls.protocol import ViTConfig

BASE = 1.0e9  # bytes: the interpreter, NumPy, the frameworks verify imports
PER_TAP_ELEMENT = 347.0  # bytes per element of one image's taps
PER_PARAMETER = 102.0  # bytes per parameter
MEASURED = {"vit_tiny_patch16_224": 3.0e9, "vit_base_patch16_224": 18.5e9}  # peak bytes the constants fit


def _counted(config: ViTConfig) -> tuple[float, float]:
    from impls.stages import tap_shapes
    from weights.canonical import expected_shapes

    taps = sum(float(np.prod(s, dtype=np.float64)) for s in tap_shapes(config, 1).values())
    params = sum(float(np.prod(s, dtype=np.float64)) for s in expected_shapes(config).values())
    return taps, params


def sizes(config: ViTConfig) -> tuple[float, float]:
    """(elements of one image's taps, parameters), by arithmetic on the config: counted on one
    and two blocks, the blocks being alike (quick at any depth)."""
    one, two = _counted(config.replace(depth=1)), _counted(config.replace(depth=2))
    return tuple(a + (config.depth - 1) * (b - a) for a, b in zip(one, two))


def estimate(config: ViTConfig) -> float:
    """Peak bytes verify holds for ``config`` (its default cases)."""
    taps, params = sizes(config)
    return BASE + PER_TAP_ELEMENT * taps + PER_PARAMETER * params


def machine_memory() -> float | None:
    """This machine's physical memory in bytes (None where the OS does not say)."""
    try:
        return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return None


def too_large(config: ViTConfig, memory: float | None = None) -> str | None:
    """Why verifying ``config`` would not fit in ``memory`` (default: this machine's), or None."""
    memory = machine_memory() if memory is None else memory
    taps, params = sizes(config)
    need = estimate(config)
    if memory is None or need <= memory:
        return None
    return (
        f"verifying this config needs about {need / 1e9:.3g} GB ({params / 1e6:.4g} M parameters, "
        f"{config.num_tokens} tokens, {config.depth} blocks: {taps / 1e6:.4g} M tap elements per image), "
        f"more than this machine's {memory / 1e9:.3g} GB; pass --force to try anyway"
    )
