"""The port protocol's shared parts: the input check, what a port supports (the original ViT,
the family), the loss a gradient factory computes, a gradient pass's taps, one AdamW step's
settings; the stage table's names re-exported (impls/stages.py defines the stages).

The config itself lives in weights/config.py (it defines the checkpoint's names and shapes),
so impls depends on weights and never the other way round.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from impls.stages import BLOCK, MODEL_OUT, block_taps, tap_names, tap_shapes  # noqa: F401 - re-exported
from weights.config import GLOBAL_POOLS, ConfigError, ViTConfig
from weights.presets import PRESETS, get_config
from weights.options import original_vit


class InputError(ValueError):
    """An input image batch that does not fit the model."""


class Unsupported(ValueError):
    """A port does not support a config; the message names the option and what it supports."""


# What a port of the original ViT supports (conformance.support's form): every option of the
# ViT family at the original's values (weights/options.py, where each option is defined).
ORIGINAL_VIT = original_vit()


class _Any:
    """A supports rule that allows every value of its option."""

    def __call__(self, value) -> bool:
        return True

    def __repr__(self) -> str:
        return "any"


ANY = _Any()
# What a port of the whole family supports: every option at every value (the built-in ports).
VIT_FAMILY = {option: ANY for option in ORIGINAL_VIT}


def require_original_vit(config: ViTConfig, port: str) -> None:
    beyond = config.beyond_original_vit()
    if beyond:
        raise Unsupported(
            f"config not supported by the port: the {port} port implements the original ViT, not "
            f"{', '.join(beyond)} (the float64 oracle does)"
        )


def mlp_norm_eps(config: ViTConfig) -> dict:
    """The MLP's ``norm_eps`` keyword where ``scale_mlp`` gives it a norm before fc2, else none (a
    replacement MLP, the zoo's, need not take it)."""
    return {"norm_eps": config.norm_eps} if config.scale_mlp else {}


# The stages themselves are defined once, in impls/stages.py.
BLOCK_TAPS = tuple(s.name for s in BLOCK)
ATTN_POOL_TAPS = tuple(s.name for s in MODEL_OUT if s.scope == "attn_pool")


def check_images(shape: tuple[int, ...], dtype: str, config: ViTConfig) -> None:
    """Raise InputError unless ``shape``/``dtype`` is a float32 (B, C, H, W) batch for ``config``.

    Every port calls this with its framework's shape and dtype name, so the messages agree.
    """
    C, (H, W) = config.in_chans, config.img_size
    if len(shape) != 4:
        raise InputError(f"images must have rank 4 (B, C, H, W) = (B, {C}, {H}, {W}), got shape {tuple(shape)}")
    if shape[0] < 1:
        raise InputError(f"images must hold at least one image, got shape {tuple(shape)}")
    if shape[1] != C:
        raise InputError(f"images must have {C} channels (in_chans) on axis 1, got shape {tuple(shape)}")
    if config.dynamic_img_size:
        (ph, pw) = config.patch_size
        if shape[2] < ph or shape[3] < pw or shape[2] % ph or shape[3] % pw:
            raise InputError(
                f"images must have a height divisible by {ph} and a width by {pw} (patch_size, with "
                f"dynamic_img_size) on axes 2, 3, got shape {tuple(shape)}"
            )
    elif tuple(shape[2:]) != (H, W):
        raise InputError(f"images must be {H}x{W} (img_size) on axes 2, 3, got shape {tuple(shape)}")
    dtype = str(dtype).rsplit(".", 1)[-1]  # torch.float32, mlx.core.float32 -> float32
    if dtype != "float32":
        raise InputError(f"images must be float32, got dtype {dtype}")


# What a port of packed batches supports (NaFlex: docs/verify.md, "Packed batches"): the family at any
# image size, but rotary embeddings and BEiT's bias, whose tables follow one grid for the whole batch here
NAFLEX_FAMILY = {**VIT_FAMILY, "rope_type": None, "rel_pos_bias": False, "dynamic_img_size": True}


def naflex_factory(make):
    """``make`` declared as a port of packed batches: its forward takes the dict, its supports NAFLEX_FAMILY."""

    def make_naflex(config, state, **options):
        return make(config, state, **options)

    make_naflex.supports, make_naflex.inputs = NAFLEX_FAMILY, "naflex"
    return make_naflex


def packed_rows(coord, valid) -> tuple[tuple[int, tuple[int, int]], ...]:
    """Each row of a packed batch: its patches' count and its grid (rows, columns), read from its
    coordinates (concrete arrays: a traced model takes them as a static argument)."""
    coord, valid = np.asarray(coord), np.asarray(valid)
    out = []
    for c, v in zip(coord, valid):
        n = int(v.sum())
        out.append((n, (int(c[:n, 0].max()) + 1, int(c[:n, 1].max()) + 1)))
    return tuple(out)


