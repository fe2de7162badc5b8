"""timm's models for a config, with random weights or a canonical state loaded strictly: its
``VisionTransformer`` (the canonical layout's reference), its Eva (rotary towers, EVA02's
attention), its Beit (relative position bias) and its NaFlexVit, each chosen by what the config
asks; a config none of them has a keyword for is ``NotInTimm``, naming the options."""

from __future__ import annotations

import contextlib
import inspect
from functools import partial

import numpy as np

from impls.protocol import NAFLEX_FAMILY, ViTConfig
from weights.options import BY_FIELD, OPTIONS


def timm_vit(config: ViTConfig, state: dict[str, np.ndarray] | None = None, dtype=None, **rates):
    """timm's VisionTransformer for ``config`` in eval mode, with ``state`` loaded strictly.
    ``rates``: timm's dropout and drop-path rates (drop_rate, attn_drop_rate, drop_path_rate, ...)."""
    import torch
    from timm.layers import Mlp, SwiGLU, SwiGLUPacked
    from timm.models.deit import VisionTransformerDistilled
    from timm.models.vision_transformer import VisionTransformer

    if config.rel_pos_bias:
        return _timm_beit(config, state, dtype, rates)
    if config.window_size or config.use_rel_pos:
        return _timm_sam(config, state, dtype, rates)
    if config.pos_embed_grid_size is not None or config.pos_embed_interp_mode != "bicubic":
        return _timm_naflex(config, state, dtype, rates)
    if _eva_only(config):
        return _timm_eva(config, state, dtype, rates)
    mlp_layer = {"mlp": Mlp, "swiglu_packed": SwiGLUPacked, "swiglu": SwiGLU}[config.mlp_layer]
    # with a state to load, built without storage or timm's init (drawing ViT-B's takes a second),
    # then given the state's tensors: a strict load leaves nothing on the meta device
    with torch.device("meta") if state is not None else contextlib.nullcontext():
        model_cls = VisionTransformerDistilled if config.distilled else VisionTransformer
        model = _timm_model(model_cls, config, mlp_layer, state is not None, rates)
    for module in model.modules():
        if isinstance(module, torch.nn.LayerNorm):
            module.eps = config.norm_eps
    if state is not None:
        tensors = {k: torch.from_numpy(np.array(v)) for k, v in state.items()}
        model.load_state_dict(tensors, strict=True, assign=True)
    if dtype is not None:
        model = model.to(dtype)
    return model.eval()


# the options set on the built model rather than passed (every LayerNorm's eps)
_SET_AFTER = ("norm_eps",)
# timm's Eva names LayerScale's gamma after its block (gamma_1), VisionTransformer after its module
_EVA_NAMES = ((".ls1.gamma", ".gamma_1"), (".ls2.gamma", ".gamma_2"))
# what of a config timm's Eva has no keyword for (its MLP's activation: GELU, SiLU in its SwiGLUs)
_NOT_IN_EVA = {
    "proj_bias": True,
    "pos_embed": ("learn", "none"),
    "distilled": False,
    "fc_norm": (None, True, False),
    "norm_bias": True,
    "norm_layer": "layernorm",
    "rope_type": (None, "cat", "dinov3", "mixed"),  # timm's Eva has no Pixtral bands
    "embed_norm": False,
    "patch_norm": False,
    "mlp_bias": (None, True),
}


def _eva_only(config: ViTConfig) -> bool:
    """What timm's VisionTransformer lacks and its Eva has: rotary embeddings, q's and v's biases
    without k's, three projections, the MLP's norm."""
    return (
        config.rope_type is not None
        or not config.k_bias
        or not config.qkv_fused
        or config.scale_mlp
        or config.attn_pool_num_heads is not None
    )


