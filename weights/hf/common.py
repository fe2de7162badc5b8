"""What the Hugging Face layouts of timm's Eva and Beit (dinov3.py, beit.py) read and write alike:
an activation's name, the refusal of what a layout cannot hold, the
sizes of a config.json."""

from __future__ import annotations

from collections.abc import Mapping

from weights.canonical import WeightError, expected_shapes
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


def refuse_after_tower(state: Mapping, prefix: str, what: str, model_type: str, identity: str) -> None:
    """A WeightError naming the tensors under ``prefix``: a part after the tower (Qwen2.5-VL's merger,
    SAM's neck), where verify's ``ModelPort(tower=...)`` stops, with no canonical place; ``identity``:
    the module to replace by torch.nn.Identity() before saving, to import the tower."""
    after = sorted(k for k in state if k.startswith(prefix))
    if after:
        raise WeightError(
            f"{', '.join(after)}: the {what} after the tower has no canonical place in {model_type}; save it "
            f"with {identity} = torch.nn.Identity() to import the tower"
        )


def strictly(out: dict, config: ViTConfig, model_type: str) -> dict:
    """``out``, the canonical state read from ``model_type``'s checkpoint, if it has every key the
    config's model has and no other; else a WeightError naming both."""
    expected = expected_shapes(config)
    missing, extra = sorted(set(expected) - set(out)), sorted(set(out) - set(expected))
    if missing or extra:
        raise WeightError(
            f"the {model_type} checkpoint does not match its config.json: missing {missing}, extra {extra}"
        )
    return out


def renamed(state: Mapping, model_type: str, rename, change=None, back: bool = False) -> dict:
    """Each tensor of ``state`` under its name in the other layout (``rename(key)``: None where it
    has no place, refused by name), ``change(name, value)``d where a layout holds it in another shape
    (``name``: the canonical key); ``back``: from ``model_type``'s checkpoint to canonical."""
    out = {}
    for key, value in state.items():
        other = rename(key)
        if other is None:
            raise WeightError(
                f"{key!r} has no canonical place ({model_type}: no option expresses it)"
                if back
                else f"canonical key {key!r} has no place in the Hugging Face {model_type} layout"
            )
        out[other] = value if change is None else change(other if back else key, value)
    return out
