"""The ViT family's Hugging Face layouts (Dinov2, Dinov2 with registers, CLIP's and SigLIP's
vision towers): config.json to and from a ``ViTConfig``, the state to and from canonical."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from weights.canonical import WeightError, expected_shapes
from weights.config import ViTConfig
from weights.hf.fields import Fields
from weights.options import holds


FAMILY_MODEL_TYPES = ("dinov2", "dinov2_with_registers", "clip_vision_model", "siglip_vision_model")
_TOWERS = {
    "clip": "clip_vision_model",
    "siglip": "siglip_vision_model",
    "siglip2": "siglip2_vision_model",
}  # whole checkpoints: the vision tower
_ACT = {
    "gelu": "gelu",
    "quick_gelu": "quick_gelu",
    "gelu_pytorch_tanh": "gelu_tanh",
    "gelu_new": "gelu_tanh",
    "silu": "silu",
}
_ACT_BACK = {"gelu": "gelu", "quick_gelu": "quick_gelu", "gelu_tanh": "gelu_pytorch_tanh", "silu": "silu"}


def vision_config(hf: Mapping) -> tuple[str, Mapping]:
    """(model type, the vision settings) of a config.json, a whole CLIP/SigLIP one included."""
    model_type = hf.get("model_type")
    if model_type in _TOWERS:
        return _TOWERS[model_type], hf.get("vision_config", {})
    return model_type, hf


def vision_fields(hf: Mapping) -> Fields:
    """The vision settings of a config.json, read by type (weights/hf/fields.py)."""
    nested = hf.get("model_type") in _TOWERS
    return Fields(hf.get("vision_config", {}), "vision_config") if nested else Fields(hf)


def _act(f: Fields, default: str) -> str:
    act = f.text("hidden_act", default)
    if act not in _ACT:
        raise WeightError(f"hidden_act {act!r} is not supported; supported: {sorted(_ACT)}")
    return _ACT[act]


def _swiglu_hidden(D: int, mlp_ratio: float) -> int:
    """Dinov2SwiGLUFFN's hidden width: 2/3 of D * mlp_ratio, rounded up to a multiple of 8."""
    return (int(int(D * mlp_ratio) * 2 / 3) + 7) // 8 * 8


def family_config_to_vit(hf: Mapping, state: Mapping[str, np.ndarray] | None = None) -> ViTConfig:
    """ViTConfig from the config.json of a family model (and, for CLIP's optional projection,
    the checkpoint's tensors); every setting taken, none assumed."""
    model_type, _ = vision_config(hf)
    v = vision_fields(hf)
    D = v.integer("hidden_size")
    common = dict(
        img_size=v.size("image_size", 224),
        patch_size=v.size("patch_size", 16),
        in_chans=v.integer("num_channels", 3),
        embed_dim=D,
        depth=v.depth(),
        num_heads=v.integer("num_attention_heads"),
    )
    if model_type in ("dinov2", "dinov2_with_registers"):
        architectures = v.strings("architectures")
        if architectures and not any(a.endswith("Model") for a in architectures):
            raise WeightError(
                f"{architectures}: Dinov2's classifier reads the class token and the patch "
                "mean together, which timm's head does not: convert the backbone (Dinov2Model)"
            )
        swiglu = v.flag("use_swiglu_ffn", False)
        ratio = v.number("mlp_ratio", 4)
        if swiglu:
            ratio = 2 * _swiglu_hidden(D, ratio) / D  # timm's packed fc1 holds gate and value
        registers = v.integer("num_register_tokens", 0, minimum=0) if model_type == "dinov2_with_registers" else 0
        return ViTConfig(
            **common,
            num_classes=0,
            mlp_ratio=ratio,
            qkv_bias=v.flag("qkv_bias", True),
            norm_eps=v.number("layer_norm_eps", 1e-6),
            init_values=float(v.number("layerscale_value", 1.0)),
            reg_tokens=registers,
            no_embed_class=bool(registers),
            mlp_layer="swiglu_packed" if swiglu else "mlp",
            act_layer="silu" if swiglu else _act(v, "gelu"),
        )
    if model_type == "clip_vision_model":
        projection = (state or {}).get("visual_projection.weight")
        return ViTConfig(
            **common,
            num_classes=0 if projection is None else int(projection.shape[0]),
            mlp_ratio=v.mlp_ratio("intermediate_size", D, 4 * D),
            norm_eps=v.number("layer_norm_eps", 1e-5),
            pre_norm=True,
            act_layer=_act(v, "quick_gelu"),
        )
    if model_type == "siglip_vision_model":
        if not v.flag("vision_use_head", True):
            raise WeightError(
                "vision_use_head=False: a SigLIP tower without its MAP head has no timm pooling; not supported"
            )
        return ViTConfig(
            **common,
            num_classes=0,
            mlp_ratio=v.mlp_ratio("intermediate_size", D, 4 * D),
            norm_eps=v.number("layer_norm_eps", 1e-6),
            class_token=False,
            global_pool="map",
            act_layer=_act(v, "gelu_pytorch_tanh"),
        )
    raise WeightError(
        f"config.json has model_type {hf.get('model_type')!r}; the family layouts are "
        f"{FAMILY_MODEL_TYPES}, 'dinov3_vit' (and whole 'clip' / 'siglip' checkpoints)"
    )


