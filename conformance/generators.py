"""The deterministic generators verify, the calibrations and the strategies share: images of each
kind, seeded and trained-like weights, a standalone attention's inputs, all from a seed. No
hypothesis here (conformance.strategies draws their seeds and kinds): verify's cases are made from
these without it."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from impls.protocol import ViTConfig
from weights import init_params, init_state
from weights.canonical import qkv_rows

IMAGE_KINDS = ("ordinary", "tiny", "huge", "constant", "near_constant")


@dataclass(frozen=True)
class ImageCase:
    kind: str
    seed: int
    batch: int
    grid: tuple[int, int] | None = None  # a dynamic_img_size model's images: this patch grid

    def make(self, config: ViTConfig) -> np.ndarray:
        return make_images(config, self.batch, self.kind, self.seed, self.grid)


def make_images(config: ViTConfig, batch: int, kind: str, seed: int, grid=None) -> np.ndarray:
    """Images for ``config``; a dynamic_img_size config takes them on another patch ``grid``."""
    rng = np.random.default_rng(seed)
    size = config.img_size
    if grid is not None and config.dynamic_img_size:
        size = (grid[0] * config.patch_size[0], grid[1] * config.patch_size[1])
    shape = (batch, config.in_chans, *size)
    if kind == "ordinary":
        x = rng.normal(0.0, 1.0, shape)
    elif kind == "tiny":
        x = rng.normal(0.0, 1e-3, shape)
    elif kind == "huge":
        x = rng.normal(0.0, 1e3, shape)
    elif kind == "constant":
        x = np.broadcast_to(rng.normal(0.0, 1.0, (batch, config.in_chans, 1, 1)), shape)
    elif kind == "near_constant":
        # The variance LayerNorm sees is tiny, where an epsilon mismatch shows.
        x = rng.normal(0.0, 1.0, (batch, config.in_chans, 1, 1)) + rng.normal(0.0, 1e-4, shape)
    else:
        raise ValueError(f"unknown image kind {kind!r}; kinds: {IMAGE_KINDS}")
    return np.ascontiguousarray(x, dtype=np.float32)


def _patch_bias(config: ViTConfig) -> str:
    """The bias of the patch embedding's last step: its norm's, or the projection's."""
    return "patch_embed.norm.bias" if config.embed_norm else "patch_embed.proj.bias"


def add_patch_offset(state: dict[str, np.ndarray], config: ViTConfig, offset: float) -> None:
    """A common offset on every patch token: through the bias of the patch embedding's last step
    (its norm's, or the projection's), or where there is none (pre_norm) through the patch entries
    of the position embedding, if it has a learned one."""
    if not offset:
        return
    last = _patch_bias(config)
    if last in state:
        state[last] = state[last] + np.float32(offset)
    elif "pos_embed" in state:
        pos = state["pos_embed"].copy()
        pos[:, 0 if config.no_embed_class else config.num_prefix_tokens :] += np.float32(offset)
        state["pos_embed"] = pos


@dataclass(frozen=True)
class WeightCase:
    seed: int
    scale: float
    offset: float = 0.0  # added to the patch bias: a residual stream with a large common mean

    def make(self, config: ViTConfig) -> dict[str, np.ndarray]:
        state = init_state(config, seed=self.seed, scale=self.scale)
        if self.offset:
            add_patch_offset(state, config, self.offset)
        return state

    def make_params(self, shapes) -> dict[str, np.ndarray]:
        return init_params(shapes, seed=self.seed, scale=self.scale)


