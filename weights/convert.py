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

from weights.atomic import replace_atomically
from weights.cancel import Cancelled, cancellable, cancelled_line
from weights.canonical import WeightError, validate_state
from weights.config import ConfigError, ViTConfig, config_from_json, inline_json
from weights.layouts import LAYOUTS, ORDER, REGISTRY
from weights.layouts._io import LAYOUT_METADATA_KEY, header
from weights.presets import get_config
from weights.resample import resample_state
import traceback
import shutil
import errno


def detect(path: str) -> str:
    """The layout of the file or directory at ``path``: the one this project wrote in its
    metadata, else the first in ``weights.layouts.ORDER`` that recognises it."""
    p = Path(path)
    if not p.is_dir() and not p.is_file():
        raise WeightError(f"{path!r} does not exist")
    head = header(path) if p.is_file() and p.suffix == ".safetensors" else None
    if head is not None and LAYOUT_METADATA_KEY in head[0]:
        declared = head[0][LAYOUT_METADATA_KEY]
        if declared not in REGISTRY:
            raise WeightError(
                f"{path!r} declares {LAYOUT_METADATA_KEY}={declared!r} in its metadata, not a layout this tool "
                f"knows ({', '.join(LAYOUTS)}): written by another tool or version, or edited; pass --from"
            )
        return declared
    for name in ORDER:
        if REGISTRY[name].detect(path, head):
            return name
    raise WeightError(f"{path!r} matches no known layout ({', '.join(LAYOUTS)}); pass --from")


def read(
    path: str,
    layout: str,
    config: ViTConfig | None = None,
    num_heads: int | None = None,
    img_size=None,
    cast: bool = False,
) -> tuple[ViTConfig, dict[str, np.ndarray]]:
    """Any layout -> (config, canonical state), validated strictly (``cast``: float16, bfloat16
    and float64 weights converted to float32 rather than refused)."""
    return REGISTRY[layout].read(path, config, num_heads=num_heads, img_size=img_size, cast=cast)


def write(state: dict[str, np.ndarray], config: ViTConfig, path: str, layout: str, npz_flavour: str = "vit") -> None:
    validate_state(state, config)
    REGISTRY[layout].write(state, config, path, npz_flavour=npz_flavour)


DIRECTORY_LAYOUTS = ("hf",)  # written as a directory (save_pretrained); every other layout is one file


def check_output(out: str, layout: str, force: bool = False) -> None:
    """OUT may be written: absent, or (with ``force``) a regular file or a directory of the kind
    the layout writes; never anything else (a device, a FIFO, a socket). A symlink is replaced
    itself, never followed."""
    p = Path(out)
    if not p.parent.is_dir():
        raise WeightError(f"{out!r}: the directory {str(p.parent)!r} does not exist")
    if not os.path.lexists(p):
        return
    kind = "a symlink" if p.is_symlink() else "a directory" if p.is_dir() else "a file" if p.is_file() else None
    if kind is None:
        raise WeightError(f"{out!r} exists and is not a regular file or a directory: refusing to replace it")
    if not force:
        raise WeightError(f"{out!r} exists ({kind}); pass --force to replace it")
    wants_dir = layout in DIRECTORY_LAYOUTS
    if kind != "a symlink" and p.is_dir() != wants_dir:
        raise WeightError(f"{out!r} is {kind}, but --to {layout} writes {'a directory' if wants_dir else 'a file'}")


def write_atomically(state, config: ViTConfig, out: str, layout: str, npz_flavour: str = "vit") -> None:
    """Write into a temporary file (or directory) in OUT's own directory, then rename it into
    place (``weights.atomic``): OUT is the old checkpoint or the whole new one, never half of one,
    even when the disk fills or a signal stops the write."""

    replace_atomically(
        out, lambda tmp: write(state, config, str(tmp), layout, npz_flavour), directory=layout in DIRECTORY_LAYOUTS
    )


def write_failure(e: BaseException, out: str, state: dict) -> str | None:
    """What a failed write says, when it is the file system's doing (no space, no quota, a
    read-only or unwritable place, too many open files), in one line with the figure needed;
    None for anything else (a bug of this tool). The writers raise their own types (safetensors'
    and torch's errors wrap the OS's), so a disk that cannot take the bytes is also told by its
    free space."""

    need = sum(np.asarray(v).nbytes for v in state.values())
    try:
        free = shutil.disk_usage(Path(out).parent).free
    except OSError:
        free = None
    figures = f"about {need / 1e6:.3g} MB needed" + ("" if free is None else f", {free / 1e6:.3g} MB free")
    if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
        return f"cannot write {out!r}: no space left on its device ({figures})"
    if isinstance(e, OSError):
        return f"cannot write {out!r}: {e.strerror or e}"
    text = str(e).lower()
    if (free is not None and free < need) or "no space" in text or "failed writing" in text:
        return f"cannot write {out!r}: no space left on its device ({figures}; the writer said: {describe(e)})"
    return None


