"""One ViT configuration, with timm's keyword names and semantics: it fixes the canonical
checkpoint's names and shapes (weights/) and every port's architecture (impls/).

The options mean exactly what they mean in timm's ``VisionTransformer``:

* ``global_pool="token"`` takes the class token after the final ``norm``;
  ``global_pool="avg"`` has no final ``norm``: it averages the patch tokens (the class
  token excluded) and applies ``fc_norm`` before the head; ``final_norm=False`` has neither
  (timm's ``final_norm``: InternViT, Pixtral); ``"max"`` takes their maximum,
  ``"avgmax"`` the mean of both; ``"map"`` (SigLIP) pools the patch tokens after the final
  ``norm`` with timm's ``AttentionPoolLatent`` (``attn_pool``: a learned ``latent`` query
  attending over them, then a pre-norm MLP on its residual).
* ``class_token=False`` is not valid with ``global_pool="token"``.
* ``num_classes=0`` means no head: the logits are the pooled features.
* ``fc_norm=None`` is timm's default (``fc_norm`` with avg pooling, the final ``norm``
  otherwise); ``True``/``False`` choose: avg pooling after the final norm (big_vision's
  'gap') is ``fc_norm=False``.
* ``reg_tokens``: register tokens after the class token (DINOv2 with registers), never
  pooled; ``no_embed_class``: the position embedding covers the patches only and the prefix
  tokens are concatenated after it is added (DeiT III, DINOv2 with registers).
* ``pre_norm``: a LayerNorm ``norm_pre`` after the position embedding, and no patch-embed
  bias (CLIP); ``patch_bias`` says that bias apart (None: ``not pre_norm``, timm's coupling).
* ``init_values``: LayerScale, a per-channel ``gamma`` on each residual branch (``ls1``,
  ``ls2``; DINOv2, DeiT III); ``qk_norm``: a LayerNorm over head_dim on q and on k.
* ``act_layer``: ``gelu`` (erf), ``gelu_tanh`` (SigLIP), ``quick_gelu`` (x·σ(1.702x), OpenAI's
  CLIP), ``silu`` (the SwiGLU gate); ``proj_bias=False`` drops the biases of ``attn.proj``
  and the MLP.
* ``mlp_layer``: ``mlp`` (fc1, act, fc2), ``swiglu_packed`` (timm's ``SwiGLUPacked``, DINOv2
  giant: ``fc1`` holds the gate rows then the value rows, ``act(gate) * value``, ``fc2`` from
  half the width) or ``swiglu`` (timm's ``SwiGLU``: separate ``fc1_g`` and ``fc1_x``).
* ``dynamic_img_size``: images of any size divisible by the patch; the position embedding's
  grid is resampled at run time to theirs, bicubic with antialiasing (timm's
  ``resample_abs_pos_embed``; weights/resample.py).
* ``pos_embed``: ``learn`` (a loaded table), ``sincos`` (a fixed 2-D table computed, not loaded:
  lucidrains' SimpleViT, ``sincos_2d_pos_embed`` in impls/numpy_vit.py), ``sinusoid`` (the
  Transformer paper's 1-D table over the whole sequence, prefix tokens included) or ``none``; with
  ``sincos`` and ``none`` the prefix tokens join after it, without a position.
* ``patch_norm``: a LayerNorm (``patch_embed.patch_norm``) over each raw patch flattened as the
  conv kernel is, ``(c p1 p2)``, before the projection; ``embed_norm``: one
  (``patch_embed.norm``, timm's ``embed_norm_layer``) after it (vit-pytorch, x-transformers).
* ``pool_include_prefix``: the reducing pools take the prefix tokens too (vit-pytorch's mean).
* ``distilled``: DeiT's distillation token (``dist_token``, after the class token) and its head
  (``head_dist``); the logits are the mean of the two heads' (timm's ``VisionTransformerDistilled``
  in eval).
* ``norm_bias=False``: the model's LayerNorms (the patch norms, ``norm1``, ``norm2``, ``norm_pre``,
  ``norm``, ``fc_norm``; not qk-norm's or the attention pool's) scale without a bias
  (x-transformers).
* ``norm_layer``: those norms' kind, ``layernorm`` or ``rmsnorm`` (timm's ``RmsNorm``: no bias,
  ``x / sqrt(mean(x^2) + eps) * weight``; AIMv2).
* ``mlp_bias``: the MLP's biases apart from ``attn.proj``'s (None: as ``proj_bias``, timm's
  coupling; SimpleViT has ``proj_bias=False, mlp_bias=True``).
* ``rope_type``: timm's Eva's rotary position embedding of q and k in every block, after
  qk-norm, the prefix tokens left unrotated (impls/numpy_pos_embed.py): ``cat`` (EVA02, the axial
  rope ViTs) or ``dinov3``; ``rope_temperature`` its base, ``rope_grid_indexing`` ``ij``
  (row, column) or ``xy``, ``rope_grid_offset``, ``rope_rotate_half`` (pairs x_i, x_{i+hd/2}
  rather than neighbours) and ``ref_feat_shape`` (EVA02's rescale onto the pretraining grid) as
  timm names them; ``mixed`` (RoPE-Mixed) learns its frequencies per block and head
  (``rope.freqs``, (2, depth, heads, head_dim / 2); ``rope_temperature`` is then its init's base). LayerScale stays ``ls1.gamma``: timm's Eva's ``gamma_1`` is read as it.
* timm's Eva block (EVA02; BEiT and transformers' DINOv3 share its attention): ``k_bias=False``
  keeps q's and v's biases and gives k none (``attn.q_bias`` and ``attn.v_bias`` beside a
  bias-free ``attn.qkv``); ``qkv_fused=False`` projects q, k and v apart (``attn.q_proj``,
  ``attn.k_proj``, ``attn.v_proj``); ``scale_mlp``: a LayerNorm ``mlp.norm`` over the MLP's
  hidden features before ``fc2`` (EVA02's normed SwiGLU); ``attn_pool_num_heads``: the attention
  pool's own number of heads (Perception Encoder's 8; None: ``num_heads``).
* ``rel_pos_bias``: timm's Beit's relative position bias (``use_rel_pos_bias``): each block's
  ``attn.relative_position_bias_table`` ((2 gh - 1)(2 gw - 1) + 3, heads), gathered by the
  relative position of each query and key patch (three entries for the class token's rows),
  added to the scaled logits; one class token, no registers, the config's own grid.
* timm's VisionTransformerSAM (SAM's image encoder): ``window_size`` windows every block not in
  ``global_attn_indexes`` (the normed tokens as a (gh, gw) grid zero-padded to whole windows,
  attended window by window, the attention's output windowed until the residual);
  ``use_rel_pos`` adds to each block's logits q's products with ``attn.rel_pos_h`` and
  ``attn.rel_pos_w`` ((2 S - 1, head_dim) for S the window's side, or the grid's in a global
  block). No prefix token, no rotary embedding, the config's own grid with ``use_rel_pos``.
  ``window_partition='truncate'``: Qwen2.5-VL's windows instead, cut at the image's edge, each
  token attending its own window's tokens on the whole grid (a mask: no padding, no partition,
  rotary embeddings at each token's place in the image).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from weights.checks import FLOAT32_MAX, FLOAT32_TINY, ConfigError, pair, real  # noqa: F401 - re-exported
from weights.options import (  # noqa: F401 - the options' values, declared with them, re-exported
    ACT_LAYERS,
    BY_FIELD,
    FAMILY,
    GLOBAL_POOLS,
    MLP_LAYERS,
    NORM_LAYERS,
    OPTIONS,
    POS_EMBEDS,
    REDUCING_POOLS,
    ROPE_TYPES,
)
import json


def inline_json(text: str) -> bool:
    """Whether a --config argument is JSON itself rather than a file's path (a long inline config
    is not a path to probe: ENAMETOOLONG)."""
    return text.lstrip().startswith(("{", "["))


def config_from_json(text: str, what: str = "the config") -> "ViTConfig":
    """A ViTConfig from JSON text: an object of its fields, or a ConfigError saying what is wrong."""

    try:
        data = json.loads(text)
    except RecursionError:
        raise ConfigError(f"{what} is JSON nested too deeply to be a config") from None
    except ValueError as e:
        raise ConfigError(f"{what} is not valid JSON: {e}") from None
    return ViTConfig.from_dict(data)


# a table per block (keys, stages: about 25 each) stays under two million entries; verify's memory
# estimate (conformance.verify.budget) refuses far less deep configs, naming the figure
MAX_DEPTH = 65536


def _with_options(cls):
    """``cls``'s sizes, then every option of weights/options.py as a field of its declared type
    and default, then ``name``: the config is a frozen dataclass of them."""
    annotations = {k: v for k, v in cls.__annotations__.items() if k != "name"}
    for option in OPTIONS:
        annotations[option.field] = option.check.type
        setattr(cls, option.field, option.default)
    cls.__annotations__ = {**annotations, "name": cls.__annotations__["name"]}
    return dataclass(frozen=True)(cls)


@_with_options
class ViTConfig:
    """The sizes declared here; every option (``global_pool`` ... ``rel_pos_bias``) a field
    declared once, in weights/options.py, with its default and its check."""

    img_size: int | tuple[int, int] = 224
    patch_size: int | tuple[int, int] = 16
    in_chans: int = 3
    embed_dim: int = 768
    depth: int = 12
    num_heads: int = 12
    mlp_ratio: float = 4.0
    name: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        img = pair(self.img_size, "img_size")
        patch = pair(self.patch_size, "patch_size")
        object.__setattr__(self, "img_size", img)
        object.__setattr__(self, "patch_size", patch)
        for key in ("in_chans", "embed_dim", "depth", "num_heads"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"{key} must be a positive int, got {value!r}")
        if self.depth > MAX_DEPTH:  # before any table is built from it (a block's keys, stages, weights)
            raise ConfigError(
                f"depth must be at most {MAX_DEPTH} (the deepest published ViT, ViT-e, has 56 blocks), got "
                f"{self.depth!r}: refused before any table of its blocks is built"
            )
        for option in OPTIONS:  # each field's own value, as its option declares it
            object.__setattr__(self, option.field, option.check(getattr(self, option.field), option.field))
        if min(img) < 1 or min(patch) < 1:
            raise ConfigError(f"img_size {img} and patch_size {patch} must be positive")
        if img[0] < patch[0] or img[1] < patch[1]:
            raise ConfigError(f"img_size {img} is smaller than patch_size {patch}: no patch fits")
        # As timm's PatchEmbed: a stride-p convolution reads floor(H / p) patches and leaves the
        # remainder's pixels unread (SigLIP so400m/14 at 384: 27 x 27 patches of 378 pixels).
        if self.dynamic_img_size is True and (img[0] % patch[0] or img[1] % patch[1]):
            raise ConfigError(
                f"img_size {img} is not divisible by patch_size {patch} (remainders "
                f"{(img[0] % patch[0], img[1] % patch[1])}): dynamic_img_size takes whole patches"
            )
        if self.embed_dim % self.num_heads:
            raise ConfigError(f"embed_dim {self.embed_dim} is not divisible by num_heads {self.num_heads}")
        if not self.class_token and self.global_pool == "token":
            raise ConfigError(
                f'class_token=False needs a global_pool other than "token" ({GLOBAL_POOLS[1:]}): '
                "there is no token to pool"
            )
        real(self.mlp_ratio, "mlp_ratio")
        if not self.mlp_ratio > 0 or int(self.embed_dim * self.mlp_ratio) < 1:
            raise ConfigError(f"mlp_ratio must give a hidden width >= 1, got {self.mlp_ratio!r}")
        self._check_ports_options()
        self._check_windows()
        self._check_rope()

    def _check_rope(self) -> None:
        """timm's Eva rotary options (impls/numpy_pos_embed.py): q and k of the patch tokens rotated in
        every block, the prefix tokens not."""
        if self.ref_feat_shape is not None and self.rope_type != "cat":
            raise ConfigError(
                f"ref_feat_shape {self.ref_feat_shape} rescales rope_type='cat''s grid (EVA02): it needs "
                f"rope_type='cat', got {self.rope_type!r}"
            )
        if self.rope_type == "mixed" and (self.rope_grid_offset or self.rope_rotate_half):
            raise ConfigError(
                "rope_type='mixed' (RoPE-Mixed: learned frequencies, rope.freqs) turns neighbouring pairs at the "
                f"grid's integer coordinates: it takes no rope_grid_offset ({self.rope_grid_offset!r}) and no "
                f"rope_rotate_half ({self.rope_rotate_half!r}), as timm's RotaryEmbeddingMixed"
            )
        if self.rope_type is not None and self.head_dim % 4:
            raise ConfigError(
                f"rope_type={self.rope_type!r} rotates head_dim {self.head_dim} in pairs, half of them per grid axis: "
                "it must be a multiple of 4"
            )

    def _check_ports_options(self) -> None:
        """The rules between the options of ports as people write them (weights/options.py)."""
        if self.pos_embed == "sincos" and (self.embed_dim % 4 or self.embed_dim < 8):
            raise ConfigError(
                f"pos_embed='sincos' splits embed_dim {self.embed_dim} into sin and cos of x and y, each over "
                "at least two frequencies: it must be a multiple of 4 from 8"
            )
        if self.pos_embed_grid_size is not None and (self.pos_embed != "learn" or self.rel_pos_bias):
            raise ConfigError(
                f"pos_embed_grid_size {self.pos_embed_grid_size} is a learned table's own grid (NaFlex): "
                f"with pos_embed='learn' and no rel_pos_bias, got pos_embed={self.pos_embed!r}, "
                f"rel_pos_bias={self.rel_pos_bias!r}"
            )
        if self.pos_embed == "sinusoid" and self.embed_dim % 2:
            raise ConfigError(
                f"pos_embed='sinusoid' pairs sin and cos over embed_dim {self.embed_dim}: it must be even"
            )
        if self.distilled is True and (self.global_pool != "token" or self.reg_tokens or self.fc_norm is True):
            raise ConfigError(
                "distilled=True (DeiT's distillation token and head_dist) reads the class and distillation "
                "tokens after the final norm: it needs global_pool='token', no reg_tokens and no fc_norm=True "
                "(timm's VisionTransformerDistilled applies no fc_norm: its tokens would go unnormalised), got "
                f"{self.global_pool!r}, {self.reg_tokens!r} and {self.fc_norm!r}"
            )
        if self.mlp_layer == "swiglu_packed" and self.mlp_hidden_dim % 2:
            raise ConfigError(
                f"mlp_layer='swiglu_packed' splits fc1's {self.mlp_hidden_dim} outputs (embed_dim * "
                "mlp_ratio) into gate and value halves: it must be even"
            )
        heads = self.attn_pool_num_heads
        if heads is not None and self.embed_dim % heads:
            raise ConfigError(f"embed_dim {self.embed_dim} is not divisible by attn_pool_num_heads {heads}")
        if self.rel_pos_bias and (not self.class_token or self.num_prefix_tokens != 1 or self.dynamic_img_size):
            raise ConfigError(
                "rel_pos_bias=True (BEiT's table over the grid and the class token's three entries) needs "
                "class_token=True, no other prefix token and no dynamic_img_size, got "
                f"{self.num_prefix_tokens} prefix tokens, dynamic_img_size={self.dynamic_img_size!r}"
            )
        if not self.k_bias and not self.qkv_bias:
            raise ConfigError(
                "k_bias=False drops the key's bias beside q's and v's: it needs qkv_bias=True (with "
                "qkv_bias=False there is no bias to drop)"
            )

    def _check_windows(self) -> None:
        """SAM's windows and decomposed relative positions, Qwen2.5-VL's windows (impls/windows.py):
        over the patch grid alone."""
        if self.window_partition == "truncate":
            if not self.window_size or self.num_prefix_tokens or self.rel_pos_bias or self.use_rel_pos:
                raise ConfigError(
                    "window_partition='truncate' (Qwen2.5-VL's windows, cut at the image's edge) masks each "
                    "token's attention to its window of the patch grid: it needs window_size > 0, no prefix "
                    f"token, rel_pos_bias or use_rel_pos, got window_size={self.window_size!r}, "
                    f"{self.num_prefix_tokens} prefix tokens, rel_pos_bias={self.rel_pos_bias!r}, "
                    f"use_rel_pos={self.use_rel_pos!r}"
                )
            return
        sam = {k: v for k, v in (("window_size", self.window_size), ("use_rel_pos", self.use_rel_pos)) if v}
        if sam and (self.num_prefix_tokens or self.rope_type is not None or self.rel_pos_bias):
            raise ConfigError(
                f"{', '.join(f'{k}={v!r}' for k, v in sam.items())} (SAM's windows and relative positions) act on the "
                f"patch grid alone: no prefix token, rope_type or rel_pos_bias, got {self.num_prefix_tokens} prefix "
                f"tokens, rope_type={self.rope_type!r}, rel_pos_bias={self.rel_pos_bias!r}"
            )
        if self.use_rel_pos and self.dynamic_img_size:
            raise ConfigError(
                "use_rel_pos=True sizes a global block's attn.rel_pos_h and rel_pos_w to the config's grid: no "
                "dynamic_img_size (resampling them at another grid: no option yet)"
            )
        if self.global_attn_indexes and not self.window_size:  # an index past the last block names none (timm's)
            raise ConfigError(
                f"global_attn_indexes {list(self.global_attn_indexes)} names blocks that attend globally among "
                f"windowed ones: it needs window_size > 0, got {self.window_size}"
            )

    def block_window(self, i: int) -> int:
        """The side of block ``i``'s padded attention windows (SAM's, attended window by window); 0:
        it attends globally, or within windows cut at the edge (``block_window_cut``)."""
        if i in self.global_attn_indexes or self.window_partition != "pad":
            return 0
        return self.window_size

    def block_window_cut(self, i: int) -> int:
        """The side of block ``i``'s windows cut at the image's edge (Qwen2.5-VL's: each token attends
        its window's tokens, on the whole grid); 0: none."""
        if i in self.global_attn_indexes or self.window_partition != "truncate":
            return 0
        return self.window_size

    def rel_pos_grid(self, i: int) -> tuple[int, int]:
        """The grid block ``i``'s decomposed relative positions span: its window's, or the patch grid's."""
        w = self.block_window(i)
        return (w, w) if w else self.grid_size

    # Derived sizes, named as in timm.
    @property
    def grid_size(self) -> tuple[int, int]:
        return self.grid_at(self.img_size)

    def grid_at(self, img_size) -> tuple[int, int]:
        """The patch grid of images of ``img_size`` (H, W): what a stride-p convolution reads."""
        return (img_size[0] // self.patch_size[0], img_size[1] // self.patch_size[1])

    @property
    def num_patches(self) -> int:
        return self.grid_size[0] * self.grid_size[1]

    @property
    def pos_grid(self) -> tuple[int, int]:
        """The learned position table's grid: pos_embed_grid_size, else the images' own."""
        return self.pos_embed_grid_size or self.grid_size

    @property
    def num_relative_distance(self) -> int:
        """The relative position bias table's rows: every (dy, dx) of the grid, then the class
        token's to the patches, the patches' to it, and its own (timm's Beit)."""
        gh, gw = self.grid_size
        return (2 * gh - 1) * (2 * gw - 1) + 3

    @property
    def pool_num_heads(self) -> int:
        """The attention pool's heads (timm's Eva's attn_pool_num_heads: Perception Encoder's 8)."""
        return self.attn_pool_num_heads or self.num_heads

    @property
    def pool_skip(self) -> int:
        """The leading tokens the pooling leaves out: the prefix tokens, unless pool_include_prefix."""
        return 0 if self.pool_include_prefix else self.num_prefix_tokens

    @property
    def num_prefix_tokens(self) -> int:
        return (1 if self.class_token else 0) + (1 if self.distilled else 0) + self.reg_tokens

    @property
    def embed_len(self) -> int:
        """The position embedding's length: the patches, and the prefix tokens unless no_embed_class."""
        n = self.pos_grid[0] * self.pos_grid[1]
        return n if self.no_embed_class else n + self.num_prefix_tokens

    @property
    def patch_dim(self) -> int:
        """One flattened patch's length, C * ph * pw."""
        return self.in_chans * self.patch_size[0] * self.patch_size[1]

    @property
    def prefix_pos(self) -> bool:
        """Whether the prefix tokens get position entries (a learned table that covers them)."""
        return self.pos_embed == "learn" and not self.no_embed_class

    @property
    def use_mlp_bias(self) -> bool:
        return self.proj_bias if self.mlp_bias is None else self.mlp_bias

    @property
    def num_tokens(self) -> int:
        return self.num_patches + self.num_prefix_tokens

    @property
    def head_dim(self) -> int:
        return self.embed_dim // self.num_heads

    @property
    def mlp_hidden_dim(self) -> int:
        """fc1's output width, as timm's ``int(dim * mlp_ratio)``."""
        return int(self.embed_dim * self.mlp_ratio)

    @property
    def mlp_act_dim(self) -> int:
        """The MLP's activation width (fc2's input): half of fc1's for the packed SwiGLU."""
        return self.mlp_hidden_dim // 2 if self.mlp_layer == "swiglu_packed" else self.mlp_hidden_dim

    @property
    def use_patch_bias(self) -> bool:
        """Whether the patch projection has a bias: ``patch_bias``, else timm's ``not pre_norm`` (CLIP's has none)."""
        return not self.pre_norm if self.patch_bias is None else self.patch_bias

    @property
    def use_norm_bias(self) -> bool:
        """Whether the model's norms have a bias: a LayerNorm's unless norm_bias=False; RmsNorm has none."""
        return self.norm_bias and self.norm_layer == "layernorm"

    @property
    def use_fc_norm(self) -> bool:
        """A norm after the pooling, ``fc_norm`` (timm: by default with the reducing pools)."""
        return self.final_norm and (self.global_pool in REDUCING_POOLS if self.fc_norm is None else self.fc_norm)

    @property
    def use_final_norm(self) -> bool:
        """A norm over every token after the last block, ``norm``: where no ``fc_norm`` replaces it."""
        return self.final_norm and not self.use_fc_norm

    def beyond_original_vit(self) -> list[str]:
        """The options set beyond the original ViT (2020), as ``name=value`` (weights/options.py)."""

        beyond = []
        for name in FAMILY:
            original, value = BY_FIELD[name].original, getattr(self, name)
            if value not in (original if isinstance(original, tuple) else (original,)):
                beyond.append(f"{name}={value!r}")
        return beyond

    @property
    def num_features(self) -> int:
        return self.num_classes if self.num_classes else self.embed_dim

    def at_img_size(self, img_size) -> "ViTConfig":
        """The config a dynamic_img_size model runs as on images of ``img_size``: every derived
        size (grid, tokens) at that size; the weights keep the shapes of ``self``."""
        img_size = pair(img_size, "img_size")
        if img_size == self.img_size:
            return self
        if not self.dynamic_img_size:
            raise ConfigError(f"img_size {self.img_size} is fixed: images of {img_size} need dynamic_img_size=True")
        return self.replace(img_size=img_size)

    def replace(self, **changes: Any) -> "ViTConfig":
        return replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["img_size"] = list(self.img_size)
        d["patch_size"] = list(self.patch_size)
        d.pop("name")
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "ViTConfig":
        if not isinstance(d, Mapping):
            raise ConfigError(f"a config must be a JSON object of ViTConfig fields, got {type(d).__name__}: {d!r:.80}")
        known = {f for f in cls.__dataclass_fields__}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ConfigError(f"unknown ViTConfig options {unknown}; known: {sorted(known)}")
        d = dict(d)
        for key in ("img_size", "patch_size"):
            if isinstance(d.get(key), list):
                d[key] = tuple(d[key])
        return cls(**d)