@dataclass(frozen=True)
class TrainedLike:
    """Weights conditioned like a trained ViT's, where float32 and bf16 errors are largest:

    * **massive activations**: two channels of the class token and of one patch token carry
      ``massive`` (hundreds, through ``pos_embed``), the high-norm tokens of trained ViTs
      (Darcet et al. 2023, "Vision Transformers Need Registers"; Sun et al. 2024, "Massive
      Activations in Large Language Models"), so those tokens' LayerNorms see a mean and an
      rms far above their spread;
    * a **common offset** of every patch token (``offset``, through the patch bias);
    * **attention logits into the hundreds**: in every block, head 0's key rows equal its query
      rows, scaled so that no token's logit against itself exceeds about ``logit``;
    * **spread LayerNorm parameters**: γ log-normal over about 0.2 to 5 with random signs,
      β of spread 0.5.
    """

    seed: int
    massive: float = 300.0
    logit: float = 1000.0
    offset: float = 30.0

    def make(self, config: ViTConfig) -> dict[str, np.ndarray]:
        rng = np.random.default_rng(self.seed)
        state = init_state(config, seed=self.seed)
        D, hd = config.embed_dim, config.head_dim
        for key in list(state):
            if key.endswith(("norm1.weight", "norm2.weight")) or key in (
                "norm.weight",
                "fc_norm.weight",
                "norm_pre.weight",
                "patch_embed.norm.weight",
            ):
                gamma = np.exp(rng.normal(0.0, 0.8, D)) * rng.choice([-1.0, 1.0], D)
                state[key] = gamma.astype(np.float32)
                bias_key = key[: -len("weight")] + "bias"
                if bias_key in state:  # (norm_bias=False: none)
                    state[bias_key] = rng.normal(0.0, 0.5, D).astype(np.float32)
        channels = rng.choice(D, size=min(2, D), replace=False)
        if "pos_embed" in state:
            pos = state["pos_embed"].copy()
            first_patch = 0 if config.no_embed_class else config.num_prefix_tokens  # pos_embed's first patch entry
            tokens = [0, first_patch + int(rng.integers(config.pos_grid[0] * config.pos_grid[1]))]  # the table's
            for t in dict.fromkeys(tokens):
                pos[0, t, channels] += self.massive * rng.choice([-1.0, 1.0], len(channels))
            state["pos_embed"] = pos.astype(np.float32)
        else:  # no table to single out a patch: every patch token carries them
            last = _patch_bias(config)
            if last in state:
                bias = state[last].copy()
                bias[channels] += self.massive * rng.choice([-1.0, 1.0], len(channels))
                state[last] = bias.astype(np.float32)
        if not config.prefix_pos and config.class_token:  # the class token itself carries it
            cls = state["cls_token"].copy()
            cls[0, 0, channels] += self.massive * rng.choice([-1.0, 1.0], len(channels))
            state["cls_token"] = cls.astype(np.float32)
        add_patch_offset(state, config, self.offset)
        for i in range(config.depth):
            # A norm1 output is g * x_hat + b with |x_hat|^2 = D, so no token's |x|^2 exceeds
            # D max(g^2) + |b|^2; q = W x with rows of spread sigma gives a self-logit
            # sqrt(hd) sigma^2 |x|^2, which this sigma keeps below `logit` (measured: the largest
            # logit of a block lands between about a twentieth of it and all of it).
            g, b = state[f"blocks.{i}.norm1.weight"], state.get(f"blocks.{i}.norm1.bias", np.zeros(D, np.float32))
            top = D * float(np.max(g.astype(np.float64) ** 2)) + float(np.sum(b.astype(np.float64) ** 2))
            sigma = np.sqrt(self.logit / (np.sqrt(hd) * top))
            rows = qkv_rows(state, f"blocks.{i}.attn", D)
            head0 = rng.normal(0.0, sigma, (hd, D))  # head 0's q and k rows: one matrix
            for key, first in (rows["q"][0], rows["k"][0]):
                w = state[key].copy()
                w[first : first + hd] = head0
                state[key] = w.astype(np.float32)
        return state


def with_block0_logit(
    config: ViTConfig, state: dict[str, np.ndarray], images: np.ndarray, target: float
) -> dict[str, np.ndarray]:
    """``state`` with block 0's head-0 query and key rows (and biases) rescaled so that its
    largest attention logit on ``images`` is ``target``: the scaled logits stay in float16's
    range (65504) while the unscaled q k^T leaves it for target * sqrt(head_dim) > 65504."""
    from impls import numpy_vit

    # block 0 alone computes its q and k as the whole model does (a full-size model's taps are not made)
    first = {k: v for k, v in state.items() if not k.startswith("blocks.") or k.startswith("blocks.0.")}
    if "rope.freqs" in first:  # RoPE-Mixed's, per block
        first["rope.freqs"] = first["rope.freqs"][:, :1]
    taps = numpy_vit.make(config.replace(depth=1), first)(images)
    q, k = taps["blocks.0.attn.q"][:, 0], taps["blocks.0.attn.k"][:, 0]
    current = float((q @ np.swapaxes(k, -2, -1)).max()) * config.head_dim**-0.5
    factor = np.float32(np.sqrt(target / current)) if current > 0 else np.float32(1.0)
    D, hd = config.embed_dim, config.head_dim
    state = dict(state)
    for part in ("q", "k"):  # head 0's rows of q and k, weights and biases, wherever they are
        for where in qkv_rows(state, "blocks.0.attn", D)[part]:
            if where is not None:
                key, first = where
                t = state[key].copy()
                t[first : first + hd] *= factor
                state[key] = t
    return state


# Weight scales (multiplying timm's init spread): up to 128x, where attention logits reach
# the hundreds and softmax saturates.
SCALES = (0.5, 1.0, 4.0, 16.0, 64.0, 128.0)
# A large common mean in every token, 100 to 3000 times the token's spread: float32 holds the
# spread less finely (the error model's LayerNorm term grows as rms / spread); it is where a
# LayerNorm that computes E[x^2] - E[x]^2 fails, its error growing with the square of that ratio.
OFFSET = 1000.0
OFFSET_SCALES = (4.0, 16.0)


@dataclass(frozen=True)
class AttentionShape:
    """Shapes and seed of a standalone multi-head (cross-)attention."""

    batch: int
    num_heads: int
    head_dim: int
    dim: int
    q_len: int
    kv_len: int
    context_dim: int
    qkv_bias: bool
    seed: int

    @property
    def options(self) -> dict:
        """The attention protocol's keywords for this shape (impls.protocol.mha_shapes' too)."""
        return {k: getattr(self, k) for k in ("dim", "context_dim", "num_heads", "head_dim", "qkv_bias")}

    def inputs(self, scale: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
        rng = np.random.default_rng(self.seed)
        x = rng.normal(0.0, scale, (self.batch, self.q_len, self.dim)).astype(np.float32)
        ctx = rng.normal(0.0, scale, (self.batch, self.kv_len, self.context_dim)).astype(np.float32)
        return x, ctx
