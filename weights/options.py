"""The ViT family's options, each defined once: its ``ViTConfig`` field and default, the values
the original ViT (2020) has (what a port that declares nothing is checked as), the values each
checkpoint layout can hold, and its names in timm, Hugging Face transformers, big_vision and
open_clip, and the values the property suite draws. Everything that speaks of an option reads this
table: ``ViTConfig.beyond_original_vit``, ``impls.ORIGINAL_VIT`` and ``VIT_FAMILY``, the .npz,
open_clip and Hugging Face layouts' refusals, ``conformance.strategies.family_options`` and
docs/model.md's option table (generated; ``python -m conformance docs``). The values a few-named
field takes (``GLOBAL_POOLS``, ``ACT_LAYERS`` ...) are declared here too; ``ViTConfig`` validates
against them. A field's type and
its validation are ``ViTConfig``'s (weights/config.py), which a test keeps in step with this
table; docs/model.md's "Adding an option" says what else an option touches.

``holds`` names a layout by its registry name (``npz``: the original ViT's and big_vision's
.npz; ``open_clip``) or ``hf:MODEL_TYPE`` for a Hugging Face model; a layout not named holds
every value of the option.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from weights.checks import Check, count, flag, grid, indexes, number, one_of

# the values an option's field takes, where they are a few names
GLOBAL_POOLS = ("token", "avg", "avgmax", "max", "map")
POS_EMBEDS = ("learn", "sincos", "sinusoid", "none")
ROPE_TYPES = ("cat", "dinov3", "mixed", "pixtral")  # timm's rope_type, and Pixtral's; 'mrope' not yet
REDUCING_POOLS = ("avg", "avgmax", "max")  # timm: these take fc_norm by default
ACT_LAYERS = ("gelu", "gelu_tanh", "quick_gelu", "silu")
MLP_LAYERS = ("mlp", "swiglu_packed", "swiglu")
NORM_LAYERS = ("layernorm", "rmsnorm")  # timm's norm_layer by name

# the Hugging Face models of the ViT family's layouts (weights/hf/family.py, dinov3.py, beit.py)
DINOV3 = "hf:dinov3_vit"
BEIT = "hf:beit"
SIGLIP2 = "hf:siglip2_vision_model"
HF_FAMILY = ("hf:dinov2", "hf:dinov2_with_registers", "hf:clip_vision_model", "hf:siglip_vision_model", DINOV3, BEIT)
HF_FAMILY += (SIGLIP2,)

# the attention output's bias and the MLP's (timm couples them: proj_bias)
ATTN_OUT_BIAS, MLP_BIAS = r"blocks\.\d+\.attn\.proj\.bias", r"blocks\.\d+\.mlp\.fc[12](_[gx])?\.bias"
# float32's integers are exact to 2^24: beyond, neighbouring grid coordinates round to one value
_EXACT_GRID = "beyond, float32 rounds neighbouring grid coordinates to one value: no port can tell the positions apart"


@dataclass(frozen=True)
class Option:
    field: str
    default: Any
    original: Any  # the original ViT's values, in conformance.support's form: a value or a tuple of values
    doc: str
    holds: dict[str, tuple] = field(default_factory=dict)  # layout -> the values it can hold
    hf: str | None = None  # the transformers config's name for it, where one has it
    big_vision: str | None = None
    open_clip: str | None = None
    family: bool = True  # False: an option of the original ViT itself (every layout's question, not a port's)
    timm_name: str | None = ""  # timm's keyword where it is not the field's name; None: timm has none
    # the values the property suite draws for it (a value repeated to draw it more often); () for the
    # sizes and the original ViT's own options, which conformance.strategies.configs draws itself
    draws: tuple = ()
    check: Check = flag()  # what the field's value may be (weights/checks.py), run by ViTConfig
    # each (a canonical key pattern, what a model without those keys lacks, the setting that
    # expresses it): verify's line for a model the config names a part of that it does not have
    lacks: tuple[tuple[str, str, str], ...] = ()
    # (the setting, the config changes that add canonical keys, the option's own first): verify's
    # line for a mapping that reads a key only this option adds
    adds: tuple[str, dict] | None = None

    @property
    def timm(self) -> str | None:
        """timm's ``VisionTransformer`` keyword: the field's own name unless the table says otherwise."""
        return self.field if self.timm_name == "" else self.timm_name


def _every(value, *layouts) -> dict[str, tuple]:
    return dict.fromkeys(layouts, value)


def _only(value, but: dict[str, tuple | None] | None = None) -> dict[str, tuple]:
    """An option no layout but the canonical one holds other than ``value`` (big_vision's npz,
    open_clip, every Hugging Face family), ``but`` those it names (None: every value)."""
    out = {**_every((value,), "npz", "open_clip", *HF_FAMILY), **(but or {})}
    return {layout: values for layout, values in out.items() if values is not None}


OPTIONS: tuple[Option, ...] = (
    Option(
        "global_pool",
        "token",
        ("token", "avg"),
        "how the tokens become one vector: the class token, the patch tokens' mean ('avg'), 'max', 'avgmax', "
        "or SigLIP's attention pool ('map')",
        holds={
            "open_clip": ("token",),
            "hf:dinov2": ("token",),
            "hf:dinov2_with_registers": ("token",),
            "hf:clip_vision_model": ("token",),
            "hf:siglip_vision_model": ("map",),
            DINOV3: ("token",),
            BEIT: ("token", "avg"),
            SIGLIP2: ("map",),
        },
        big_vision="pool_type",
        open_clip="pool_type",
        check=one_of(GLOBAL_POOLS),
    ),
    Option(
        "class_token",
        True,
        (True, False),
        "a learned class token before the patches",
        holds={
            "open_clip": (True,),
            "hf:dinov2": (True,),
            "hf:dinov2_with_registers": (True,),
            "hf:clip_vision_model": (True,),
            "hf:siglip_vision_model": (False,),
            DINOV3: (True,),
            BEIT: (True,),
            SIGLIP2: (False,),
        },
        family=False,
        check=flag(),
        lacks=((r"cls_token", "it has no class token", "class_token=false (with global_pool='avg')"),),
        adds=("class_token=true", dict(class_token=True)),
    ),
    Option(
        "num_classes",
        1000,
        None,
        "the head's width; 0: no head, the logits are the pooled features",
        holds=_every((0,), "hf:dinov2", "hf:dinov2_with_registers", "hf:siglip_vision_model", DINOV3, SIGLIP2),
        hf="num_labels",
        family=False,
        check=count(0),
    ),
    Option(
        "qkv_bias",
        True,
        (True, False),
        "the q, k and v projections' bias",
        holds=_every((True,), "open_clip", "hf:clip_vision_model", "hf:siglip_vision_model", BEIT, SIGLIP2),
        hf="qkv_bias",
        family=False,
        check=flag(),
        lacks=((r"blocks\.\d+\.attn\.qkv\.bias", "its q, k and v projections have no bias", "qkv_bias=false"),),
        adds=("qkv_bias=true", dict(qkv_bias=True)),
    ),
    Option(
        "norm_eps",
        1e-6,
        None,
        "every LayerNorm's eps (timm's ViTs: 1e-6)",
        hf="layer_norm_eps",
        family=False,
        check=number(0, 1),
    ),
    Option(
        "reg_tokens",
        0,
        0,
        "register tokens after the class token, never pooled (DINOv2 with registers)",
        holds=_every(
            (0,), "npz", "open_clip", "hf:dinov2", "hf:clip_vision_model", "hf:siglip_vision_model", BEIT, SIGLIP2
        ),
        hf="num_register_tokens",
        draws=(0, 0, 1, 2),
        check=count(0),
        lacks=((r"reg_token", "it has no register tokens", "reg_tokens=0"),),
        adds=("reg_tokens > 0", dict(reg_tokens=1, distilled=False)),
    ),
    Option(
        "no_embed_class",
        False,
        False,
        "the position table covers the patches only; the prefix tokens join after it is added",
        holds={
            "open_clip": (False,),
            "hf:dinov2": (False,),
            "hf:dinov2_with_registers": (True,),
            "hf:clip_vision_model": (False,),
            "hf:siglip_vision_model": (False,),
            DINOV3: (False,),
            BEIT: (False,),
            SIGLIP2: (False, True),  # no prefix token: the same table either way
        },
        draws=(False, True),
        check=flag(),
    ),
    Option(
        "pre_norm",
        False,
        False,
        "a LayerNorm (norm_pre) after the position embedding, and no patch-embedding bias (CLIP)",
        holds={
            "npz": (False,),
            "open_clip": (True,),
            "hf:dinov2": (False,),
            "hf:dinov2_with_registers": (False,),
            "hf:siglip_vision_model": (False,),
            DINOV3: (False,),
            BEIT: (False,),
            SIGLIP2: (False,),
        },
        open_clip="no_ln_pre (its negation)",
        draws=(False, True),
        check=flag(),
        adds=("pre_norm=true", dict(pre_norm=True)),
    ),
    Option(
        "patch_bias",
        None,
        (None,),
        "the patch projection's bias, patch_embed.proj.bias (None: timm's coupling, none with pre_norm; False: "
        "none without a norm_pre either, as Qwen2-VL's and Pixtral's bias-free patch convolutions)",
        holds=_only(None),
        timm_name=None,
        draws=(None, None, False),
        check=flag(none="not pre_norm, timm's coupling"),
        lacks=((r"patch_embed\.proj\.bias", "its patch embedding has no bias", "patch_bias=false"),),
        adds=("patch_bias=true", dict(patch_bias=True)),
    ),
    Option(
        "fc_norm",
        None,
        (None,),
        "the final norm after the pooling (None: timm's default, after it for the reducing pools)",
        holds={**_every((None, False), "open_clip", *HF_FAMILY), BEIT: (None,)},
        draws=(None, None, True, False),
        check=flag(none="timm's default"),
    ),
    Option(
        "final_norm",
        True,
        True,
        "a final norm, norm (or fc_norm after the pooling); False: none, the last block's tokens pooled as they "
        "are (InternViT, Pixtral, Qwen2-VL, timm's final_norm=False)",
        holds=_only(True),
        draws=(True, True, True, False),
        check=flag(),
        lacks=((r"(norm|fc_norm)\.weight", "it has no final norm", "final_norm=false"),),
        adds=("final_norm=true", dict(final_norm=True)),
    ),
    Option(
        "init_values",
        None,
        (None,),
        "LayerScale: a per-channel gamma on each residual branch, initialised to this (DINOv2, DeiT III)",
        holds=_every((None,), "npz", "hf:clip_vision_model", "hf:siglip_vision_model", SIGLIP2),
        hf="layerscale_value",
        open_clip="ls_init_value",
        draws=(None, 1e-5),
        check=number(0, none="no LayerScale"),
        lacks=((r"blocks\.\d+\.ls[12]\.gamma", "its residual branches have no LayerScale", "init_values=null"),),
        adds=("init_values", dict(init_values=1e-5)),
    ),
    Option(
        "qk_norm",
        False,
        False,
        "a LayerNorm over head_dim on q and on k",
        holds=_only(False),
        draws=(False, True),
        check=flag(),
        lacks=((r"blocks\.\d+\.attn\.[qk]_norm\.(weight|bias)", "it normalises neither q nor k", "qk_norm=false"),),
        adds=("qk_norm=true", dict(qk_norm=True)),
    ),
    Option(
        "act_layer",
        "gelu",
        "gelu",
        "the MLP's activation: 'gelu' (erf), 'gelu_tanh' (SigLIP), 'quick_gelu' (OpenAI's CLIP), 'silu' (SwiGLU)",
        hf="hidden_act",
        open_clip="act_layer",
        draws=ACT_LAYERS,
        check=one_of(ACT_LAYERS),
    ),
    Option(
        "proj_bias",
        True,
        True,
        "the biases of the attention output and the MLP's projections",
        holds=_only(True, {DINOV3: None}),
        draws=(False, True),
        check=flag(),
        lacks=((ATTN_OUT_BIAS, "its attention output has no bias", "proj_bias=false"),),
        adds=("proj_bias=true", dict(proj_bias=True, mlp_bias=False)),
    ),
    Option(
        "mlp_layer",
        "mlp",
        "mlp",
        "the MLP: fc1, act, fc2 ('mlp'), timm's SwiGLUPacked (DINOv2 giant) or SwiGLU",
        holds={
            **_every(("mlp",), "npz", "open_clip", "hf:clip_vision_model", "hf:siglip_vision_model", SIGLIP2),
            DINOV3: ("mlp", "swiglu"),
            BEIT: ("mlp",),
        },
        hf="use_swiglu_ffn",
        draws=MLP_LAYERS,
        check=one_of(MLP_LAYERS),
    ),
    Option(
        "dynamic_img_size",
        False,
        False,
        "images of any size divisible by the patch, the position table resampled to their grid",
        draws=(False, True),
        check=flag(),
    ),
    Option(
        "pos_embed",
        "learn",
        "learn",
        "the position embedding: a learned table ('learn'), the fixed 2-D sin-cos table of SimpleViT computed "
        "at the grid ('sincos'), the Transformer paper's 1-D sinusoidal table over the sequence ('sinusoid'), "
        "or none ('none')",
        holds=_only("learn", {DINOV3: ("none",), BEIT: ("learn", "none")}),
        draws=("learn", "learn", "sincos", "sinusoid", "none"),
        check=one_of(POS_EMBEDS),
        lacks=(
            (
                r"pos_embed",
                "it has no learned position table",
                "pos_embed='sincos' (SimpleViT's fixed 2-D table, computed at the grid), pos_embed='sinusoid' (the "
                "Transformer paper's 1-D table over the sequence) or pos_embed='none'",
            ),
        ),
        adds=("pos_embed='learn'", dict(pos_embed="learn")),
    ),
    Option(
        "patch_norm",
        False,
        False,
        "a LayerNorm over each raw patch, flattened (c p1 p2), before the projection (vit-pytorch, x-transformers)",
        holds=_only(False),
        timm_name=None,
        draws=(False, True),
        check=flag(),
        adds=("patch_norm=true", dict(patch_norm=True)),
    ),
    Option(
        "embed_norm",
        False,
        False,
        "a LayerNorm after the patch projection, patch_embed.norm (vit-pytorch, x-transformers)",
        holds=_only(False),
        timm_name="embed_norm_layer",
        draws=(False, True),
        check=flag(),
        adds=("embed_norm=true", dict(embed_norm=True)),
    ),
    Option(
        "pool_include_prefix",
        False,
        False,
        "the pools read the class and register tokens too (vit-pytorch's 'mean'; the attention pool of timm's Eva)",
        holds=_only(False),
        draws=(False, True),
        check=flag(),
    ),
    Option(
        "distilled",
        False,
        False,
        "DeiT's distillation token (dist_token, after the class token) and head (head_dist); the logits the mean "
        "of both heads'",
        holds=_only(False),
        timm_name="VisionTransformerDistilled (a class)",
        draws=(False, True),
        check=flag(),
        lacks=((r"dist_token|head_dist\.(weight|bias)", "it has no distillation token and head", "distilled=false"),),
        adds=("distilled=true", dict(distilled=True, global_pool="token", class_token=True, reg_tokens=0)),
    ),
    Option(
        "norm_bias",
        True,
        True,
        "the LayerNorms' bias (False: scale only, x-transformers; not qk-norm's or the attention pool's)",
        holds=_only(True),
        timm_name="norm_layer",
        draws=(True, True, False),
        check=flag(),
        lacks=(
            (
                r"(blocks\.\d+\.norm[12]|norm|fc_norm|norm_pre|patch_embed\.(patch_)?norm)\.bias",
                "its LayerNorms have no bias (a bias-free norm)",
                "norm_bias=false",
            ),
        ),
        adds=("norm_bias=true", dict(norm_bias=True)),
    ),
    Option(
        "norm_layer",
        "layernorm",
        "layernorm",
        "the model's norms (the patch norms, norm1, norm2, norm_pre, norm, fc_norm; not qk-norm's, the MLP's or "
        "the attention pool's): 'layernorm', or 'rmsnorm', timm's RmsNorm, x / sqrt(mean(x^2) + eps) * weight, "
        "no bias (AIMv2)",
        holds=_only("layernorm"),
        timm_name="norm_layer (a class: RmsNorm)",
        draws=("layernorm", "layernorm", "rmsnorm"),
        check=one_of(NORM_LAYERS),
    ),
    Option(
        "mlp_bias",
        None,
        (None,),
        "the MLP's biases on their own (None: as proj_bias, timm's coupling; SimpleViT: proj_bias=False, "
        "mlp_bias=True)",
        holds=_only(None, {DINOV3: None}),
        timm_name=None,
        draws=(None, None, True, False),
        check=flag(none="as proj_bias"),
        lacks=((MLP_BIAS, "its MLP has no biases", "mlp_bias=false"),),
        adds=("mlp_bias=true", dict(mlp_bias=True)),
    ),
    # timm's Eva (eva.py): rotary position embeddings in every block's attention (impls/numpy_pos_embed.py)
    Option(
        "rope_type",
        None,
        None,
        "rotary position embeddings of q and k (the prefix tokens left unrotated): None, 'cat' (EVA02, the "
        "axial rope ViTs), 'dinov3' (DINOv3's centred coordinates and periods), 'mixed' (RoPE-Mixed's "
        "learned frequencies, rope.freqs) or 'pixtral' (Pixtral's bands, the even ones the row's)",
        holds=_only(None, {DINOV3: ("dinov3",)}),
        timm_name="rope_type (Eva)",
        draws=(None, None, "cat", "dinov3", "mixed", "pixtral"),
        check=one_of(ROPE_TYPES, none="no rotary embedding"),
    ),
    Option(
        "rope_temperature",
        10000.0,
        10000.0,
        "the rotary bands' base",
        holds=_only(10000.0, {DINOV3: None}),
        timm_name="rope_temperature (Eva)",
        draws=(10000.0, 100.0),
        check=number(0),
    ),
    Option(
        "rope_grid_indexing",
        "ij",
        "ij",
        "the rotary grid's coordinates as (row, column), 'ij', or (column, row), 'xy'",
        holds=_only("ij"),
        timm_name="rope_grid_indexing (Eva)",
        draws=("ij", "xy"),
        check=one_of(("ij", "xy")),
    ),
    Option(
        "rope_grid_offset",
        0.0,
        0.0,
        "added to the rotary grid's coordinates",
        holds=_only(0.0),
        timm_name="rope_grid_offset (Eva)",
        draws=(0.0, 0.0, 1.0),
        check=number(within=2**24, why=_EXACT_GRID),
    ),
    Option(
        "rope_rotate_half",
        False,
        False,
        "the rotation's pairs: (x_i, x_{i + hd/2}) (True, DINOv3) or neighbours (x_2i, x_2i+1)",
        holds=_only(False, {DINOV3: (True,)}),
        timm_name="rope_rotate_half (Eva)",
        draws=(False, True),
        check=flag(),
    ),
    Option(
        "ref_feat_shape",
        None,
        None,
        "EVA02's rescale of the rotary grid onto the pretraining grid",
        holds=_only(None),
        timm_name="ref_feat_shape (Eva)",
        draws=(None, None, (3, 5)),
        check=grid(none="the images' grid"),
    ),
    # timm's Eva block (eva.py): EVA02; BEiT and transformers' DINOv3 share its attention's biases
    Option(
        "k_bias",
        True,
        True,
        "the key's bias beside q's and v's (False: attn.q_bias and attn.v_bias, k none; EVA02, BEiT)",
        holds=_only(True, {DINOV3: None, BEIT: (False,)}),
        timm_name="qkv_bias (Eva's attention: q and v only)",
        draws=(True, True, False),
        check=flag(),
        lacks=(
            (
                r"blocks\.\d+\.attn\.[qv]_bias",
                "its q and v have no biases apart from a qkv's",
                "k_bias=true (or qkv_bias=false)",
            ),
            (r"blocks\.\d+\.attn\.k_proj\.bias", "its key projection has no bias", "k_bias=false"),
        ),
        adds=("k_bias=false", dict(k_bias=False, qkv_bias=True)),
    ),
    Option(
        "qkv_fused",
        True,
        True,
        "q, k and v from one projection, attn.qkv (False: attn.q_proj, attn.k_proj and attn.v_proj; EVA02 B, L)",
        holds=_only(True, {DINOV3: (False,)}),
        timm_name="qkv_fused (Eva)",
        draws=(True, True, False),
        check=flag(),
        adds=("qkv_fused=false", dict(qkv_fused=False)),
    ),
    Option(
        "scale_mlp",
        False,
        False,
        "a LayerNorm over the MLP's hidden features before fc2, mlp.norm (EVA02's normed SwiGLU)",
        holds=_only(False),
        timm_name="scale_mlp (Eva)",
        draws=(False, True),
        check=flag(),
        lacks=((r"blocks\.\d+\.mlp\.norm\.(weight|bias)", "its MLP has no norm before fc2", "scale_mlp=false"),),
        adds=("scale_mlp=true", dict(scale_mlp=True)),
    ),
    Option(
        "attn_pool_num_heads",
        None,
        (None,),
        "the attention pool's heads (None: num_heads; Perception Encoder: 8)",
        holds=_only(None),
        timm_name="attn_pool_num_heads (Eva)",
        draws=(None, None, 1, 2),
        check=count(1, none="num_heads"),
    ),
    # timm's NaFlexVit (naflexvit.py): one learned table for every image size
    Option(
        "pos_embed_grid_size",
        None,
        None,
        "the learned table's own grid where it is not the images' (NaFlex: 16 x 16 at every image size), "
        "resampled to each image's grid as timm resamples it (bicubic, antialiased)",
        holds=_only(
            None, {SIGLIP2: None, "npz": None}
        ),  # big_vision's NaFlex ViT: layouts/big_vision.py checks the rest
        timm_name="pos_embed_grid_size (NaFlexVit)",
        check=grid(none="the images' grid"),
    ),
    Option(
        "pos_embed_interp_mode",
        "bicubic",
        "bicubic",
        "how a learned table is resampled to another grid, antialiased: 'bicubic' (timm) or 'bilinear' "
        "(SigLIP 2, timm's NaFlex SigLIP)",
        holds=_only("bicubic", {SIGLIP2: ("bilinear",), "npz": ("bicubic", "bilinear")}),
        timm_name="pos_embed_interp_mode (NaFlexVit)",
        check=one_of(("bicubic", "bilinear")),
    ),
    # timm's Beit (beit.py): BEiT's relative position bias in every block's attention
    Option(
        "rel_pos_bias",
        False,
        False,
        "a learned relative position bias added to each block's attention logits, "
        "attn.relative_position_bias_table (BEiT; usually with pos_embed='none')",
        holds=_only(False, {BEIT: None}),
        hf="use_relative_position_bias",
        timm_name="use_rel_pos_bias (Beit)",
        draws=(False, False, False, True),
        check=flag(),
    ),
    # timm's VisionTransformerSAM (SAM's image encoder, ViTDet): windows and decomposed relative positions
    Option(
        "window_size",
        0,
        0,
        "window attention: each block not in global_attn_indexes attends within non-overlapping window_size x "
        "window_size windows of the patch grid, zero-padded to a whole number of them (SAM's image encoder); "
        "0: every block attends globally",
        holds=_only(0),
        hf="window_size",
        timm_name="window_size (VisionTransformerSAM)",
        draws=(0, 0, 0, 0, 0, 0, 2, 3),
        check=count(0),
    ),
    Option(
        "global_attn_indexes",
        (),
        ((),),
        "the blocks that attend globally where window_size windows the others (SAM ViT-B: 2, 5, 8, 11)",
        holds=_only(()),
        hf="global_attn_indexes",
        timm_name="global_attn_indexes (VisionTransformerSAM)",
        draws=((), (0,)),
        check=indexes(),
    ),
    Option(
        "use_rel_pos",
        False,
        False,
        "decomposed relative positions (MViTv2, SAM): each block's attention logits add q's products with "
        "attn.rel_pos_h and attn.rel_pos_w, learned per row and column offset within its window (or the grid)",
        holds=_only(False),
        hf="use_rel_pos",
        timm_name="use_rel_pos (VisionTransformerSAM)",
        draws=(False, False, False, False, False, False, False, True),
        check=flag(),
        lacks=(
            (
                r"blocks\.\d+\.attn\.rel_pos_[hw]",
                "its attention adds no decomposed relative position",
                "use_rel_pos=false",
            ),
        ),
        adds=("use_rel_pos=true", dict(use_rel_pos=True)),
    ),
)

BY_FIELD: dict[str, Option] = {o.field: o for o in OPTIONS}
FAMILY = tuple(o.field for o in OPTIONS if o.family)  # the options beyond the original ViT


def holds(layout: str) -> dict[str, tuple]:
    """What ``layout`` can hold of each option that it restricts, in the table's order."""
    return {o.field: o.holds[layout] for o in OPTIONS if layout in o.holds}


def original_vit() -> dict[str, Any]:
    """What a port of the original ViT supports (conformance.support's form): every option of the
    family at the original's values."""
    return {field: BY_FIELD[field].original for field in FAMILY}
