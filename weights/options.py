"""The ViT family's options, each defined once (timm's other builders' in weights/builder_options.py,
an entry's fields in weights/option.py): its ``ViTConfig`` field and default, the values
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

from typing import Any

from weights.builder_options import BUILDER_OPTIONS, ROPE_TYPES
from weights.checks import count, flag, number, one_of
from weights.option import BEIT, DINOV3, HF_FAMILY, SIGLIP2, Option, every, only

# the values an option's field takes, where they are a few names
GLOBAL_POOLS = ("token", "avg", "avgmax", "max", "map")
POS_EMBEDS = ("learn", "sincos", "sinusoid", "none")
REDUCING_POOLS = ("avg", "avgmax", "max")  # timm: these take fc_norm by default
ACT_LAYERS = ("gelu", "gelu_tanh", "quick_gelu", "silu")
MLP_LAYERS = ("mlp", "swiglu_packed", "swiglu")
NORM_LAYERS = ("layernorm", "rmsnorm")  # timm's norm_layer by name

# the attention output's bias and the MLP's (timm couples them: proj_bias)
ATTN_OUT_BIAS, MLP_BIAS = r"blocks\.\d+\.attn\.proj\.bias", r"blocks\.\d+\.mlp\.fc[12](_[gx])?\.bias"
__all__ = ["ROPE_TYPES", "HF_FAMILY", "Option"]  # declared in weights/option.py and builder_options.py, read here


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
        lacks=((r"cls_token", "it has no class token", "class_token=false (with global_pool='avg')"),),
        adds=("class_token=true", dict(class_token=True)),
    ),
    Option(
        "num_classes",
        1000,
        None,
        "the head's width; 0: no head, the logits are the pooled features",
        holds=every((0,), "hf:dinov2", "hf:dinov2_with_registers", "hf:siglip_vision_model", DINOV3, SIGLIP2),
        hf="num_labels",
        family=False,
        check=count(0),
        lacks=(
            (r"head\.(weight|bias)", "it has no classifier head (a tower's features are its output)", "num_classes=0"),
        ),
    ),
    Option(
        "qkv_bias",
        True,
        (True, False),
        "the q, k and v projections' bias",
        holds=every((True,), "open_clip", "hf:clip_vision_model", "hf:siglip_vision_model", BEIT, SIGLIP2),
        hf="qkv_bias",
        family=False,
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
        holds=every(
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
        adds=("pre_norm=true", dict(pre_norm=True)),
    ),
    Option(
        "patch_bias",
        None,
        (None,),
        "the patch projection's bias, patch_embed.proj.bias (None: timm's coupling, none with pre_norm; False: "
        "none without a norm_pre either, as Qwen2-VL's and Pixtral's bias-free patch convolutions)",
        holds=only(None),
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
        holds={**every((None, False), "open_clip", *HF_FAMILY), BEIT: (None,)},
        draws=(None, None, True, False),
        check=flag(none="timm's default"),
    ),
    Option(
        "final_norm",
        True,
        True,
        "a final norm, norm (or fc_norm after the pooling); False: none, the last block's tokens pooled as they "
        "are (InternViT, Pixtral, Qwen2-VL, timm's final_norm=False)",
        holds=only(True),
        draws=(True, True, True, False),
        lacks=((r"(norm|fc_norm)\.weight", "it has no final norm", "final_norm=false"),),
        adds=("final_norm=true", dict(final_norm=True)),
    ),
    Option(
        "init_values",
        None,
        (None,),
        "LayerScale: a per-channel gamma on each residual branch, initialised to this (DINOv2, DeiT III)",
        holds=every((None,), "npz", "hf:clip_vision_model", "hf:siglip_vision_model", SIGLIP2),
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
        holds=only(False),
        draws=(False, True),
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
        holds=only(True, {DINOV3: None}),
        draws=(False, True),
        lacks=((ATTN_OUT_BIAS, "its attention output has no bias", "proj_bias=false"),),
        adds=("proj_bias=true", dict(proj_bias=True, mlp_bias=False)),
    ),
    Option(
        "mlp_layer",
        "mlp",
        "mlp",
        "the MLP: fc1, act, fc2 ('mlp'), timm's SwiGLUPacked (DINOv2 giant) or SwiGLU",
        holds={
            **every(("mlp",), "npz", "open_clip", "hf:clip_vision_model", "hf:siglip_vision_model", SIGLIP2),
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
    ),
    Option(
        "pos_embed",
        "learn",
        "learn",
        "the position embedding: a learned table ('learn'), the fixed 2-D sin-cos table of SimpleViT computed "
        "at the grid ('sincos'), the Transformer paper's 1-D sinusoidal table over the sequence ('sinusoid'), "
        "or none ('none')",
        holds=only("learn", {DINOV3: ("none",), BEIT: ("learn", "none")}),
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
        holds=only(False),
        timm_name=None,
        draws=(False, True),
        adds=("patch_norm=true", dict(patch_norm=True)),
    ),
    Option(
        "embed_norm",
        False,
        False,
        "a LayerNorm after the patch projection, patch_embed.norm (vit-pytorch, x-transformers)",
        holds=only(False),
        timm_name="embed_norm_layer",
        draws=(False, True),
        adds=("embed_norm=true", dict(embed_norm=True)),
    ),
    Option(
        "pool_include_prefix",
        False,
        False,
        "the pools read the class and register tokens too (vit-pytorch's 'mean'; the attention pool of timm's Eva)",
        holds=only(False),
        draws=(False, True),
    ),
    Option(
        "distilled",
        False,
        False,
        "DeiT's distillation token (dist_token, after the class token) and head (head_dist); the logits the mean "
        "of both heads'",
        holds=only(False),
        timm_name="VisionTransformerDistilled (a class)",
        draws=(False, True),
        lacks=((r"dist_token|head_dist\.(weight|bias)", "it has no distillation token and head", "distilled=false"),),
        adds=("distilled=true", dict(distilled=True, global_pool="token", class_token=True, reg_tokens=0)),
    ),
    Option(
        "norm_bias",
        True,
        True,
        "the LayerNorms' bias (False: scale only, x-transformers; not qk-norm's or the attention pool's)",
        holds=only(True),
        timm_name="norm_layer",
        draws=(True, True, False),
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
        holds=only("layernorm"),
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
        holds=only(None, {DINOV3: None}),
        timm_name=None,
        draws=(None, None, True, False),
        check=flag(none="as proj_bias"),
        lacks=((MLP_BIAS, "its MLP has no biases", "mlp_bias=false"),),
        adds=("mlp_bias=true", dict(mlp_bias=True)),
    ),
) + BUILDER_OPTIONS

BY_FIELD: dict[str, Option] = {o.field: o for o in OPTIONS}
FAMILY = tuple(o.field for o in OPTIONS if o.family)  # the options beyond the original ViT


def holds(layout: str) -> dict[str, tuple]:
    """What ``layout`` can hold of each option that it restricts, in the table's order."""
    return {o.field: o.holds[layout] for o in OPTIONS if layout in o.holds}


def original_vit() -> dict[str, Any]:
    """What a port of the original ViT supports (conformance.support's form): every option of the
    family at the original's values."""
    return {field: BY_FIELD[field].original for field in FAMILY}
