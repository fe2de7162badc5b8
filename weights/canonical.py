"""The canonical weight format: timm's state-dict names and layouts, float32, safetensors.

Loading is always strict. A state that does not fit its config raises one WeightError that
names every offending key, what was expected and what was found.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping

import numpy as np

from weights.atomic import replace_atomically
from weights.config import ViTConfig, config_from_json
from collections import Counter
import struct

CONFIG_METADATA_KEY = "vit_config"


class WeightError(ValueError):
    """A weight file or state dict that does not fit what is expected."""


def expected_shapes(config: ViTConfig) -> dict[str, tuple[int, ...]]:
    """Every canonical key for ``config`` with its shape, in timm's state_dict order."""
    D, C = config.embed_dim, config.in_chans
    ph, pw = config.patch_size
    hd = config.head_dim
    shapes: dict[str, tuple[int, ...]] = {}
    if config.class_token:
        shapes["cls_token"] = (1, 1, D)
    if config.reg_tokens:
        shapes["reg_token"] = (1, config.reg_tokens, D)
    if config.pos_embed == "learn":
        shapes["pos_embed"] = (1, config.embed_len, D)
    if config.distilled:  # the root's parameters come first in timm's state_dict, in the order set
        shapes["dist_token"] = (1, 1, D)
    if config.patch_norm:
        shapes["patch_embed.patch_norm.weight"] = (config.patch_dim,)
        if config.use_norm_bias:
            shapes["patch_embed.patch_norm.bias"] = (config.patch_dim,)
    shapes["patch_embed.proj.weight"] = (D, C, ph, pw)
    if config.use_patch_bias:  # timm: bias=not pre_norm
        shapes["patch_embed.proj.bias"] = (D,)
    if config.embed_norm:
        shapes["patch_embed.norm.weight"] = (D,)
        if config.use_norm_bias:
            shapes["patch_embed.norm.bias"] = (D,)
    if config.rope_type == "mixed":  # timm's Eva: RoPE-Mixed's learned frequencies, after the patch embedding
        shapes["rope.freqs"] = (2, config.depth, config.num_heads, hd // 2)
    if config.pre_norm:
        shapes["norm_pre.weight"] = (D,)
        if config.use_norm_bias:
            shapes["norm_pre.bias"] = (D,)
    for i in range(config.depth):
        shapes.update({f"blocks.{i}.{k}": shape for k, shape in block_shapes(config, i).items()})
    if config.use_final_norm:
        shapes["norm.weight"] = (D,)
        if config.use_norm_bias:
            shapes["norm.bias"] = (D,)
    if config.global_pool == "map":  # timm's AttentionPoolLatent, with its defaults (qkv bias, plain Mlp)
        shapes["attn_pool.latent"] = (1, 1, D)
        for key, shape in attn_pool_shapes(D, config.num_heads, config.mlp_hidden_dim).items():
            shapes[f"attn_pool.{key}"] = shape
    if config.use_fc_norm:
        shapes["fc_norm.weight"] = (D,)
        if config.use_norm_bias:
            shapes["fc_norm.bias"] = (D,)
    if config.num_classes:
        shapes["head.weight"] = (config.num_classes, D)
        shapes["head.bias"] = (config.num_classes,)
    if config.distilled and config.num_classes:  # timm's VisionTransformerDistilled: after its parent's
        shapes["head_dist.weight"] = (config.num_classes, D)
        shapes["head_dist.bias"] = (config.num_classes,)
    return shapes


def block_shapes(config: ViTConfig, i: int = 0) -> dict[str, tuple[int, ...]]:
    """Block ``i``'s canonical keys (relative to ``blocks.{i}``) with their shapes, in timm's order
    (the blocks differ only in SAM's relative position tables: a window's, or the grid's)."""
    D, hd, hidden = config.embed_dim, config.head_dim, config.mlp_hidden_dim
    shapes: dict[str, tuple[int, ...]] = {}
    if config.rel_pos_bias and config.init_values is not None:  # timm's Beit: its gammas, the block's own, first
        shapes.update({"ls1.gamma": (D,), "ls2.gamma": (D,)})
    shapes["norm1.weight"] = (D,)
    if config.use_norm_bias:
        shapes["norm1.bias"] = (D,)
    qkv = qkv_shapes(config)
    own = {k: v for k, v in qkv.items() if k.count(".") == 1}  # the attention's own (q_bias, v_bias)
    shapes.update(own)
    if config.rel_pos_bias:  # timm's Beit: after the attention's own biases, before its modules
        shapes["attn.relative_position_bias_table"] = (config.num_relative_distance, config.num_heads)
    if config.use_rel_pos:  # timm's VisionTransformerSAM: the attention's own, before its modules
        sh, sw = config.rel_pos_grid(i)
        shapes.update({"attn.rel_pos_h": (2 * sh - 1, hd), "attn.rel_pos_w": (2 * sw - 1, hd)})
    shapes.update({k: v for k, v in qkv.items() if k not in own})
    if config.qk_norm:
        for n in ("q_norm", "k_norm"):
            shapes[f"attn.{n}.weight"] = (hd,)
            shapes[f"attn.{n}.bias"] = (hd,)
    shapes["attn.proj.weight"] = (D, D)
    if config.proj_bias:
        shapes["attn.proj.bias"] = (D,)
    if config.init_values is not None and not config.rel_pos_bias:
        shapes["ls1.gamma"] = (D,)
    shapes["norm2.weight"] = (D,)
    if config.use_norm_bias:
        shapes["norm2.bias"] = (D,)
    fc1 = ("fc1_g", "fc1_x") if config.mlp_layer == "swiglu" else ("fc1",)
    for fc in fc1:
        shapes[f"mlp.{fc}.weight"] = (hidden, D)
        if config.use_mlp_bias:
            shapes[f"mlp.{fc}.bias"] = (hidden,)
    if config.scale_mlp:
        shapes["mlp.norm.weight"] = (config.mlp_act_dim,)
        shapes["mlp.norm.bias"] = (config.mlp_act_dim,)
    shapes["mlp.fc2.weight"] = (D, config.mlp_act_dim)
    if config.use_mlp_bias:
        shapes["mlp.fc2.bias"] = (D,)
    if config.init_values is not None and not config.rel_pos_bias:
        shapes["ls2.gamma"] = (D,)
    return shapes


def qkv_shapes(config: ViTConfig) -> dict[str, tuple[int, ...]]:
    """A block's q, k and v projections (keys relative to the block), in timm's order: a fused
    ``attn.qkv`` with its bias, or with q's and v's apart (timm's Eva, BEiT: ``k_bias=False``),
    or three projections (``qkv_fused=False``)."""
    D, bias = config.embed_dim, config.qkv_bias
    if not config.qkv_fused:
        shapes = {}
        for part in "qkv":
            shapes[f"attn.{part}_proj.weight"] = (D, D)
            if bias and (config.k_bias or part != "k"):
                shapes[f"attn.{part}_proj.bias"] = (D,)
        return shapes
    if bias and not config.k_bias:
        return {"attn.q_bias": (D,), "attn.v_bias": (D,), "attn.qkv.weight": (3 * D, D)}
    return {"attn.qkv.weight": (3 * D, D), **({"attn.qkv.bias": (3 * D,)} if bias else {})}


def qkv_rows(state: Mapping[str, np.ndarray], attn: str, dim: int) -> dict[str, tuple]:
    """Where q's, k's and v's weights and biases are in whichever of ``qkv_shapes``'s layouts the
    attention ``attn`` ("blocks.3.attn") has: part -> ((weight key, first row), (bias key, first
    row) or None), each part ``dim`` rows from its first."""
    if f"{attn}.qkv.weight" not in state:
        return {
            p: (
                (f"{attn}.{p}_proj.weight", 0),
                (f"{attn}.{p}_proj.bias", 0) if f"{attn}.{p}_proj.bias" in state else None,
            )
            for p in "qkv"
        }
    rows = {}
    for j, p in enumerate("qkv"):
        if f"{attn}.qkv.bias" in state:
            bias = (f"{attn}.qkv.bias", j * dim)
        else:  # timm's Eva and BEiT: q's and v's apart, k none
            bias = (f"{attn}.{p}_bias", 0) if f"{attn}.{p}_bias" in state else None
        rows[p] = ((f"{attn}.qkv.weight", j * dim), bias)
    return rows


def qkv_parts(state: Mapping[str, np.ndarray], attn: str, dim: int) -> list[tuple[np.ndarray, np.ndarray | None]]:
    """(weight, bias or None) of q, k and v, wherever ``qkv_rows`` finds them."""
    parts = []
    for (wkey, w0), bias in qkv_rows(state, attn, dim).values():
        b = None if bias is None else state[bias[0]][bias[1] : bias[1] + dim]
        parts.append((state[wkey][w0 : w0 + dim], b))
    return parts


def mha_shapes(dim: int, context_dim: int | None, num_heads: int, head_dim: int, qkv_bias: bool = True):
    """Canonical keys of the standalone MultiHeadAttention (timm AttentionPoolLatent names)."""
    context_dim = dim if context_dim is None else context_dim
    inner = num_heads * head_dim
    shapes = {
        "q.weight": (inner, dim),
        "kv.weight": (2 * inner, context_dim),
        "proj.weight": (dim, inner),
        "proj.bias": (dim,),
    }
    if qkv_bias:
        shapes.update({"q.bias": (inner,), "kv.bias": (2 * inner,)})
    return shapes


def attn_pool_shapes(dim: int, num_heads: int, hidden: int) -> dict[str, tuple[int, ...]]:
    """AttentionPoolLatent's layers after its latent: the attention's ``q``/``kv``/``proj``, then
    ``norm`` and ``mlp`` on the residual."""
    shapes = mha_shapes(dim, None, num_heads, dim // num_heads)
    shapes = {k: shapes[k] for k in ("q.weight", "q.bias", "kv.weight", "kv.bias", "proj.weight", "proj.bias")}
    shapes.update(
        {
            "norm.weight": (dim,),
            "norm.bias": (dim,),
            "mlp.fc1.weight": (hidden, dim),
            "mlp.fc1.bias": (hidden,),
            "mlp.fc2.weight": (dim, hidden),
            "mlp.fc2.bias": (dim,),
        }
    )
    return shapes


def _raise(problems: list[str], what: str) -> None:
    if problems:
        raise WeightError(f"{what} does not fit ({len(problems)} problem(s)):\n  " + "\n  ".join(problems))


def shape_problems(expected: Mapping[str, tuple], found: Mapping[str, tuple]) -> list[str]:
    problems = []
    for key in expected:
        if key not in found:
            problems.append(f"missing key {key!r}: expected shape {tuple(expected[key])}")
    for key in found:
        if key not in expected:
            problems.append(f"unexpected key {key!r} with shape {tuple(found[key])}: not a parameter here")
        elif tuple(found[key]) != tuple(expected[key]):
            problems.append(f"key {key!r}: expected shape {tuple(expected[key])}, found {tuple(found[key])}")
    return problems


def check_exact_match(expected: Mapping[str, tuple], found: Mapping[str, tuple], what: str = "state") -> None:
    """Raise WeightError unless ``found`` has exactly the keys and shapes of ``expected``."""
    _raise(shape_problems(expected, found), what)


def validate_state(
    state: Mapping[str, np.ndarray], config: ViTConfig | None = None, *, expected=None, what: str = "state"
) -> None:
    """Check keys, shapes, dtypes and values of a canonical state against ``config``."""
    if expected is None:
        expected = expected_shapes(config)
    if not isinstance(state, Mapping):
        raise WeightError(f"{what} must be a mapping of names to arrays, got {type(state).__name__}")
    problems = []
    shapes = {}
    for key, value in state.items():
        if not isinstance(value, np.ndarray):
            problems.append(f"key {key!r}: expected a NumPy array, found {type(value).__name__}")
            continue
        shapes[key] = value.shape
        if not np.issubdtype(value.dtype, np.floating):
            problems.append(f"key {key!r}: expected a float dtype (float32), found {value.dtype}")
        elif not np.all(np.isfinite(value)):
            n_nan, n_inf = int(np.isnan(value).sum()), int(np.isinf(value).sum())
            problems.append(f"key {key!r}: expected finite values, found {n_nan} NaN and {n_inf} Inf")
    _raise(shape_problems(expected, shapes) + problems, what)


CASTABLE = ("float16", "bfloat16", "float64")  # converted to float32 only when asked (--cast)


def as_float32(state: Mapping, *, cast: bool = False, what: str = "state") -> dict[str, np.ndarray]:
    """A state read from a file, as the canonical float32: float32 arrays as they are; float16,
    bfloat16 and float64 only with ``cast`` (values beyond float32's range refused, never made
    Inf); every other dtype (integers, complex, booleans) and anything that is not an array
    refused, each naming its key. The same rule on every path (safetensors, .pth, .npz, HF)."""
    problems, out = [], {}
    largest = float(np.finfo(np.float32).max)
    for key, value in state.items():
        if not isinstance(value, np.ndarray):
            problems.append(f"key {key!r}: expected an array, found {type(value).__name__}")
            continue
        name = str(value.dtype)
        if name == "float32":
            out[key] = value
        elif name not in CASTABLE:
            problems.append(f"key {key!r}: dtype {name}, expected float32 (or float16, bfloat16, float64 with --cast)")
        elif not cast:
            problems.append(f"key {key!r}: {name}, where the canonical format is float32: pass --cast to convert it")
        else:
            wide = value.astype(np.float64)
            finite = np.abs(wide[np.isfinite(wide)])
            if finite.size and finite.max() > largest:
                problems.append(f"key {key!r}: values up to {finite.max():.3g} overflow float32")
                continue
            out[key] = wide.astype(np.float32)
    _raise(problems, what)
    return out


def to_float32(state: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in state.items()}


def save_state(state: Mapping[str, np.ndarray], path: str | os.PathLike, config: ViTConfig | None = None) -> None:
    """Write canonical float32 tensors to safetensors, with the config in the metadata: whole or
    not at all, with the umask's mode (``weights.atomic``)."""
    from safetensors.numpy import save_file

    if config is not None:
        validate_state(state, config)
    metadata = {CONFIG_METADATA_KEY: json.dumps(config.to_dict())} if config is not None else None
    tensors = to_float32(state)
    replace_atomically(path, lambda tmp: save_file(tensors, str(tmp), metadata=metadata))


HEADER_LIMIT = 100_000_000  # safetensors' own limit on a header's bytes


def check_header(path: str | os.PathLike) -> None:
    """A safetensors header names each tensor once: the format disallows duplicates, which the
    reader would take silently (the last one wins). A header that is not JSON is left for the
    reader to refuse in its own words."""

    try:
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                return
            (size,) = struct.unpack("<Q", head)
            if size > HEADER_LIMIT:
                return
            text = f.read(size)
    except OSError:
        return
    calls: list[list[str]] = []  # per JSON object, its repeated keys; the header itself is the last

    def pairs(items):

        calls.append(sorted(k for k, n in Counter(k for k, _ in items).items() if n > 1))
        return dict(items)

    try:
        json.loads(text, object_pairs_hook=pairs)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return
    duplicates = calls[-1] if calls else []
    if duplicates:
        raise WeightError(
            f"{str(path)!r} is not a valid safetensors file: its header names {', '.join(map(repr, duplicates[:4]))} "
            "more than once (the format allows each key once)"
        )


CONVERT_FIRST = "python -m weights convert {src} OUT.safetensors --to canonical"


def _check_file(path) -> None:
    """A canonical file is one safetensors file: anything else is told what it is."""
    path = str(path)
    if os.path.isdir(path):
        raise WeightError(
            f"{path!r} is a directory, not a canonical safetensors file (a Hugging Face checkpoint? convert it "
            f"first: {CONVERT_FIRST.format(src=path)})"
        )
    if not os.path.isfile(path):
        raise WeightError(f"weight file {path!r} does not exist")
    if path.endswith((".pth", ".pt", ".bin", ".npz")):
        raise WeightError(
            f"{path!r} is a {'NumPy archive' if path.endswith('.npz') else 'torch checkpoint'}, not a canonical "
            f"safetensors file: convert it first ({CONVERT_FIRST.format(src=path)})"
        )


def read_config(path: str | os.PathLike) -> ViTConfig | None:
    """The ViTConfig stored in a canonical file's metadata, or None."""
    from safetensors import safe_open

    _check_file(path)
    check_header(path)
    try:
        with safe_open(str(path), framework="numpy") as f:
            meta = f.metadata() or {}
    except Exception as e:  # safetensors raises its own error types for a bad header
        raise WeightError(f"{str(path)!r} is not a readable safetensors file: {e}") from None
    if CONFIG_METADATA_KEY not in meta:
        return None
    return config_from_json(meta[CONFIG_METADATA_KEY], f"the config stored in {str(path)!r}")


def load_state(path: str | os.PathLike, config: ViTConfig | None = None) -> dict[str, np.ndarray]:
    """Read a canonical safetensors file and validate it against ``config``.

    ``config`` defaults to the one stored in the file; a file with neither is refused.
    """
    import ml_dtypes  # noqa: F401 - registers bfloat16 with NumPy: such a file is refused by name, not unreadable
    from safetensors.numpy import load_file

    path = str(path)
    _check_file(path)
    check_header(path)
    try:
        state = load_file(path)
    except Exception as e:  # safetensors raises its own error types for a bad header
        raise WeightError(f"{path!r} is not a readable safetensors file: {e}") from None
    if config is None:
        config = read_config(path)
        if config is None:
            raise WeightError(f"{path!r} has no {CONFIG_METADATA_KEY!r} metadata: pass the config")
    state = as_float32(state, what=path)
    validate_state(state, config, what=path)
    return {k: np.ascontiguousarray(state[k]) for k in expected_shapes(config)}  # timm's order, not the file's
