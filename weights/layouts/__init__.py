"""Checkpoint layouts, one module each, in a registry that ``python -m weights convert`` loops
over: a layout is a name and three functions (the ``Layout`` protocol below).

    detect(path, header) -> bool    the file at ``path`` is in this layout (``header``: a
                                    safetensors file's (metadata, keys), None for other files)
    read(path, config, options)     -> (config, canonical state), validated strictly
    write(state, config, path, options)

``ORDER`` is the order detection tries them in (a layout this project wrote is named in the
file's metadata and found first). Adding a layout is one module and one entry.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from weights.layouts import big_vision, canonical, hf, naflex, native, open_clip, timm


@dataclass(frozen=True)
class Layout:
    name: str
    detect: Callable[[str, Any], bool]
    read: Callable[..., tuple]
    write: Callable[..., None]


REGISTRY: dict[str, Layout] = {
    "canonical": Layout("canonical", canonical.detect, canonical.read, canonical.write),
    "torch": Layout("torch", timm.detect_never, timm.read, timm.write),  # timm's state dict under torch's name
    "timm": Layout("timm", timm.detect, timm.read, timm.write),
    "mlx": Layout("mlx", native.detect_never, native.reader("mlx"), native.writer("mlx")),
    "flax": Layout("flax", native.detect_flax, native.reader("flax"), native.writer("flax")),
    "hf": Layout("hf", hf.detect, hf.read, hf.write),
    "big_vision": Layout("big_vision", big_vision.detect, big_vision.read, big_vision.write),
    "open_clip": Layout("open_clip", open_clip.detect, open_clip.read, open_clip.write),
    "naflex": Layout("naflex", naflex.detect, naflex.read, naflex.write),  # timm's NaFlexVit
}
LAYOUTS = tuple(REGISTRY)
# Detection order: a directory, then by suffix, then a safetensors file by its keys.
ORDER = ("hf", "big_vision", "canonical", "open_clip", "flax", "naflex", "timm")
