"""The original ViT .npz (google-research/vision_transformer) and big_vision's (token, 'gap',
SigLIP's MAP head; scanned or not)."""

from __future__ import annotations

from weights import formats


def detect(path, header) -> bool:
    return header is None and str(path).endswith(".npz")


def read(path, config=None, img_size=None, cast=False, **options):
    w = formats.read_npz(path)
    config = config or formats.infer_npz_config(w, img_size=img_size)
    state = formats.from_npz(formats.stored_float32(w, cast, path), config)
    return config, formats.check(state, config, what=str(path))


def write(state, config, path, npz_flavour="vit", **options) -> None:
    formats.write_npz(state, config, path, npz_flavour)