def _eva_mlp(config: ViTConfig) -> tuple[list[str], dict]:
    """Eva's keywords for the MLP (its Mlp takes GELU; its SwiGLUs SiLU, packed only without a norm,
    GluMlp doubling the hidden width), or what it cannot build."""
    act = "silu" if config.mlp_layer != "mlp" else "gelu"
    beyond = [f"act_layer={config.act_layer!r} with mlp_layer={config.mlp_layer!r}"] if config.act_layer != act else []
    if config.mlp_layer == "swiglu_packed" and config.scale_mlp:
        beyond.append("mlp_layer='swiglu_packed' with scale_mlp")
    ratio = config.mlp_ratio / 2 if config.mlp_layer == "swiglu_packed" else config.mlp_ratio
    kw = dict(mlp_ratio=ratio, swiglu_mlp=config.mlp_layer != "mlp", scale_mlp=config.scale_mlp)
    if config.mlp_layer == "swiglu" and not config.scale_mlp:
        kw["swiglu_align_to"] = 1  # Eva's SwiGLU without a norm (fc1_g, fc1_x), the width as it is
    return beyond, kw


def _timm_eva(config: ViTConfig, state, dtype, rates: dict):
    """timm's Eva for what only it has (``_eva_only``): the rope ViTs' and DINOv3's layout (timm's
    Attention), or EVA02's attention (q's and v's biases, k none) where k_bias=False; LayerScale as
    gamma_1 and gamma_2; in eval mode, with ``state`` loaded strictly."""
    import torch
    from timm.layers import LayerNorm
    from timm.models.eva import Eva

    beyond = [
        f"{k}={getattr(config, k)!r}"
        for k, ok in _NOT_IN_EVA.items()
        if getattr(config, k) not in (ok if isinstance(ok, tuple) else (ok,))
    ]
    mlp_beyond, mlp = _eva_mlp(config)
    # Eva's attention pool reads every token, its reducing pools the patch tokens alone
    if config.num_prefix_tokens and config.pool_include_prefix != (config.global_pool == "map"):
        beyond.append(f"pool_include_prefix={config.pool_include_prefix!r} with global_pool={config.global_pool!r}")
    if beyond + mlp_beyond:
        raise NotInTimm(f"timm's Eva has no keyword for {', '.join(beyond + mlp_beyond)}")
    with torch.device("meta") if state is not None else contextlib.nullcontext():
        model = Eva(
            **_sizes(config),
            qkv_fused=config.qkv_fused,
            # EvaAttention gives k no bias; AttentionRope (timm's Attention, rotated) all three
            attn_type="eva" if config.qkv_bias and not config.k_bias else "rope",
            **mlp,
            init_values=config.init_values,
            class_token=config.class_token,
            num_reg_tokens=config.reg_tokens,
            no_embed_class=config.no_embed_class,
            use_abs_pos_emb=config.pos_embed == "learn",
            use_rot_pos_emb=config.rope_type is not None,
            rope_type=config.rope_type or "cat",
            rope_temperature=config.rope_temperature,
            rope_grid_indexing=config.rope_grid_indexing,
            rope_grid_offset=config.rope_grid_offset,
            rope_rotate_half=config.rope_rotate_half,
            ref_feat_shape=config.ref_feat_shape,
            use_fc_norm=config.use_fc_norm,
            use_post_transformer_norm=config.use_final_norm,
            attn_pool_num_heads=config.attn_pool_num_heads,
            use_pre_transformer_norm=config.pre_norm,
            qk_norm=config.qk_norm,
            norm_layer=partial(LayerNorm, eps=config.norm_eps),
            dynamic_img_size=config.dynamic_img_size,
            **rates,
        )
    if state is not None:
        model.load_state_dict(
            {eva_key(k): torch.from_numpy(np.array(v)) for k, v in state.items()}, strict=True, assign=True
        )
        if model.rope is not None:  # its tables are no weights: computed, as timm does at init
            for name, buffer in model.rope.named_buffers():  # (RoPE-Mixed's freqs are, loaded above)
                if buffer.is_meta:
                    model.rope.register_buffer(name, torch.empty_like(buffer, device="cpu"), persistent=False)
            model.rope.reset_parameters()
        for m in model.modules():
            if getattr(m, "k_bias", None) is not None:  # EvaAttention's zero k bias: a buffer, no weight
                m.k_bias = torch.zeros_like(m.q_bias)
    if dtype is not None:
        model = model.to(dtype)
    return model.eval()