def model_type_for(config: ViTConfig) -> str:
    """The Hugging Face model that holds ``config``, or a WeightError naming what none holds."""
    if config.global_pool == "map" and not config.class_token and not config.pre_norm:
        return "siglip_vision_model"
    if config.pre_norm and config.class_token and config.global_pool == "token":
        return "clip_vision_model"
    if config.init_values is not None and config.class_token and config.global_pool == "token":
        return "dinov2_with_registers" if config.reg_tokens else "dinov2"
    raise WeightError(
        f"no Hugging Face layout holds {config.beyond_original_vit()} with global_pool="
        f"{config.global_pool!r}, class_token={config.class_token}: the family layouts are Dinov2 "
        "(LayerScale), Dinov2 with registers, CLIP (pre_norm), SigLIP ('map', no class token) and DINOv3 "
        "(rope_type='dinov3')"
    )


def _refuse(config: ViTConfig, model_type: str, allowed: Mapping) -> None:
    """Options a Hugging Face model does not have, named."""
    wrong = [f"{k}={getattr(config, k)!r}" for k, ok in allowed.items() if getattr(config, k) not in ok]
    if wrong:
        raise WeightError(f"the Hugging Face {model_type} layout cannot hold {', '.join(wrong)}")


HOLDS = {model_type: holds(f"hf:{model_type}") for model_type in FAMILY_MODEL_TYPES}  # weights/options.py


def family_config_to_hf(config: ViTConfig, model_type: str | None = None) -> dict:
    model_type = model_type or model_type_for(config)
    _refuse(config, model_type, HOLDS[model_type])
    D = config.embed_dim
    common = {
        "model_type": model_type,
        "hidden_size": D,
        "num_hidden_layers": config.depth,
        "num_attention_heads": config.num_heads,
        "num_channels": config.in_chans,
        "layer_norm_eps": config.norm_eps,
        "hidden_act": _ACT_BACK[config.act_layer],
    }
    if config.img_size[0] != config.img_size[1] or config.patch_size[0] != config.patch_size[1]:
        raise WeightError(
            f"Hugging Face {model_type} takes square images and patches, not img_size "
            f"{config.img_size}, patch_size {config.patch_size}"
        )
    common.update(image_size=config.img_size[0], patch_size=config.patch_size[0])
    if model_type.startswith("dinov2"):
        swiglu = config.mlp_layer == "swiglu_packed"
        if config.mlp_layer == "swiglu" or (swiglu != (config.act_layer == "silu")):
            raise WeightError(
                f"Dinov2 has GELU MLPs or the packed SwiGLU with SiLU, not mlp_layer="
                f"{config.mlp_layer!r} with act_layer={config.act_layer!r}"
            )
        ratio = config.mlp_ratio
        if swiglu:
            ratio = config.mlp_act_dim * 3 / (2 * D)
            if _swiglu_hidden(D, ratio) != config.mlp_act_dim:
                raise WeightError(
                    f"Dinov2's SwiGLU width is 2/3 of D * mlp_ratio rounded up to 8: no mlp_ratio "
                    f"gives {config.mlp_act_dim}"
                )
        if ratio != int(ratio) or (not swiglu and int(D * ratio) != config.mlp_hidden_dim):
            raise WeightError(
                f"Dinov2's config takes an integer mlp_ratio; none gives the MLP width "
                f"{config.mlp_act_dim} of embed_dim {D} (mlp_ratio {config.mlp_ratio})"
            )
        ratio = int(ratio)
        out = {
            **common,
            "architectures": ["Dinov2WithRegistersModel" if config.reg_tokens else "Dinov2Model"],
            "mlp_ratio": ratio,
            "qkv_bias": config.qkv_bias,
            "layerscale_value": config.init_values,
            "use_swiglu_ffn": swiglu,
            "hidden_act": "gelu" if swiglu else common["hidden_act"],
        }
        if config.reg_tokens:
            out["num_register_tokens"] = config.reg_tokens
        return out
    intermediate = {"intermediate_size": config.mlp_hidden_dim}
    if model_type == "clip_vision_model":
        arch = "CLIPVisionModelWithProjection" if config.num_classes else "CLIPVisionModel"
        return {
            **common,
            **intermediate,
            "architectures": [arch],
            **({"projection_dim": config.num_classes} if config.num_classes else {}),
        }
    return {**common, **intermediate, "architectures": ["SiglipVisionModel"], "vision_use_head": True}