def describe(e: BaseException) -> str:
    text = " ".join(str(e).split())[:300]
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def _given_config(args) -> ViTConfig | None:
    """--preset, or --config as inline JSON or a file (a mistyped path is said to be missing, not
    parsed as JSON); None when neither is given."""
    if args.preset:
        return get_config(args.preset)
    if not args.config:
        return None
    inline = inline_json(args.config)
    text = args.config if inline else Path(args.config).read_text()
    return config_from_json(text, "--config" if inline else f"the config file {args.config!r}")


def _positive(name: str):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be a positive integer, got {text!r}") from None
        if value < 1:
            raise argparse.ArgumentTypeError(f"{name} must be a positive integer, got {value}")
        return value

    return parse


def main(argv=None) -> int:
    """The command's exit status: 0 written, 2 bad input or a write the file system refused (one
    line), 3 the tool's own failure, 128 + N a signal N that cancelled it (nothing left behind)."""

    try:
        with cancellable():
            return _main(argv)
    except (Cancelled, KeyboardInterrupt) as e:
        line, code = cancelled_line("convert", e)
        print(line, file=sys.stderr)
        return code


def _main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m weights", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    c = sub.add_parser("convert", help="convert a checkpoint between layouts")
    c.add_argument("src")
    c.add_argument("out")
    c.add_argument("--to", required=True, choices=LAYOUTS)
    c.add_argument("--from", dest="src_layout", choices=LAYOUTS, help="the source layout, when it cannot be detected")
    c.add_argument("--preset", help="the config of the weights, by preset name")
    c.add_argument("--config", help="the config of the weights, as JSON (inline or a file)")
    c.add_argument("--num-heads", type=_positive("--num-heads"), help="for a timm state dict without a stored config")
    c.add_argument(
        "--img-size", type=_positive("--img-size"), nargs="+", help="for a checkpoint whose grid is not square"
    )
    c.add_argument("--force", action="store_true", help="replace OUT if it exists (atomically)")
    c.add_argument(
        "--cast",
        action="store_true",
        help="convert float16, bfloat16 and float64 weights to the canonical float32 (refused otherwise)",
    )
    c.add_argument(
        "--npz-flavour",
        choices=("vit", "big_vision"),
        default="vit",
        help="with --to big_vision: the original ViT key layout (default) or big_vision's",
    )
    c.add_argument(
        "--resample-to",
        type=_positive("--resample-to"),
        nargs="+",
        metavar="SIZE",
        help="resample the position embedding for another image size (bicubic, antialiased)",
    )
    args = parser.parse_args(argv)
    for flag in ("img_size", "resample_to"):
        if getattr(args, flag) and len(getattr(args, flag)) > 2:
            parser.error(f"--{flag.replace('_', '-')} takes one size or two (height width)")
    try:
        check_output(args.out, args.to, args.force)
        config = _given_config(args)
        img_size = (
            tuple(args.img_size)
            if args.img_size and len(args.img_size) == 2
            else (args.img_size[0] if args.img_size else None)
        )
        layout = args.src_layout or detect(args.src)
        config, state = read(args.src, layout, config, args.num_heads, img_size, cast=args.cast)
        if args.resample_to:
            size = tuple(args.resample_to) if len(args.resample_to) == 2 else args.resample_to[0]
            config, state = resample_state(state, config, size)
        check_output(args.out, args.to, args.force)  # again: it may have appeared meanwhile
    except (WeightError, ConfigError, json.JSONDecodeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"error: cannot read {e.filename or args.src!r}: {e.strerror or e}", file=sys.stderr)
        return 2
    try:
        write_atomically(state, config, args.out, args.to, args.npz_flavour)
    except (WeightError, ConfigError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except Exception as e:  # noqa: BLE001 - each writer raises its own types: the disk's doing, or this tool's
        why = write_failure(e, args.out, state)
        if why is None:
            print(
                f"INTERNAL ERROR of weights convert (a bug in the tool): {describe(e)}\n"
                + "".join(traceback.format_exception(e)[-4:]),
                file=sys.stderr,
            )
            return 3
        print(f"error: {why}", file=sys.stderr)
        return 2
    print(f"{args.src} ({layout}) -> {args.out} ({args.to}): {len(state)} tensors, {config}")
    return 0
