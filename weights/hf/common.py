"""What the Hugging Face layouts of timm's Eva and Beit (dinov3.py, beit.py) read and write alike:
an activation's name, the refusal of what a layout cannot hold, the
sizes of a config.json."""

from __future__ import annotations

from collections.abc import Mapping

from weights.canonical import WeightError
from weights.config import ViTConfig
from weights.hf.fields import Fields

ACT = {"gelu": "gelu", "silu": "silu", "gelu_pytorch_tanh": "gelu_tanh", "quick_gelu": "quick_gelu"}
ACT_BACK = {v: k for k, v in ACT.items()}  # ours -> transformers' hidden_act


def act_of(f: Fields, default: str = "gelu") -> str:
    """The config's act_layer for a config.json's hidden_act (``default`` where it has none)."""
    act = f.text("hidden_act", default)
    if act not in ACT:
        raise WeightError(f"hidden_act {act!r} is not supported; supported: {sorted(ACT)}")
    return ACT[act]


def refuse(config: ViTConfig, model_type: str, holds: Mapping, extra: list[str]) -> None:
    """A WeightError naming each option of ``config`` outside what the layout ``holds`` (and ``extra``)."""
    wrong = [f"{k}={getattr(config, k)!r}" for k, ok in holds.items() if getattr(config, k) not in ok] + extra
    if wrong:
        raise WeightError(f"the Hugging Face {model_type} layout cannot hold {', '.join(wrong)}")


def sizes_from_hf(f: Fields, patch: int = 16) -> dict:
    """A headless tower's sizes from its config.json (``patch``: the model's default patch size)."""
    D = f.integer("hidden_size")
    return dict(
        img_size=f.size("image_size", 224),
        patch_size=f.size("patch_size", patch),
        in_chans=f.integer("num_channels", 3),
        num_classes=0,
        embed_dim=D,
        depth=f.depth(),
        num_heads=f.integer("num_attention_heads"),
        mlp_ratio=f.mlp_ratio("intermediate_size", D, 4 * D),
    )


def sizes_to_hf(config: ViTConfig) -> dict:
    """A config.json's sizes, activation and eps for ``config`` (a pair only where it is not square)."""
    ph, pw = config.patch_size
    return {
        "hidden_size": config.embed_dim,
        "intermediate_size": config.mlp_hidden_dim,
        "num_hidden_layers": config.depth,
        "num_attention_heads": config.num_heads,
        "hidden_act": ACT_BACK[config.act_layer],
        "layer_norm_eps": config.norm_eps,
        "image_size": list(config.img_size) if config.img_size[0] != config.img_size[1] else config.img_size[0],
        "patch_size": [ph, pw] if ph != pw else ph,
        "num_channels": config.in_chans,
    }
