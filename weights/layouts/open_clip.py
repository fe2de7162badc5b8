"""open_clip's visual tower state dict (``visual.`` keys). It records neither its activation
(QuickGELU for OpenAI's weights, GELU for LAION's: mlfoundations/open_clip#771) nor its heads,
so the config must be given, or stored by this project."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from weights.canonical import WeightError, expected_shapes
from weights.config import ViTConfig
from weights.options import holds
from safetensors.numpy import save_file

from weights.files import check, read_timm, stored_float32
from weights.layouts._io import metadata, stored_config


_OPEN_CLIP_BLOCK = {
    "norm1": "ln_1",
    "attn.qkv": "attn.in_proj",
    "attn.proj": "attn.out_proj",
    "norm2": "ln_2",
    "mlp.fc1": "mlp.c_fc",
    "mlp.fc2": "mlp.c_proj",
}
OPEN_CLIP_HOLDS = holds("open_clip")  # weights/options.py


def _open_clip_holds(config: ViTConfig) -> None:
    wrong = [f"{k}={getattr(config, k)!r}" for k, ok in OPEN_CLIP_HOLDS.items() if getattr(config, k) not in ok]
    if wrong:
        raise WeightError(
            f"open_clip's VisionTransformer (token pooling after ln_post, pre_norm) cannot hold {', '.join(wrong)}"
        )


def _names(config: ViTConfig) -> dict[str, str]:
    """Canonical key -> open_clip's (without ``visual.``), for every tensor that is only renamed."""
    names = {
        "patch_embed.proj.weight": "conv1.weight",
        "norm_pre.weight": "ln_pre.weight",
        "norm_pre.bias": "ln_pre.bias",
        "norm.weight": "ln_post.weight",
        "norm.bias": "ln_post.bias",
    }
    for i in range(config.depth):
        r, b = f"transformer.resblocks.{i}.", f"blocks.{i}."
        for ours, theirs in _OPEN_CLIP_BLOCK.items():
            suffix = "_" if ours == "attn.qkv" else "."  # in_proj_weight: a bare parameter of nn.MultiheadAttention
            for p in ("weight", "bias"):
                names[f"{b}{ours}.{p}"] = f"{r}{theirs}{suffix}{p}"
        if config.init_values is not None:
            names[b + "ls1.gamma"], names[b + "ls2.gamma"] = r + "ls_1.gamma", r + "ls_2.gamma"
    return names


def from_open_clip(state: Mapping[str, np.ndarray], config: ViTConfig) -> dict[str, np.ndarray]:
    """open_clip's visual tower (``visual.`` prefix optional; the text tower's keys are not read).
    The state dict does not record the activation: OpenAI's weights need QuickGELU, LAION's GELU
    (mlfoundations/open_clip#771), so the config must say which."""
    _open_clip_holds(config)
    s = {k.removeprefix("visual."): v for k, v in state.items()}
    out = {}
    try:
        out["cls_token"] = s["class_embedding"].reshape(1, 1, -1)
        out["pos_embed"] = s["positional_embedding"][None]
        out.update({ours: s[theirs] for ours, theirs in _names(config).items()})
        if config.num_classes:
            out["head.weight"] = s["proj"].T  # pooled @ proj: (D, out), no bias
            out["head.bias"] = np.zeros(config.num_classes, np.float32)
    except KeyError as e:
        raise WeightError(f"open_clip state dict is missing key {e.args[0]!r} for {config}") from None
    return {k: np.ascontiguousarray(out[k], dtype=np.float32) for k in expected_shapes(config)}


def to_open_clip(state: Mapping[str, np.ndarray], config: ViTConfig) -> dict[str, np.ndarray]:
    """The visual tower's state dict, under ``visual.`` as in a whole open_clip CLIP model."""
    _open_clip_holds(config)
    if config.num_classes and np.any(state["head.bias"]):
        raise WeightError("open_clip's proj has no bias, but head.bias is not zero: not representable")
    out = {
        "class_embedding": state["cls_token"].reshape(-1),
        "positional_embedding": state["pos_embed"][0],
        **{theirs: state[ours] for ours, theirs in _names(config).items()},
    }
    if config.num_classes:
        out["proj"] = state["head.weight"].T
    return {f"visual.{k}": np.ascontiguousarray(v, dtype=np.float32) for k, v in out.items()}


def detect(path, header) -> bool:
    return header is not None and any(k.startswith("visual.") for k in header[1])


def read(path, config=None, cast=False, **options):
    config = config or stored_config(path)
    if config is None:
        raise WeightError(
            f"{path!r}: an open_clip state dict does not record its activation (QuickGELU for "
            "OpenAI's weights, GELU for LAION's: mlfoundations/open_clip#771) nor its heads; "
            "pass --preset or --config"
        )
    state = from_open_clip(stored_float32(read_timm(path), cast, path), config)
    return config, check(state, config, what=str(path))


def write(state, config, path, **options) -> None:
    save_file(to_open_clip(state, config), path, metadata=metadata(config, "open_clip"))
