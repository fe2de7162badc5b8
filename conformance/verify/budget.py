"""What a verification will cost, estimated from the config alone before anything is built: a
config that would not fit in this machine's memory is refused with the figure (``--force``
tries anyway), so ``depth: 10000`` or ``img_size: 100000`` is an answer in a second, not a
MemoryError after minutes of allocating; ``verify --dry-run`` prints both estimates.

Memory: a fixed cost, plus so many bytes per element of the largest case's taps (the port's
outputs of one case, in the port's process and mapped in verify's; the
error model's runs hold a block's stages, streamed) and per parameter (the case's weights,
mapped in both processes, and the port's own); the next case's weights, where they fit beside it
(``ahead``), come on top. Time: per case a fixed cost and so much per parameter (a weight set
drawn, written and read by both processes), plus per image so much per GFLOP of its forward and
per element of its taps. Both fitted
(``bench.fit``) to what ``python -m conformance bench --verify`` measured on this project's
2-core VM (the port in its own process; the two processes' memory together; wall time),
2026-12-03. The memory a run plans for is the least of the machine's, its cgroup's limit and
``$VIT_CONFORMANCE_MEMORY`` (``machine_memory``).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from impls import tap_names
from impls.protocol import ViTConfig
from impls.stages import tap_shapes
from weights.canonical import expected_shapes

# ``bench.fit`` to the twelve rows of docs/data/bench_verify.json (ViT-Ti to ViT-L/14 at 336; three depths,
# four token counts; three sizes in one-image cases). Memory is an upper bound of every row, least over
# them in all (a config is refused on it): at most 0.80 GB over (ViT-L/14 at 336 in one-image cases, 18%),
# 0.20 GB where the peak is under 2 GB (the interpreters' own memory moves by 0.2 GB between runs).
BASE = 8.3243e8  # bytes: the interpreters, NumPy, the port's framework
PER_TAP_ELEMENT = 3.8521  # bytes per element of the case's taps
PER_PARAMETER = 10.824  # bytes per parameter
SECONDS_PER_CASE = 0.63047  # a case's fixed cost: its Python, its files
SECONDS_PER_MEGA_PARAMETER = 0.023252  # a case's weights: drawn, written, read in both processes
SECONDS_PER_GFLOP = 0.061744  # of one image's forward
SECONDS_PER_MEGA_TAP = 0.089882  # per million elements of one image's taps


def forward_flops(config: ViTConfig, batch: int = 1) -> float:
    """Multiply-adds x 2 of a forward: the blocks' projections, MLP and attention."""
    D, N, depth = config.embed_dim, config.num_tokens, config.depth
    return 2.0 * batch * N * depth * (4 * D * D + 2 * D * config.mlp_hidden_dim + 2 * N * D)


def _counted(config: ViTConfig) -> tuple[float, float]:

    taps = sum(float(np.prod(s, dtype=np.float64)) for s in tap_shapes(config, 1).values())
    params = sum(float(np.prod(s, dtype=np.float64)) for s in expected_shapes(config).values())
    return taps, params


def sizes(config: ViTConfig) -> tuple[float, float]:
    """(elements of one image's taps, parameters), by arithmetic on the config: counted on one
    and two blocks, the blocks being alike (quick at any depth)."""
    one, two = _counted(config.replace(depth=1)), _counted(config.replace(depth=2))
    return tuple(a + (config.depth - 1) * (b - a) for a, b in zip(one, two))


# At full size verify's cases of 3 hold 2 images (1 and 2 still catch both batch bugs): every model
# mutant of the zoo, in every dtype, is located by the plan as strongly as in batches of 3, or 10x
# outside its tolerance (``zoo --cover``'s "batches", docs/data/case_cover.json), on three images fewer.
FULL_SIZE_BATCH = 2


def estimate(config: ViTConfig, batch: int | None = None) -> float:
    """Peak bytes verify and the port's process hold for ``config`` (its default cases, one at a
    time, the largest of ``batch`` images: by default the batch verify would use here)."""
    taps, params = sizes(config)
    batch = case_batch(config) if batch is None else batch
    return BASE + PER_TAP_ELEMENT * taps * batch + PER_PARAMETER * params