# ----------------------------------------------------------------------------- state


def _qkv(s, prefix: str, names, bias: bool):
    w = np.concatenate([s[f"{prefix}{n}.weight"] for n in names])
    b = np.concatenate([s[f"{prefix}{n}.bias"] for n in names]) if bias else None
    return w, b


def _split(state, key: str, names, prefix: str, out: dict, D: int, bias: bool) -> None:
    for j, n in enumerate(names):
        out[f"{prefix}{n}.weight"] = state[f"{key}.weight"][j * D : (j + 1) * D]
        if bias:
            out[f"{prefix}{n}.bias"] = state[f"{key}.bias"][j * D : (j + 1) * D]


def _pairs(out: dict, state, pairs: Mapping[str, str], reverse: bool = False) -> None:
    """weight and bias of each (ours -> theirs) pair; ``reverse`` reads theirs."""
    for ours, theirs in pairs.items():
        for p in ("weight", "bias"):
            src, dst = (f"{theirs}.{p}", f"{ours}.{p}") if reverse else (f"{ours}.{p}", f"{theirs}.{p}")
            if src in state:
                out[dst] = state[src]


def _dinov2_block(i: int, swiglu: bool) -> dict[str, str]:
    h = f"encoder.layer.{i}."
    pairs = {
        f"blocks.{i}.norm1": h + "norm1",
        f"blocks.{i}.attn.proj": h + "attention.output.dense",
        f"blocks.{i}.norm2": h + "norm2",
    }
    fcs = {"fc1": "weights_in", "fc2": "weights_out"} if swiglu else {"fc1": "fc1", "fc2": "fc2"}
    pairs.update({f"blocks.{i}.mlp.{a}": h + f"mlp.{b}" for a, b in fcs.items()})
    return pairs


def _clip_block(i: int) -> dict[str, str]:
    h = f"encoder.layers.{i}."
    return {
        f"blocks.{i}.norm1": h + "layer_norm1",
        f"blocks.{i}.attn.proj": h + "self_attn.out_proj",
        f"blocks.{i}.norm2": h + "layer_norm2",
        f"blocks.{i}.mlp.fc1": h + "mlp.fc1",
        f"blocks.{i}.mlp.fc2": h + "mlp.fc2",
    }