def check_packed(batch, config: ViTConfig) -> tuple[tuple[int, tuple[int, int]], ...]:
    """Each row's patch count and grid (``packed_rows``), or InputError unless ``batch`` is a packed
    batch for ``config``: ``patches`` (B, L, ph pw C), ``patch_coord`` (B, L, 2) integers,
    ``patch_valid`` (B, L), each row's patches first, covering its grid."""
    missing = {"patches", "patch_coord", "patch_valid"} - set(batch)
    if missing:
        raise InputError(f"a packed batch is a dict of patches, patch_coord and patch_valid: no {sorted(missing)}")
    p, c, v = (np.asarray(batch[k]) for k in ("patches", "patch_coord", "patch_valid"))
    width = config.patch_size[0] * config.patch_size[1] * config.in_chans
    if p.ndim != 3 or p.shape[2] != width or c.shape != (*p.shape[:2], 2) or v.shape != p.shape[:2]:
        raise InputError(
            f"a packed batch needs patches (B, L, {width}), patch_coord (B, L, 2), patch_valid (B, L), got "
            f"{p.shape}, {c.shape}, {v.shape}"
        )
    if not np.all(v.sum(1) > 0) or np.any(np.diff(v.astype(np.int8), axis=1) > 0):
        raise InputError("each row of a packed batch holds at least one patch, its patches before its padding")
    rows = packed_rows(c, v)
    for i, (n, (gh, gw)) in enumerate(rows):
        if n != gh * gw:
            raise InputError(f"row {i} of a packed batch holds {n} patches on a {gh}x{gw} grid (its coordinates)")
    return rows


__all__ = [
    "GLOBAL_POOLS",
    "PRESETS",
    "ConfigError",
    "InputError",
    "Unsupported",
    "ViTConfig",
    "get_config",
    "tap_names",
    "tap_shapes",
    "check_images",
    "BLOCK_TAPS",
    "ATTN_POOL_TAPS",
    "block_taps",
    "ORIGINAL_VIT",
    "VIT_FAMILY",
    "NAFLEX_FAMILY",
    "naflex_factory",
    "check_packed",
    "packed_rows",
    "ANY",
    "require_original_vit",
]


@dataclass(frozen=True, eq=False)
class Loss:
    """A scalar loss of the logits, computed by every port with its own framework's ops.

    ``cross_entropy``: the batch mean of -log softmax(logits)[label] (torch's F.cross_entropy);
    ``linear``: sum(weights * logits), a drawn linear functional whose gradient at the logits is
    ``weights`` itself, so every logit's backward path is exercised with its own weight.
    """

    kind: str
    labels: np.ndarray | None = None  # (B,) int, for cross_entropy
    weights: np.ndarray | None = None  # (B, num_classes) float, for linear

    def __post_init__(self):
        if self.kind not in ("cross_entropy", "linear"):
            raise ValueError(f"loss kind {self.kind!r}: expected 'cross_entropy' or 'linear'")
        if (self.labels is None) == (self.kind == "cross_entropy"):
            raise ValueError("cross_entropy takes labels (and no weights); linear takes weights")

    def describe(self) -> str:
        return "cross-entropy" if self.kind == "cross_entropy" else "a linear functional of the logits"


class Perturbed(dict):
    """Taps for a gradient pass: each tap's value continues the forward plus ``delta[name]``.
    A port adds zeros there and differentiates with respect to them too: the gradient of a
    zero perturbation is the cotangent dL/d(stage output) at that tap. The float64 reference
    adds noise there to propagate rounding (conformance/numerics/gradients.py). Names without a delta
    pass unchanged; ``used`` lists the taps the forward reached, in forward order."""

    def __init__(self, delta):
        super().__init__()
        self.delta, self.used = delta, []

    def perturb(self, name: str, value):
        self.used.append(name)
        return value + self.delta[name] if name in self.delta else value


@dataclass(frozen=True)
class AdamW:
    """One AdamW step's hyperparameters, as torch.optim.AdamW defines them: decoupled weight
    decay p <- p (1 - lr wd) on every parameter, then p <- p - lr m_hat / (sqrt(v_hat) + eps)
    with bias-corrected moments (docs/gradients.md tabulates where optax and MLX differ)."""

    lr: float = 1e-3
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    weight_decay: float = 1e-2
    decay: str = "all"  # "timm": timm's param_groups_weight_decay (see decays)

    def decays(self, key: str, ndim: int) -> bool:
        """Whether the parameter ``key`` (canonical or native: the rule reads only what both
        share) is decayed. "timm": not the 1-D tensors (norms, biases, LayerScale gammas), not
        a ``.bias``, not VisionTransformer.no_weight_decay()'s pos_embed, cls_token, reg_token."""
        if self.decay == "all":
            return True
        if self.decay != "timm":
            raise ValueError(f"decay {self.decay!r}: expected 'all' or 'timm'")
        return not (ndim <= 1 or key.endswith(".bias") or key in ("pos_embed", "cls_token", "reg_token", "dist_token"))
