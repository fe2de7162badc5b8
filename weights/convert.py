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

from weights.config import ConfigError, ViTConfig, get_config
from weights import formats
from weights.canonical import CONFIG_METADATA_KEY, WeightError, validate_state
from weights.native import from_native, to_native

LAYOUTS = ("canonical", "torch", "timm", "mlx", "flax", "hf", "big_vision", "open_clip")
LAYOUT_METADATA_KEY = "vit_conformance_layout"
_NATIVE = {"mlx": "mlx", "flax": "jax"}


def _header(path: str) -> tuple[dict, set[str]]:
    """A safetensors file's metadata and keys, without reading its tensors."""
    from safetensors import safe_open

    try:
        with safe_open(path, framework="numpy") as f:
            return f.metadata() or {}, set(f.keys())
    except Exception as e:  # noqa: BLE001
        raise WeightError(f"{path!r} is not a readable safetensors file: {e}") from None


def detect(path: str) -> str:
    p = Path(path)
    if p.is_dir():
        return "hf"
    if not p.is_file():
        raise WeightError(f"{path!r} does not exist")
    if p.suffix == ".npz":
        return "big_vision"
    if p.suffix in (".pth", ".pt", ".bin"):
        return "timm"
    if p.suffix == ".safetensors":
        meta, keys = _header(path)
        if LAYOUT_METADATA_KEY in meta:
            return meta[LAYOUT_METADATA_KEY]
        if CONFIG_METADATA_KEY in meta:
            return "canonical"
        if any(k.startswith(("vit.", "classifier.")) for k in keys):
            raise WeightError(f"{path!r} is a Hugging Face state dict: convert its save_pretrained directory "
                              "(with config.json) instead")
        if any(k.startswith("visual.") for k in keys):
            return "open_clip"
        if any(k.endswith((".kernel", ".scale")) for k in keys):
            return "flax"
        if "patch_embed.proj.weight" in keys:
            return "timm"
    raise WeightError(f"{path!r} matches no known layout ({', '.join(LAYOUTS)}); pass --from")


def read(path: str, layout: str, config: ViTConfig | None = None, num_heads: int | None = None,
         img_size=None) -> tuple[ViTConfig, dict[str, np.ndarray]]:
    """Any layout -> (config, canonical state), validated strictly."""
    if layout == "hf":
        state, hf_config = formats.read_hf(path)
        config = config or hf_config
    elif layout == "open_clip":
        if config is None and str(path).endswith(".safetensors"):  # written here: the config is stored
            meta, _ = _header(str(path))
            if CONFIG_METADATA_KEY in meta:
                config = ViTConfig.from_dict(json.loads(meta[CONFIG_METADATA_KEY]))
        if config is None:
            raise WeightError(f"{path!r}: an open_clip state dict does not record its activation (QuickGELU for "
                              "OpenAI's weights, GELU for LAION's: mlfoundations/open_clip#771) nor its heads; "
                              "pass --preset or --config")
        state = formats.from_open_clip(formats.read_timm(path), config)
    elif layout == "big_vision":
        w = formats.read_npz(path)
        config = config or formats.infer_npz_config(w, img_size=img_size)
        state = formats.from_npz(w, config)
    else:
        raw = formats.read_timm(path)
        if config is None and str(path).endswith(".safetensors"):
            meta, _ = _header(str(path))
            if CONFIG_METADATA_KEY in meta:
                config = ViTConfig.from_dict(json.loads(meta[CONFIG_METADATA_KEY]))
        state = from_native(raw, _NATIVE[layout]) if layout in _NATIVE else raw
        if config is None:
            if layout in _NATIVE:
                raise WeightError(f"{path!r}: a native {layout} file without a stored config; pass --config")
            config = formats.infer_timm_config(state, num_heads=num_heads, img_size=img_size)
    return config, formats.check(state, config, what=str(path))


def write(state: dict[str, np.ndarray], config: ViTConfig, path: str, layout: str, npz_flavour: str = "vit") -> None:
    from safetensors.numpy import save_file

    validate_state(state, config)
    meta = {CONFIG_METADATA_KEY: json.dumps(config.to_dict())}
    if layout == "hf":
        formats.write_hf(state, config, path)
    elif layout == "big_vision":
        formats.write_npz(state, config, path, npz_flavour)
    elif layout == "open_clip":
        save_file(formats.to_open_clip(state, config), path, metadata={**meta, LAYOUT_METADATA_KEY: layout})
    elif layout in ("timm", "torch") and str(path).endswith((".pth", ".pt", ".bin")):
        import torch

        torch.save({k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in state.items()}, path)
    elif layout in _NATIVE:
        save_file(to_native(state, _NATIVE[layout]), path, metadata={**meta, LAYOUT_METADATA_KEY: layout})
    else:
        save_file({k: np.ascontiguousarray(v) for k, v in state.items()}, path, metadata=meta)


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
    c.add_argument("--npz-flavour", choices=("vit", "big_vision"), default="vit",
                   help="with --to big_vision: the original ViT key layout (default) or big_vision's")
    c.add_argument("--resample-to", type=int, nargs="+", metavar="SIZE",
                   help="resample the position embedding for another image size (bicubic, antialiased)")
    args = parser.parse_args(argv)
    try:
        config = None
        if args.preset:
            config = get_config(args.preset)
        elif args.config:
            text = Path(args.config).read_text() if os.path.isfile(args.config) else args.config
            config = ViTConfig.from_dict(json.loads(text))
        img_size = tuple(args.img_size) if args.img_size and len(args.img_size) == 2 else (
            args.img_size[0] if args.img_size else None)
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