def from_family_hf(state: Mapping[str, np.ndarray], config: ViTConfig, model_type: str) -> dict[str, np.ndarray]:
    """A family checkpoint (vision tower names, "vision_model." prefix optional) -> canonical."""
    s = {k.removeprefix("vision_model."): v for k, v in state.items()}
    out: dict[str, np.ndarray] = {}
    try:
        if model_type.startswith("dinov2"):
            e = "embeddings."
            pos = s[e + "position_embeddings"]
            out["cls_token"] = s[e + "cls_token"]
            if config.reg_tokens:  # timm's no_embed_class: the class token's entry folded into the token
                out["cls_token"] = (s[e + "cls_token"] + pos[:, :1]).astype(np.float32)
                out["reg_token"] = s[e + "register_tokens"]
                pos = pos[:, 1:]
            out["pos_embed"] = pos
            out["patch_embed.proj.weight"] = s[e + "patch_embeddings.projection.weight"]
            out["patch_embed.proj.bias"] = s[e + "patch_embeddings.projection.bias"]
            for i in range(config.depth):
                h = f"encoder.layer.{i}."
                out[f"blocks.{i}.attn.qkv.weight"], bias = _qkv(
                    s, h + "attention.attention.", ("query", "key", "value"), config.qkv_bias
                )
                if config.qkv_bias:
                    out[f"blocks.{i}.attn.qkv.bias"] = bias
                out[f"blocks.{i}.ls1.gamma"] = s[h + "layer_scale1.lambda1"]
                out[f"blocks.{i}.ls2.gamma"] = s[h + "layer_scale2.lambda1"]
                _pairs(out, s, _dinov2_block(i, config.mlp_layer == "swiglu_packed"), reverse=True)
            _pairs(out, s, {"norm": "layernorm"}, reverse=True)
        else:
            e = "embeddings."
            out["patch_embed.proj.weight"] = s[e + "patch_embedding.weight"]
            if e + "patch_embedding.bias" in s or not config.pre_norm:
                out["patch_embed.proj.bias"] = s[e + "patch_embedding.bias"]
            pos = s[e + "position_embedding.weight"][None]
            out["pos_embed"] = pos
            if config.class_token:
                out["cls_token"] = s[e + "class_embedding"].reshape(1, 1, -1)
            if config.pre_norm:
                _pairs(out, s, {"norm_pre": "pre_layrnorm"}, reverse=True)
            for i in range(config.depth):
                h = f"encoder.layers.{i}.self_attn."
                out[f"blocks.{i}.attn.qkv.weight"], out[f"blocks.{i}.attn.qkv.bias"] = _qkv(
                    s, h, ("q_proj", "k_proj", "v_proj"), True
                )
                _pairs(out, s, _clip_block(i), reverse=True)
            _pairs(out, s, {"norm": "post_layernorm"}, reverse=True)
            if config.global_pool == "map":
                D = config.embed_dim
                w, b = s["head.attention.in_proj_weight"], s["head.attention.in_proj_bias"]
                out["attn_pool.latent"] = s["head.probe"]
                out["attn_pool.q.weight"], out["attn_pool.q.bias"] = w[:D], b[:D]
                out["attn_pool.kv.weight"], out["attn_pool.kv.bias"] = w[D:], b[D:]  # k rows, then v rows
                _pairs(
                    out,
                    s,
                    {
                        "attn_pool.proj": "head.attention.out_proj",
                        "attn_pool.norm": "head.layernorm",
                        "attn_pool.mlp.fc1": "head.mlp.fc1",
                        "attn_pool.mlp.fc2": "head.mlp.fc2",
                    },
                    reverse=True,
                )
                out["attn_pool.latent"] = s["head.probe"]
            if config.num_classes:
                out["head.weight"] = state["visual_projection.weight"]
                out["head.bias"] = np.zeros(config.num_classes, np.float32)  # CLIP's projection has none
    except KeyError as e:
        raise WeightError(f"Hugging Face {model_type} checkpoint is missing key {e.args[0]!r} for {config}") from None
    missing = [k for k in expected_shapes(config) if k not in out]
    if missing:
        raise WeightError(f"Hugging Face {model_type} checkpoint gives no {missing} for {config}")
    return {k: np.ascontiguousarray(out[k]) for k in expected_shapes(config)}


