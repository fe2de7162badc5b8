"""What the Hugging Face layouts of timm's Eva and Beit (dinov3.py, beit.py) read alike: an
activation's name, a size that may be a pair."""

from __future__ import annotations

from collections.abc import Mapping

from weights.canonical import WeightError

ACT = {"gelu": "gelu", "silu": "silu", "gelu_pytorch_tanh": "gelu_tanh", "quick_gelu": "quick_gelu"}
ACT_BACK = {v: k for k, v in ACT.items()}  # ours -> transformers' hidden_act


def act_of(hf: Mapping) -> str:
    """The config's act_layer for a config.json's hidden_act (GELU where it has none)."""
    act = hf.get("hidden_act", "gelu")
    if act not in ACT:
        raise WeightError(f"hidden_act {act!r} is not supported; supported: {sorted(ACT)}")
    return ACT[act]


def size(value):
    """An image or patch size as config.json holds it (an int, or a list of two) as ViTConfig's."""
    return tuple(value) if isinstance(value, list) else value
