"""open_clip's visual tower state dict (``visual.`` keys). It records neither its activation
(QuickGELU for OpenAI's weights, GELU for LAION's: mlfoundations/open_clip#771) nor its heads,
so the config must be given, or stored by this project."""

from __future__ import annotations

from safetensors.numpy import save_file

from weights import formats
from weights.canonical import WeightError
from weights.layouts._io import metadata, stored_config


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
    state = formats.from_open_clip(formats.stored_float32(formats.read_timm(path), cast, path), config)
    return config, formats.check(state, config, what=str(path))


def write(state, config, path, **options) -> None:
    save_file(formats.to_open_clip(state, config), path, metadata=metadata(config, "open_clip"))