def to_family_hf(
    state: Mapping[str, np.ndarray], config: ViTConfig, model_type: str | None = None
) -> dict[str, np.ndarray]:
    model_type = model_type or model_type_for(config)
    family_config_to_hf(config, model_type)  # refuses what the layout cannot hold
    out = _to_dinov2(state, config) if model_type.startswith("dinov2") else to_clip_family(state, config, model_type)
    return {k: np.ascontiguousarray(t) for k, t in out.items()}


def _to_dinov2(state: Mapping[str, np.ndarray], config: ViTConfig) -> dict[str, np.ndarray]:
    """transformers' Dinov2 names (registers, LayerScale, SwiGLU)."""
    D = config.embed_dim
    out: dict[str, np.ndarray] = {}
    e = "embeddings."
    pos = state["pos_embed"]
    if config.reg_tokens:  # the class token's entry, folded into cls_token by timm, written as zero
        pos = np.concatenate([np.zeros_like(pos[:, :1]), pos], axis=1)
        out[e + "register_tokens"] = state["reg_token"]
    out[e + "cls_token"] = state["cls_token"]
    out[e + "mask_token"] = np.zeros((1, D), np.float32)
    out[e + "position_embeddings"] = pos
    out[e + "patch_embeddings.projection.weight"] = state["patch_embed.proj.weight"]
    out[e + "patch_embeddings.projection.bias"] = state["patch_embed.proj.bias"]
    for i in range(config.depth):
        h = f"encoder.layer.{i}."
        _split(
            state,
            f"blocks.{i}.attn.qkv",
            ("query", "key", "value"),
            h + "attention.attention.",
            out,
            D,
            config.qkv_bias,
        )
        out[h + "layer_scale1.lambda1"] = state[f"blocks.{i}.ls1.gamma"]
        out[h + "layer_scale2.lambda1"] = state[f"blocks.{i}.ls2.gamma"]
        _pairs(out, state, _dinov2_block(i, config.mlp_layer == "swiglu_packed"))
    _pairs(out, state, {"norm": "layernorm"})
    return out


def to_clip_family(state: Mapping[str, np.ndarray], config: ViTConfig, model_type: str) -> dict[str, np.ndarray]:
    """transformers' CLIP and SigLIP vision towers' names (SigLIP's MAP head)."""
    D = config.embed_dim
    v = "vision_model." if model_type == "clip_vision_model" else ""
    tower: dict[str, np.ndarray] = {}
    e = "embeddings."
    tower[e + "patch_embedding.weight"] = state["patch_embed.proj.weight"]
    if "patch_embed.proj.bias" in state:
        tower[e + "patch_embedding.bias"] = state["patch_embed.proj.bias"]
    tower[e + "position_embedding.weight"] = state["pos_embed"][0]
    if config.class_token:
        tower[e + "class_embedding"] = state["cls_token"].reshape(-1)
    if config.pre_norm:
        _pairs(tower, state, {"norm_pre": "pre_layrnorm"})
    for i in range(config.depth):
        _split(
            state,
            f"blocks.{i}.attn.qkv",
            ("q_proj", "k_proj", "v_proj"),
            f"encoder.layers.{i}.self_attn.",
            tower,
            D,
            True,
        )
        _pairs(tower, state, _clip_block(i))
    _pairs(tower, state, {"norm": "post_layernorm"})
    if config.global_pool == "map":
        tower["head.probe"] = state["attn_pool.latent"]
        tower["head.attention.in_proj_weight"] = np.concatenate(
            [state["attn_pool.q.weight"], state["attn_pool.kv.weight"]]
        )
        tower["head.attention.in_proj_bias"] = np.concatenate([state["attn_pool.q.bias"], state["attn_pool.kv.bias"]])
        _pairs(
            tower,
            state,
            {
                "attn_pool.proj": "head.attention.out_proj",
                "attn_pool.norm": "head.layernorm",
                "attn_pool.mlp.fc1": "head.mlp.fc1",
                "attn_pool.mlp.fc2": "head.mlp.fc2",
            },
        )
    out = {v + k: t for k, t in tower.items()}
    if config.num_classes:
        if np.any(state["head.bias"]):
            raise WeightError("CLIP's visual_projection has no bias, but head.bias is not zero: not representable")
        out["visual_projection.weight"] = state["head.weight"]
    return out