# what of a config timm's Beit takes, beside the sizes: its only values (a value or a tuple of them)
_BEIT = {
    "pos_embed": ("learn", "none"),
    "global_pool": ("token", "avg"),
    "act_layer": "gelu",
    "mlp_layer": "mlp",
    "k_bias": False,  # with qkv_bias: q's and v's biases, k none (qkv_bias=False: none)
    "no_embed_class": False,
    "pre_norm": False,
    "qk_norm": False,
    "proj_bias": True,
    "norm_bias": True,
    "norm_layer": "layernorm",
    "rope_type": None,
    "scale_mlp": False,
    "pool_include_prefix": False,
}


def _timm_beit(config: ViTConfig, state, dtype, rates: dict):
    """timm's Beit for BEiT's relative position bias (``rel_pos_bias``): LayerScale as gamma_1
    and gamma_2, in eval mode, with ``state`` loaded strictly."""
    import torch
    from timm.layers import LayerNorm
    from timm.models.beit import Beit
    from timm.models.beit import gen_relative_position_index as gen_index

    beyond = [
        f"{k}={getattr(config, k)!r}"
        for k, ok in _BEIT.items()
        if getattr(config, k) not in (ok if isinstance(ok, tuple) else (ok,))
        and not (k == "k_bias" and not config.qkv_bias)
    ]
    if not (config.use_final_norm or config.use_fc_norm):  # timm's Beit has one norm or the other
        beyond.append("no final norm (neither norm nor fc_norm)")
    if beyond:
        raise NotInTimm(f"timm's Beit has no keyword for {', '.join(beyond)}")
    with torch.device("meta") if state is not None else contextlib.nullcontext():
        model = Beit(
            **_sizes(config),
            mlp_ratio=config.mlp_ratio,
            norm_layer=partial(LayerNorm, eps=config.norm_eps),
            init_values=config.init_values,
            use_abs_pos_emb=config.pos_embed == "learn",
            use_rel_pos_bias=True,
            use_fc_norm=config.use_fc_norm,
            **rates,
        )
    if state is not None:
        model.load_state_dict(
            {eva_key(k): torch.from_numpy(np.array(v)) for k, v in state.items()}, strict=True, assign=True
        )
        for m in model.modules():  # its index and zero k bias are buffers, not weights: made as timm makes them
            if getattr(m, "relative_position_bias_table", None) is not None:
                m.relative_position_index = gen_index(m.window_size)
            if getattr(m, "q_bias", None) is not None:
                m.k_bias = torch.zeros_like(m.q_bias)
    if dtype is not None:
        model = model.to(dtype)
    return model.eval()


# what of a config timm's VisionTransformerSAM takes (by these names); global_pool and fc_norm checked apart
_SAM_KEYWORDS = ("window_size", "global_attn_indexes", "use_rel_pos", "qkv_bias", "qk_norm", "init_values", "pre_norm")
_SAM_FREE = (*_SAM_KEYWORDS, "num_classes", "class_token", "global_pool", "fc_norm", "pos_embed", "norm_eps")


def _timm_sam(config: ViTConfig, state, dtype, rates: dict):
    """timm's VisionTransformerSAM without its neck (neck_chans=0: a channels-first LayerNorm in its
    place, the config's final norm, then the pooled head), in eval mode, with ``state`` loaded strictly
    in its layout (``sam_state``)."""
    import torch
    from timm.models.vision_transformer_sam import VisionTransformerSAM

    beyond = [f"{o.field}={getattr(config, o.field)!r}" for o in OPTIONS if o.field not in _SAM_FREE
              and getattr(config, o.field) != o.default]  # fmt: skip
    if config.pos_embed not in ("learn", "none") or not config.use_final_norm or config.global_pool == "map":
        beyond.append(f"pos_embed={config.pos_embed!r}, no final norm before the pooling or global_pool='map'")
    if beyond:
        raise NotInTimm(f"timm's VisionTransformerSAM has no keyword for {', '.join(beyond)}")
    with torch.device("meta") if state is not None else contextlib.nullcontext():
        model = VisionTransformerSAM(
            **{k: getattr(config, k) for k in _SIZES}, mlp_ratio=config.mlp_ratio, global_pool=config.global_pool,
            **{k: getattr(config, k) for k in _SAM_KEYWORDS}, use_abs_pos=config.pos_embed == "learn", neck_chans=0,
            **rates,
        )  # fmt: skip
    for module in model.modules():
        if isinstance(module, torch.nn.LayerNorm):  # its neck's LayerNorm2d too
            module.eps = config.norm_eps
    if state is not None:
        tensors = {k: torch.from_numpy(np.array(v)) for k, v in sam_state(state, config).items()}
        model.load_state_dict(tensors, strict=True, assign=True)
    return (model if dtype is None else model.to(dtype)).eval()


