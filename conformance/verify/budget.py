"""What a verification will cost, estimated from the config alone before anything is built: a
config that would not fit in this machine's memory is refused with the figure (``--force``
tries anyway), so ``depth: 10000`` or ``img_size: 100000`` is an answer in a second, not a
MemoryError after minutes of allocating; ``verify --dry-run`` prints both estimates.

Memory: a fixed cost, plus so many bytes per element of one image's taps (the port's outputs
of one case, batch up to 3, in the port's process and in verify's; the error model's runs hold
a block's stages, streamed) and per parameter (the case's weights in verify, the copy written
for the port's process and the port's own). Time: a fixed cost (per-stage work, the same for
every size), plus seconds per GFLOP of one image's forward. Both fitted (``fit``) to what
``python -m conformance bench --verify`` measured on this project's 2-core VM (the port in its
own process; the two processes' memory together; wall time), 2026-12-01.
"""

from __future__ import annotations

import os

import numpy as np

from impls.protocol import ViTConfig

# ``fit`` to the nine rows of docs/data/bench_verify.json (ViT-Ti to ViT-L/14 at 336; three depths,
# four token counts). Memory is an upper bound (a config is refused on it).
BASE = 0.8474e9  # bytes: the interpreters, NumPy, the port's framework
PER_TAP_ELEMENT = 29.0  # bytes per element of one image's taps
PER_PARAMETER = 28.31  # bytes per parameter
BASE_SECONDS = 7.598
SECONDS_PER_GFLOP = 1.753  # of one image's forward, over the full-size cases' 12 images
FIT_IMAGES = 12


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
    return BASE + PER_TAP_ELEMENT * taps + PER_PARAMETER * params


def seconds(config: ViTConfig, images: int = FIT_IMAGES) -> float:
    """Wall seconds of verify on ``images`` images in all (scaled from the fit's 12)."""
    return (BASE_SECONDS + SECONDS_PER_GFLOP * forward_flops(config) / 1e9) * images / FIT_IMAGES


def fit(rows) -> dict[str, float]:
    """The constants above from benchmark rows (docs/data/bench_verify.json's): each model fitted
    by non-negative least squares on relative error; memory then raised by the largest factor any
    row is over it, so that it bounds every row (``python -m conformance bench --verify --fit``
    prints them; a test keeps the module's equal to them)."""
    from scipy.optimize import nnls

    from conformance.verify.cases import images_of, verify_plan
    from impls import get_config

    memory, time_ = [], []
    for r in rows:
        config = get_config(r["preset"]).replace(**r["settings"])
        taps, params = sizes(config)
        peak = r["peak_gb"] * 1e9
        memory.append(([1.0, taps, params], peak))
        per_fit = r["seconds"] * FIT_IMAGES / images_of(n for n, _ in verify_plan(config))
        time_.append(([1.0, forward_flops(config) / 1e9], per_fit))

    def solve(system):
        a = np.array([f for f, _ in system]) / np.array([[y] for _, y in system])
        return nnls(a, np.ones(len(system)))[0]

    base, per_tap, per_param = solve(memory)
    over = max(y / (base + per_tap * f[1] + per_param * f[2]) for f, y in memory)
    base_s, per_gflop = solve(time_)
    return {
        "BASE": base * over,
        "PER_TAP_ELEMENT": per_tap * over,
        "PER_PARAMETER": per_param * over,
        "BASE_SECONDS": base_s,
        "SECONDS_PER_GFLOP": per_gflop,
    }


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