def case_batch(config: ViTConfig, memory: float | None = None) -> int:
    """The largest batch of verify's full-size cases: ``FULL_SIZE_BATCH``, or 1 where that would not
    fit in ``memory`` (default: this machine's). The port holds a case's taps whole (a factory
    returns them at once): ViT-g/14 at 518 emits 11.5 GB of them an image."""
    memory = machine_memory() if memory is None else memory
    return FULL_SIZE_BATCH if memory is None or estimate(config, FULL_SIZE_BATCH) <= memory else 1


def seconds(config: ViTConfig, images: int, cases: int) -> float:
    """Wall seconds of verify on ``images`` images in ``cases`` cases: each case draws, writes and
    reads a weight set; each image's matmuls go with the forward's GFLOP, its elementwise work and
    random draws with its taps."""
    taps, params = sizes(config)
    per_case = SECONDS_PER_CASE + SECONDS_PER_MEGA_PARAMETER * params / 1e6
    per_image = SECONDS_PER_GFLOP * forward_flops(config) / 1e9 + SECONDS_PER_MEGA_TAP * taps / 1e6
    return cases * per_case + images * per_image


MEMORY_ENV = "VIT_CONFORMANCE_MEMORY"  # bytes to plan for: a share of a machine, or a smaller one's


def machine_memory() -> float | None:
    """The memory verify plans for, in bytes: the least of this machine's physical memory, its
    cgroup's limit (a container's, a CI runner's) and ``$VIT_CONFORMANCE_MEMORY`` (None where
    none is known)."""
    known = []
    try:
        known.append(float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")))
    except (ValueError, OSError, AttributeError):
        pass
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            limit = Path(path).read_text().strip()
        except OSError:
            continue
        if limit.isdigit() and int(limit) < 1 << 60:  # "max", or cgroup v1's "no limit" (2^63 rounded to pages)
            known.append(float(limit))
    given = os.environ.get(MEMORY_ENV)
    if given:
        try:
            known.append(float(given))
        except ValueError:
            raise ValueError(f"${MEMORY_ENV} must be a number of bytes, got {given!r}") from None
    return min(known) if known else None


def ahead(config: ViTConfig, memory: float | None = None) -> bool:
    """Whether verify may make the next case while it judges this one (``cases.iter_plan``): a
    second float32 weight set fits beside the estimate in ``memory`` (default: this machine's)."""
    memory = machine_memory() if memory is None else memory
    return memory is not None and estimate(config, case_batch(config, memory)) + 4.0 * sizes(config)[1] <= memory


# Each stage of each case is a file on the wire and a comparison with its own error model: about
# 2.3 ms of verify's time at a small width (depth 100 and 400 at width 24, 10 cases: 40 and 93 s on
# the 2-core VM, 2026-12-04), which the fit above, made on real ViTs (at most ~1000 stages), leaves
# in its per-case cost. Beyond MAX_STAGES per case (40 times ViT-g/14's 1000; depth 1600 of the
# original ViT) a config is refused with the figure: the run would be that overhead alone.
SECONDS_PER_STAGE_CASE = 2.3e-3
MAX_STAGES = 40_000


def too_large(config: ViTConfig, memory: float | None = None) -> str | None:
    """Why verifying ``config`` would not fit in ``memory`` (default: this machine's), or has more
    stages than verify takes (``MAX_STAGES``), or None."""
    memory = machine_memory() if memory is None else memory
    taps, params = sizes(config)
    need = estimate(config, case_batch(config, memory))
    if memory is None or need <= memory:
        return _too_many_stages(config)
    return (
        f"verifying this config needs about {need / 1e9:.3g} GB ({params / 1e6:.4g} M parameters, "
        f"{config.num_tokens} tokens, {config.depth} blocks: {taps / 1e6:.4g} M tap elements per image), "
        f"more than this machine's {memory / 1e9:.3g} GB; pass --force to try anyway"
    )


def _too_many_stages(config: ViTConfig) -> str | None:

    stages = len(tap_names(config.replace(depth=1))) + (config.depth - 1) * (
        len(tap_names(config.replace(depth=2))) - len(tap_names(config.replace(depth=1)))
    )
    if stages > MAX_STAGES:
        minutes = SECONDS_PER_STAGE_CASE * stages * 10 / 60
        return (
            f"verifying this config compares {stages} stages per case ({config.depth} blocks), more than the "
            f"{MAX_STAGES} verify takes: about {minutes:.0f} min of per-stage work alone over ten cases; "
            "pass --force to try anyway"
        )
    return None
