"""What the layouts share: a safetensors file's header, the config stored in it, the metadata written."""

from __future__ import annotations

import json

from weights.canonical import CONFIG_METADATA_KEY, WeightError, check_header
from weights.config import ViTConfig, config_from_json

LAYOUT_METADATA_KEY = "vit_conformance_layout"


def header(path: str) -> tuple[dict, set[str]]:
    """A safetensors file's metadata and keys, without reading its tensors."""
    from safetensors import safe_open

    check_header(path)
    try:
        with safe_open(path, framework="numpy") as f:
            return f.metadata() or {}, set(f.keys())
    except Exception as e:  # noqa: BLE001
        raise WeightError(f"{path!r} is not a readable safetensors file: {e}") from None


def stored_config(path: str) -> ViTConfig | None:
    """The config this project stores in a safetensors file's metadata, if any."""
    if not str(path).endswith(".safetensors"):
        return None
    meta, _ = header(str(path))
    if CONFIG_METADATA_KEY not in meta:
        return None
    return config_from_json(meta[CONFIG_METADATA_KEY], f"the config stored in {str(path)!r}")


def metadata(config: ViTConfig, layout: str | None = None) -> dict[str, str]:
    meta = {CONFIG_METADATA_KEY: json.dumps(config.to_dict())}
    return meta if layout is None else {**meta, LAYOUT_METADATA_KEY: layout}
