"""transformers' Qwen2.5-VL vision tower (Qwen2_5_VisionTransformerPretrainedModel), unmodified,
as Qwen2.5-VL reads it, up to its last block (the merger after it out of scope). Its input is what
Qwen2-VL's image processor makes of the images, done here by a wrapper: each image as two identical
frames, flattened into patches of (C, T, p, p) in 2 x 2 merge groups, every image in one sequence with
``grid_thw``; its attention one call per image or window (cu_seqlens); RMSNorm, Qwen2-VL's rotation
(timm's 'cat' bands laid out as halves), SwiGLU with biases, no final norm; its merger, after the tower,
left in place: its parameters out of scope, as the stages after the tower are. Its windows here cover the
whole image (``window_size`` the image's side): window attention is not exercised."""

from dataclasses import replace

import numpy as np

from conformance.capture import ModelPort, rename_function
from impls.protocol import ANY, Unsupported

T, MERGE = 2, 2  # Qwen2-VL's temporal patch and spatial merge


def mergeable(config) -> None:
    """Qwen2-VL's processor groups 2 x 2 patches: a grid of odd sides is no input of this tower."""
    if any(g % MERGE for g in config.grid_size):
        raise Unsupported(f"Qwen2-VL merges {MERGE} x {MERGE} patches: grid {config.grid_size} must have even sides")


def settings(config) -> dict:
    """The tower's sizes in Qwen2-VL's vision config names (transformers' and mlx-vlm's, Qwen2.5-VL's
    and Qwen3-VL's alike), the merger's output as wide as the tower."""
    return dict(
        depth=config.depth,
        hidden_size=config.embed_dim,
        intermediate_size=config.mlp_hidden_dim,
        num_heads=config.num_heads,
        in_channels=config.in_chans,
        patch_size=config.patch_size[0],
        spatial_merge_size=MERGE,
        temporal_patch_size=T,
        out_hidden_size=config.embed_dim,
    )


def windows(config, window=None, full=None) -> dict:
    """Qwen2.5-VL's window settings: ``window`` its window_size in pixels (default the image's side: one
    window), ``full`` its fullatt_block_indexes (default the config's global_attn_indexes, or the last block)."""
    every = list(config.global_attn_indexes) if config.window_size else [config.depth - 1]
    return dict(window_size=window or config.img_size[0], fullatt_block_indexes=full or every)


def build(config, window=None, full=None, gain=False):
    """``window``, ``full``: as ``windows`` takes them; ``gain``: the wrapper scales the patches by a
    parameter of its own, at 1 (a part no option names)."""
    mergeable(config)
    from transformers.models.qwen2_5_vl.configuration_qwen2_5_vl import Qwen2_5_VLVisionConfig
    from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VisionTransformerPretrainedModel

    visual = Qwen2_5_VisionTransformerPretrainedModel._from_config(
        Qwen2_5_VLVisionConfig(**settings(config), **windows(config, window, full))
    )

    return processed(visual, config, gain)


def processed(visual, config, gain=False):
    """``visual`` (a Qwen2-VL-style tower: flattened patches and ``grid_thw``) under a wrapper that
    takes images (B, C, H, W) and gives it what Qwen2-VL's processor makes of them."""
    import torch

    p, (H, W), C = config.patch_size[0], config.img_size, config.in_chans

    class Processed(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.visual = visual
            self.gain = torch.nn.Parameter(torch.ones(())) if gain else None

        def forward(self, images):
            B, gh, gw = images.shape[0], H // p, W // p
            x = images[:, None].expand(B, T, C, H, W) * (1 if self.gain is None else self.gain)
            x = x.reshape(B, T, C, gh // MERGE, MERGE, p, gw // MERGE, MERGE, p).permute(0, 3, 6, 4, 7, 2, 1, 5, 8)
            x = x.reshape(B * gh * gw, C * T * p * p)
            return self.visual(x, torch.tensor([[1, gh, gw]] * B))

    return Processed().eval()


# timm's names -> Qwen2.5-VL's (segments): its blocks keep timm's names but for the MLP's
RENAME = {
    "blocks": "visual.blocks",
    "mlp.fc1_g": "mlp.gate_proj",
    "mlp.fc1_x": "mlp.up_proj",
    "mlp.fc2": "mlp.down_proj",
}


def convert(state):
    """The canonical state under Qwen2.5-VL's names; the patch kernel over its two identical frames
    read from the first (the second's zero: the projection is the image's)."""
    rename = rename_function(RENAME)
    out = {rename(k): v for k, v in state.items() if k != "patch_embed.proj.weight"}
    w = np.asarray(state["patch_embed.proj.weight"])
    out["visual.patch_embed.proj.weight"] = np.stack([w, np.zeros_like(w)], axis=2)
    return out


SUPPORTS = {
    "num_classes": 0,  # a tower: its features are its output
    "pos_embed": "none",
    "rope_type": "cat",
    "rope_rotate_half": True,
    "patch_bias": False,
    "norm_layer": "rmsnorm",
    "final_norm": False,
    "class_token": False,
    "global_pool": "avg",
    "mlp_layer": "swiglu",
    "act_layer": "silu",
    "norm_eps": 1e-6,
    "qkv_bias": True,  # its qkv and its MLP's projections have biases
    "proj_bias": True,
    "square_images": True,
    "square_patches": True,
}
port = ModelPort(build, convert=convert, tower="blocks.{last}", sequence="merge2x2", supports=SUPPORTS)
# the port that reads its merge-grouped sequence as row-major: every token in another place
row_major = ModelPort(build, convert=convert, tower="blocks.{last}", sequence="one", supports=SUPPORTS)
# a parameter no canonical key fills before the tower's output: unlike the merger's, a finding
gained = replace(port, build=lambda config: build(config, gain=True))


def _window(config) -> int:
    """Qwen2.5-VL's window_size in pixels: the config's window_size patches, else half the image's side."""
    return (config.window_size or config.grid_size[0] // 2) * config.patch_size[0]


# Qwen2.5-VL's windows smaller than the image (in blocks but the last, attention within windows of merge
# groups, in window order): window_partition='truncate' expresses them
WINDOWED = {
    **SUPPORTS,
    "window_size": (0, 2, 4, 8),  # whole merge groups (Qwen2.5-VL's own: 8 patches of 14)
    "window_partition": ("pad", "truncate"),
    "global_attn_indexes": ANY,
}
windowed = replace(port, build=lambda config: build(config, window=_window(config)), supports=WINDOWED)
# the companion: its tokens in window order but every block attending over the whole image (all of them
# in fullatt_block_indexes, the windows' cu_seqlens never used)
windows_ignored = replace(
    windowed, build=lambda config: build(config, window=_window(config), full=list(range(config.depth)))
)


def _cast_whole(config, dtype):
    """The tower cast by ``model.to(dtype)`` (NVIDIA-NeMo/Automodel#3856's cast_model_to_dtype): its
    rotary ``inv_freq``, a buffer no checkpoint holds, rounded to the dtype with the weights."""
    import torch

    return build(config).to(getattr(torch, dtype))


# the companion of the tool's own cast (parameters only): its rotation's angles in the dtype
freqs_in_dtype = replace(port, build=_cast_whole)
