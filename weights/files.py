"""A checkpoint's tensors read from disk, whatever its layout, and held to the canonical rule:
timm's reader (``.safetensors``, or ``.pth``/``.bin`` through ``torch.load(weights_only=True)``:
nothing here unpickles arbitrary objects), float32 by the file's own names before a layout maps
them (``stored_float32``), and the strict check of the mapped state (``check``). Each layout's
detection, reading, writing, conversion and config inference is its own module in
weights/layouts/."""

from __future__ import annotations

import os
from collections.abc import Mapping

import numpy as np

from weights.canonical import WeightError, as_float32, expected_shapes, validate_state
from weights.config import ViTConfig
from weights.canonical import check_header
import pickle


def stored_float32(state: Mapping, cast: bool, path) -> dict[str, np.ndarray]:
    """canonical.as_float32's rule on the tensors as the file stores them, by the file's own names,
    once the layout has recognised them and before it maps them: a float16 query kernel
    concatenated into a float32 qkv, or an int64 one promoted to float64 on the way, would
    otherwise reach the final check under another dtype or none (refused unless ``cast``)."""
    return as_float32(state, cast=cast, what=str(path))


def read_timm(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """A timm state dict from .safetensors, or from .pth/.bin with torch.load(weights_only=True)."""
    path = str(path)
    if not os.path.isfile(path):
        raise WeightError(f"weight file {path!r} does not exist")
    if path.endswith(".safetensors"):
        import ml_dtypes  # noqa: F401 - registers bfloat16 with NumPy (refused or cast by name later)
        from safetensors.numpy import load_file

        check_header(path)
        try:
            return dict(load_file(path))
        except Exception as e:  # noqa: BLE001 - safetensors' own error types
            raise WeightError(f"{path!r} is not a readable safetensors file: {e}") from None
    if path.endswith((".pth", ".pt", ".bin")):
        import torch

        try:
            obj = torch.load(path, map_location="cpu", weights_only=True)
        except pickle.UnpicklingError as e:
            raise WeightError(
                f"{path!r} holds objects other than tensors; refusing to unpickle them "
                f"(torch.load(weights_only=True): {str(e).splitlines()[0]})"
            ) from None
        except Exception as e:  # noqa: BLE001
            raise WeightError(f"{path!r} is not a readable torch checkpoint: {e}") from None
        for wrapper in ("state_dict", "model", "module"):  # the usual training-script wrappers
            if isinstance(obj, Mapping) and wrapper in obj and isinstance(obj[wrapper], Mapping):
                obj = obj[wrapper]
        if not isinstance(obj, Mapping):
            raise WeightError(f"{path!r} holds a {type(obj).__name__}, expected a state dict")
        return {k: _numpy(v) for k, v in obj.items()}  # dtypes kept: canonical.as_float32 decides
    raise WeightError(f"{path!r}: expected .safetensors, .pth, .pt or .bin for a timm checkpoint")


def _numpy(value):
    """A tensor as a NumPy array of its own dtype (bfloat16 through ml_dtypes); anything else as it is."""
    import torch

    if not isinstance(value, torch.Tensor):
        return value
    value = value.detach().cpu()
    if value.dtype == torch.bfloat16:
        import ml_dtypes

        return value.view(torch.uint16).numpy().view(ml_dtypes.bfloat16)
    return value.numpy()


def check(state, config: ViTConfig, what: str, cast: bool = False) -> dict[str, np.ndarray]:
    """Strict validation (``canonical.as_float32``'s dtype rule, then keys, shapes and values),
    float32 in timm's key order."""
    state = as_float32(state, cast=cast, what=what)
    validate_state(state, config, what=what)
    return {k: np.ascontiguousarray(state[k]) for k in expected_shapes(config)}