_SAM_NAMES = (("norm.", "neck."), ("head.", "head.fc."))  # the final norm in the neck's place, the head's fc


def sam_state(state, config: ViTConfig | None, back: bool = False) -> dict:
    """The canonical state in timm's VisionTransformerSAM layout (its position table on the grid,
    (1, gh, gw, D)), or ``back`` from it."""
    out = {}
    for key, value in state.items():
        for canonical, sam in _SAM_NAMES:
            if key.startswith(sam if back else canonical):
                key = (canonical + key[len(sam) :]) if back else (sam + key[len(canonical) :])
                break
        if key == "pos_embed":
            value = np.asarray(value)
            value = value.reshape(1, -1, value.shape[-1]) if back else value.reshape(1, *config.grid_size, -1)
        out[key] = value
    return out


# what of a config timm's NaFlexVit takes by its own keywords (NaFlexVitCfg's fields, the same names)
_NAFLEX_KEYWORDS = ("mlp_ratio", "qk_norm", "proj_bias", "init_values", "class_token", "reg_tokens")
_NAFLEX_KEYWORDS += ("pre_norm", "fc_norm", "act_layer", "pool_include_prefix", "pos_embed_grid_size")
_NAFLEX_KEYWORDS += ("pos_embed_interp_mode",)
_NAFLEX = {"no_embed_class": True, "pos_embed": "learn", "mlp_layer": "mlp", "distilled": False, "norm_bias": True}
_NAFLEX["norm_layer"] = "layernorm"
_NAFLEX.update(dict.fromkeys(("rope_type", "attn_pool_num_heads", "mlp_bias"), None))
_NAFLEX.update(k_bias=True, qkv_fused=True, scale_mlp=False, patch_norm=False, embed_norm=False)
# What timm's NaFlexVit builds, as a port of it declares it (conformance/examples/naflex_ports.py)
TIMM_NAFLEX = {**NAFLEX_FAMILY, **{k: (v,) for k, v in _NAFLEX.items()}}


def timm_naflexvit(config: ViTConfig, state: dict[str, np.ndarray] | None = None, dtype=None, **rates):
    """timm's NaFlexVit for ``config`` whatever its table's grid: where the config names none, the
    table is at its own grid (what the canonical ``pos_embed`` holds), resized to each image's."""
    grid = config.pos_embed_grid_size or config.pos_grid
    return _timm_naflex(config.replace(pos_embed_grid_size=grid), state, dtype, rates)


def _timm_naflex(config: ViTConfig, state, dtype, rates: dict):
    """timm's NaFlexVit for a table of its own grid (``pos_embed_grid_size``), in eval mode, with
    ``state`` loaded strictly in its layout (weights/layouts/naflex.py)."""
    import torch
    from timm.models.naflexvit import NaFlexVit, NaFlexVitCfg

    from weights.layouts.naflex import from_canonical

    beyond = [f"{k}={getattr(config, k)!r}" for k, ok in _NAFLEX.items() if getattr(config, k) != ok]
    if beyond:
        raise NotInTimm(f"timm's NaFlexVit has no keyword for {', '.join(beyond)}")
    skip = ("img_size", "in_chans", "num_classes")  # NaFlexVit's own arguments, beside its cfg
    sizes = {k: v for k, v in _sizes(config).items() if k not in skip}
    # fc_norm resolved: NaFlexVit's None is 'avg' alone, timm's ViT's (the config's) every reducing pool
    keywords = {**{k: getattr(config, k) for k in _NAFLEX_KEYWORDS}, "fc_norm": config.use_fc_norm}
    keywords["final_norm"] = config.use_final_norm or config.use_fc_norm  # NaFlexVit's: either norm
    cfg = NaFlexVitCfg(**sizes, **keywords, **rates)
    model = NaFlexVit(cfg, in_chans=config.in_chans, num_classes=config.num_classes, img_size=config.img_size)
    for module in model.modules():
        if isinstance(module, torch.nn.LayerNorm):
            module.eps = config.norm_eps
    if state is not None:
        tensors = {k: torch.from_numpy(np.array(v)) for k, v in from_canonical(dict(state), config).items()}
        model.load_state_dict(tensors, strict=True)
    return (model if dtype is None else model.to(dtype)).eval()


