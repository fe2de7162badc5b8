"""The canonical layout: timm's names and layouts, float32 safetensors with the config stored."""

from __future__ import annotations

import numpy as np

from weights.canonical import CONFIG_METADATA_KEY
from weights.layouts._io import metadata
from weights.layouts.timm import read as read_timm


def detect(path, header) -> bool:
    return header is not None and CONFIG_METADATA_KEY in header[0]


def read(path, config=None, **options):
    return read_timm(path, config, **options)  # timm's state dict, its config stored (or inferred)


def write(state, config, path, **options) -> None:
    from safetensors.numpy import save_file

    save_file({k: np.ascontiguousarray(v) for k, v in state.items()}, path, metadata=metadata(config))
