"""The checkpoint layouts' conversions by their old address, re-exported for one release: each
layout's own module now holds its detection, reading, writing, conversion and config inference
(weights/layouts/: ``big_vision`` the .npz, ``open_clip``, ``timm``), and what every layout
shares, reading a file's tensors and holding them to the canonical rule, is weights/files.py."""

from weights.files import check, read_timm, stored_float32  # noqa: F401
from weights.layouts.big_vision import (  # noqa: F401
    MAX_INFLATION,
    NPZ_HOLDS,
    detect_npz_flavour,
    from_npz,
    infer_npz_config,
    read_npz,
    to_npz,
    write_npz,
)
from weights.layouts.open_clip import OPEN_CLIP_HOLDS, from_open_clip, to_open_clip  # noqa: F401
from weights.layouts.timm import infer_timm_config  # noqa: F401