_SHAPE = ("img_size", "patch_size", "in_chans", "embed_dim", "depth", "num_heads")  # timm's keywords, our names
_SIZES = (*_SHAPE, "num_classes")


def _sizes(config: ViTConfig) -> dict:
    """The keywords timm's Eva and Beit share with the config's fields, by the same names."""
    return {k: getattr(config, k) for k in (*_SIZES, "global_pool", "qkv_bias")}


def eva_key(key: str, back: bool = False) -> str:
    for canonical, eva in _EVA_NAMES:
        key = key.replace(eva, canonical) if back else key.replace(canonical, eva)
    return key


class NotInTimm(ValueError):
    """A config timm's VisionTransformer cannot build: its options named."""


def not_in_timm(config: ViTConfig) -> list[str]:
    """The options of ``config`` timm's VisionTransformer has no keyword for (weights/options.py)."""

    return (
        [
            f"{name}={getattr(config, name)!r}"
            for name, option in BY_FIELD.items()
            if option.timm is None and getattr(config, name) != option.default
        ]
        + ([f"pos_embed={config.pos_embed!r}"] if config.pos_embed in ("sincos", "sinusoid") else [])
        + (
            # timm's norm_layer is every norm's, qk-norm's and the attention pool's too
            ["norm_bias=False or norm_layer='rmsnorm' with qk_norm, scale_mlp or global_pool='map'"]
            if not config.use_norm_bias and (config.qk_norm or config.scale_mlp or config.global_pool == "map")
            else []
        )
    )


def _timm_model(VisionTransformer, config: ViTConfig, mlp_layer, skip_init: bool, rates: dict):
    import torch
    from timm.layers import RmsNorm
    from timm.models import vision_transformer as timm_vit

    beyond = not_in_timm(config)
    norm = "layernorm" if config.norm_bias else partial(torch.nn.LayerNorm, bias=False)
    if config.norm_layer == "rmsnorm":
        norm = partial(RmsNorm, eps=config.norm_eps)
    if config.mlp_bias is not None and config.mlp_bias == config.proj_bias:
        beyond = [b for b in beyond if not b.startswith("mlp_bias=")]  # timm's coupling, spelled out
    if beyond:
        raise NotInTimm(f"timm's VisionTransformer has no keyword for {', '.join(beyond)}")
    # every option whose timm keyword is its own name, as it is; the rest below, translated
    accepted = inspect.signature(timm_vit.VisionTransformer).parameters  # the distilled one's too
    same = {o.field: getattr(config, o.field) for o in OPTIONS if o.timm == o.field and o.field in accepted}
    same["mlp_layer"] = mlp_layer  # timm's class for the config's name
    unread = [f for f in BY_FIELD if BY_FIELD[f].timm == f and f not in accepted and f not in _SET_AFTER]
    if any(getattr(config, f) != BY_FIELD[f].default for f in unread):
        raise NotInTimm(f"timm's VisionTransformer has no keyword for {', '.join(unread)}")
    return VisionTransformer(
        **{k: getattr(config, k) for k in _SHAPE},
        mlp_ratio=config.mlp_ratio,
        **same,
        embed_norm_layer=(norm if config.embed_norm else None),
        **({} if config.use_norm_bias else {"norm_layer": norm}),
        **({"weight_init": "skip"} if skip_init else {}),
        **rates,
    )
