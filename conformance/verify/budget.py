"""What a verification will cost, estimated from the config alone before anything is built: a
config that would not fit in this machine's memory is refused with the figure (``--force``
tries anyway), so ``depth: 10000`` or ``img_size: 100000`` is an answer in a second, not a
MemoryError after minutes of allocating; ``verify --dry-run`` prints both estimates.

Memory: a fixed cost, plus so many bytes per element of one image's taps (one case's float64
oracle, its noisy run and the port's outputs, batch up to 3) and per parameter (the case's
weights in float32 and float64, the port's copy). Time: a fixed cost (per-stage work, the same
for every size), plus seconds per GFLOP of one image's forward. Both fitted to ``MEASURED``:
``verify torch --preset NAME --in-process`` on this project's 2-core VM (peak resident memory
of the process; wall time), three sizes, 2026-12-01.
"""

from __future__ import annotations

import os

import numpy as np

from impls.protocol import ViTConfig

# name: (peak bytes, seconds), with the cases and streaming of this module's date
MEASURED = {
    "vit_tiny_patch16_224": (1.25e9, 32.0),
    "vit_small_patch16_224": (2.02e9, 61.5),
    "vit_base_patch16_224": (4.40e9, 152.2),
}
BASE = 0.75e9  # bytes: the interpreter, NumPy, the frameworks
PER_TAP_ELEMENT = 50.0  # bytes per element of one image's taps
PER_PARAMETER = 26.1  # bytes per parameter
PORT_PROCESS = 0.5e9  # bytes: the port's own process, its framework imported (beside the fit's one process)
BASE_SECONDS = 23.1
SECONDS_PER_GFLOP = 3.69  # of one image's forward (10 cases of batch 3 and 1)


def forward_flops(config: ViTConfig, batch: int = 1) -> float:
    """Multiply-adds x 2 of a forward: the blocks' projections, MLP and attention."""
    D, N, depth = config.embed_dim, config.num_tokens, config.depth
    return 2.0 * batch * N * depth * (4 * D * D + 2 * D * config.mlp_hidden_dim + 2 * N * D)


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
    """Peak bytes verify and the port's process hold for ``config`` (its default cases, one at a time)."""
    taps, params = sizes(config)
    return BASE + PORT_PROCESS + PER_TAP_ELEMENT * taps + PER_PARAMETER * params


def seconds(config: ViTConfig, images: int = 22) -> float:
    """Wall seconds of verify on ``images`` images in all (the fit's ten cases hold 22: scaled)."""
    return (BASE_SECONDS + SECONDS_PER_GFLOP * forward_flops(config) / 1e9) * images / 22


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
