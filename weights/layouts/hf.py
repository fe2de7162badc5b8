"""A Hugging Face save_pretrained directory (ViT, Dinov2, CLIP and SigLIP vision towers, DINOv3)."""

from __future__ import annotations

from pathlib import Path

from weights import files, hf
from weights.canonical import WeightError


def detect(path, header) -> bool:
    if Path(path).is_dir():
        return True
    if header is not None and any(k.startswith(("vit.", "classifier.")) for k in header[1]):
        raise WeightError(
            f"{path!r} is a Hugging Face state dict: convert its save_pretrained directory (with config.json) instead"
        )
    return False


def read(path, config=None, cast=False, **options):
    state, hf_config = hf.read_hf(path, cast)
    config = config or hf_config
    return config, files.check(state, config, what=str(path))


def write(state, config, path, **options) -> None:
    hf.write_hf(state, config, path)
