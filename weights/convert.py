"""python -m weights convert SRC OUT --to LAYOUT [--from LAYOUT]

Layouts: canonical (safetensors with the config), torch and timm (timm's state dict: a
.safetensors, or a .pth written with tensors only), mlx and flax (each framework's native
names and layouts, safetensors), hf (a save_pretrained directory: ViT, Dinov2, CLIP, SigLIP),
big_vision (.npz, in the original ViT key layout or, with --npz-flavour big_vision, in
big_vision's), open_clip (its visual tower's state dict; the config must be given).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np

from weights.canonical import WeightError, validate_state
from weights.config import ConfigError, ViTConfig, get_config

from weights.layouts import LAYOUTS, ORDER, REGISTRY
from weights.layouts._io import LAYOUT_METADATA_KEY, header


def detect(path: str) -> str:
    """The layout of the file or directory at ``path``: the one this project wrote in its
    metadata, else the first in ``weights.layouts.ORDER`` that recognises it."""
    p = Path(path)
    if not p.is_dir() and not p.is_file():
        raise WeightError(f"{path!r} does not exist")
    head = header(path) if p.is_file() and p.suffix == ".safetensors" else None
    if head is not None and LAYOUT_METADATA_KEY in head[0]:
        return head[0][LAYOUT_METADATA_KEY]
    for name in ORDER:
        if REGISTRY[name].detect(path, head):
            return name
    raise WeightError(f"{path!r} matches no known layout ({', '.join(LAYOUTS)}); pass --from")


def read(
    path: str, layout: str, config: ViTConfig | None = None, num_heads: int | None = None, img_size=None
) -> tuple[ViTConfig, dict[str, np.ndarray]]:
    """Any layout -> (config, canonical state), validated strictly."""
    return REGISTRY[layout].read(path, config, num_heads=num_heads, img_size=img_size)


def write(state: dict[str, np.ndarray], config: ViTConfig, path: str, layout: str, npz_flavour: str = "vit") -> None:
    validate_state(state, config)
    REGISTRY[layout].write(state, config, path, npz_flavour=npz_flavour)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m weights", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    c = sub.add_parser("convert", help="convert a checkpoint between layouts")
    c.add_argument("src")
    c.add_argument("out")
    c.add_argument("--to", required=True, choices=LAYOUTS)
    c.add_argument("--from", dest="src_layout", choices=LAYOUTS, help="the source layout, when it cannot be detected")
    c.add_argument("--preset", help="the config of the weights, by preset name")
    c.add_argument("--config", help="the config of the weights, as JSON (inline or a file)")
    c.add_argument("--num-heads", type=int, help="for a timm state dict without a stored config")
    c.add_argument("--img-size", type=int, nargs="+", help="for a checkpoint whose grid is not square")
    c.add_argument(
        "--npz-flavour",
        choices=("vit", "big_vision"),
        default="vit",
        help="with --to big_vision: the original ViT key layout (default) or big_vision's",
    )
    c.add_argument(
        "--resample-to",
        type=int,
        nargs="+",
        metavar="SIZE",
        help="resample the position embedding for another image size (bicubic, antialiased)",
    )
    args = parser.parse_args(argv)
    try:
        config = None
        if args.preset:
            config = get_config(args.preset)
        elif args.config:
            text = Path(args.config).read_text() if os.path.isfile(args.config) else args.config
            config = ViTConfig.from_dict(json.loads(text))
        img_size = (
            tuple(args.img_size)
            if args.img_size and len(args.img_size) == 2
            else (args.img_size[0] if args.img_size else None)
        )
        layout = args.src_layout or detect(args.src)
        config, state = read(args.src, layout, config, args.num_heads, img_size)
        if args.resample_to:
            from weights.resample import resample_state

            size = tuple(args.resample_to) if len(args.resample_to) == 2 else args.resample_to[0]
            config, state = resample_state(state, config, size)
        write(state, config, args.out, args.to, args.npz_flavour)
    except (WeightError, ConfigError, json.JSONDecodeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"{args.src} ({layout}) -> {args.out} ({args.to}): {len(state)} tensors, {config}")
    return 0
