"""Canonical (timm) tensors to each framework's native names and layouts, and back.

| framework | conv kernel | dense kernel      | LayerNorm      | names                    |
|-----------|-------------|-------------------|----------------|--------------------------|
| numpy     | OIHW        | (out, in) weight  | weight, bias   | timm's, float64          |
| torch     | OIHW        | (out, in) weight  | weight, bias   | timm's                   |
| mlx       | OHWI        | (out, in) weight  | weight, bias   | timm's                   |
| jax       | HWIO        | (in, out) kernel  | scale, bias    | timm's modules, Flax leaf names |

Which tensor is which is decided by its name, never guessed from its shape (a shape guess
is blind when in_chans equals the patch size). Every conversion is a pure transpose or
rename, so canonical -> native -> canonical is bitwise identical.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import numpy as np

FRAMEWORKS = ("numpy", "torch", "mlx", "jax")

_NORM = re.compile(r"(^|\.)(fc_|q_|k_|patch_)?norm(\d*|_pre)\.(weight|bias)$")
_CONV = re.compile(r"(^|\.)patch_embed\.proj\.weight$")


def tensor_kind(key: str) -> str:
    if _CONV.search(key):
        return "conv"
    if _NORM.search(key):
        return "norm"
    if key.endswith(".weight"):
        return "dense"
    return "plain"  # biases, cls_token, pos_embed


def _check_framework(framework: str) -> None:
    if framework not in FRAMEWORKS:
        raise ValueError(f"unknown framework {framework!r}; expected one of {FRAMEWORKS}")


def to_native(state: Mapping[str, np.ndarray], framework: str) -> dict[str, np.ndarray]:
    _check_framework(framework)
    out = {}
    for key, value in state.items():
        kind = tensor_kind(key)
        if framework == "numpy":
            out[key] = np.asarray(value, dtype=np.float64)
        elif framework == "torch":
            out[key] = value
        elif framework == "mlx":
            out[key] = value.transpose(0, 2, 3, 1) if kind == "conv" else value  # OIHW -> OHWI
        elif kind == "conv":
            out[key[: -len("weight")] + "kernel"] = value.transpose(2, 3, 1, 0)  # OIHW -> HWIO
        elif kind == "dense":
            out[key[: -len("weight")] + "kernel"] = value.T  # (out, in) -> (in, out)
        elif kind == "norm" and key.endswith(".weight"):
            out[key[: -len("weight")] + "scale"] = value
        else:
            out[key] = value
    return {k: np.ascontiguousarray(v) for k, v in out.items()}


def from_native(native: Mapping[str, np.ndarray], framework: str) -> dict[str, np.ndarray]:
    _check_framework(framework)
    out = {}
    for key, value in native.items():
        value = np.asarray(value)
        if framework == "numpy":
            out[key] = value.astype(np.float32)
        elif framework == "torch":
            out[key] = value
        elif framework == "mlx":
            out[key] = value.transpose(0, 3, 1, 2) if tensor_kind(key) == "conv" else value  # OHWI -> OIHW
        elif key.endswith(".kernel"):
            ckey = key[: -len("kernel")] + "weight"
            out[ckey] = value.transpose(3, 2, 0, 1) if tensor_kind(ckey) == "conv" else value.T
        elif key.endswith(".scale"):
            out[key[: -len("scale")] + "weight"] = value
        else:
            out[key] = value
    return {k: np.ascontiguousarray(v) for k, v in out.items()}
