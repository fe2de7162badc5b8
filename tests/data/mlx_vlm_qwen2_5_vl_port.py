"""mlx-vlm 0.7's Qwen2.5-VL vision tower (mlx_vlm/models/qwen2_5_vl/vision.py), unmodified, as
tests/data/hf_qwen2_5_vl_port.py reads transformers': MLX, Qwen2-VL's processing of the images done by
a wrapper, its tokens in 2 x 2 merge groups in one sequence (``sequence="merge2x2"``), its attention
one mx.fast call per image or window, its merger after the tower left in place (out of scope);
windows covering the image."""

from dataclasses import replace

import numpy as np

from conformance.capture import ModelPort
from tests.data import hf_qwen2_5_vl_port as hf

T, MERGE = hf.T, hf.MERGE


def build(config, window=None, full=None):
    """``window``: Qwen2.5-VL's window_size in pixels (default the image's side: one window); ``full``:
    its fullatt_block_indexes (default the config's global_attn_indexes, or the last block)."""
    import mlx.core as mx
    import mlx.nn as nn
    from mlx_vlm.models.qwen2_5_vl.config import VisionConfig
    from mlx_vlm.models.qwen2_5_vl.vision import VisionModel

    hf.mergeable(config)
    p, (H, W), C = config.patch_size[0], config.img_size, config.in_chans
    visual = VisionModel(VisionConfig(**hf.settings(config), **hf.windows(config, window, full)))

    class Processed(nn.Module):
        """Images (B, C, H, W) as Qwen2-VL's processor gives them to the tower."""

        def __init__(self):
            super().__init__()
            self.visual = visual

        def __call__(self, images):
            B, gh, gw = images.shape[0], H // p, W // p
            x = mx.broadcast_to(images[:, None], (B, T, C, H, W))
            x = x.reshape(B, T, C, gh // MERGE, MERGE, p, gw // MERGE, MERGE, p).transpose(0, 3, 6, 4, 7, 2, 1, 5, 8)
            return self.visual(x.reshape(B * gh * gw, C * T * p * p), mx.array([[1, gh, gw]] * B))

    return Processed()


def convert(state):
    """transformers' layout (hf.convert), the patch kernel in MLX's (O, T, kh, kw, C)."""
    out = hf.convert(state)
    out["visual.patch_embed.proj.weight"] = np.ascontiguousarray(
        out["visual.patch_embed.proj.weight"].transpose(0, 2, 3, 4, 1)
    )
    return out


port = ModelPort(build, convert=convert, tower="blocks.{last}", sequence="merge2x2", supports=hf.SUPPORTS)


def _gate_for_up(state):
    """A convert that sends the gate's weights to up_proj and the value's to gate_proj."""
    out = convert(state)
    for key in [k for k in out if ".mlp.gate_proj." in k]:
        other = key.replace("gate_proj", "up_proj")
        out[key], out[other] = out[other], out[key]
    return out


gate_for_up = ModelPort(build, convert=_gate_for_up, tower="blocks.{last}", sequence="merge2x2", supports=hf.SUPPORTS)
# windows smaller than the image (tests/data/hf_qwen2_5_vl_port.py's windowed)
_window = hf._window
windowed = replace(port, build=lambda config: build(config, window=_window(config)), supports=hf.WINDOWED)
windows_ignored = replace(
    windowed, build=lambda config: build(config, window=_window(config), full=list(range(config.depth)))
)
