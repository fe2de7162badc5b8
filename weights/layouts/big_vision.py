"""The original ViT .npz (google-research/vision_transformer) and big_vision's (token, 'gap',
SigLIP's MAP head; scanned or not): HWIO conv kernel, (D, H, hd) q/k/v kernels and an (H, hd, D)
out kernel; the two key layouts timm's ``_load_weights`` tells apart. Every conversion is exact
(transposes, reshapes and concatenations): a round trip returns the canonical tensors bitwise."""

from __future__ import annotations

import os
import re
import zipfile
from collections.abc import Mapping

import numpy as np

from weights.canonical import WeightError, expected_shapes
from weights.config import ViTConfig
from weights.options import holds
from weights.files import check, stored_float32


def _npz_names(config: ViTConfig, flavour: str, prefix: str | None = None) -> dict:
    if flavour == "big_vision":  # params/, or params/img/ in a two-tower (SigLIP) checkpoint
        return {
            "prefix": "params/" if prefix is None else prefix,
            "pos": "pos_embedding",
            "mha": "MultiHeadDotProductAttention_0",
            "ln2": "LayerNorm_1",
            "mlp": "MlpBlock_0",
        }
    return {
        "prefix": "",
        "pos": "Transformer/posembed_input/pos_embedding",
        "mha": "MultiHeadDotProductAttention_1",
        "ln2": "LayerNorm_2",
        "mlp": "MlpBlock_3",
    }


# What the .npz layouts hold beyond the original ViT: SigLIP's MAP head, 'gap' pooling (after
# the final norm: fc_norm=False), no class token, and (big_vision) a class token without a
# position entry. The activation is not stored: big_vision's is tanh GELU (flax's nn.gelu),
# timm reads its checkpoints with the act_layer of the model it builds.
NPZ_HOLDS = holds("npz")  # weights/options.py


def _check_npz_pooling(config: ViTConfig, flavour: str = "vit") -> None:
    wrong = [f"{k}={getattr(config, k)!r}" for k, ok in NPZ_HOLDS.items() if getattr(config, k) not in ok]
    if config.no_embed_class and config.class_token and flavour != "big_vision":
        wrong.append(
            "no_embed_class=True (the original ViT layout gives the class token a position; write big_vision's)"
        )
    if config.pos_embed_grid_size is not None:  # big_vision's NaFlex ViT (SigLIP 2): its one square table
        (gh, gw), naflex = config.pos_grid, ("big_vision", "bilinear", False, True)
        if (flavour, config.pos_embed_interp_mode, config.class_token, gh == gw) != naflex:
            wrong.append(
                f"pos_embed_grid_size={config.pos_grid} (big_vision's NaFlex ViT holds a square table resized "
                "bilinearly, no class token; write flavour 'big_vision')"
            )
    if wrong:
        raise WeightError(
            f"the .npz layout holds the original ViT and SigLIP's options, not {', '.join(wrong)}: "
            "writing it would drop those weights"
        )
    if config.global_pool in ("avg", "avgmax", "max") and config.use_fc_norm or config.global_pool in ("avgmax", "max"):
        raise WeightError(
            "the .npz layouts pool the class token, attend with a MAP head, or (big_vision's 'gap') "
            f"average after the final norm; this config's global_pool={config.global_pool!r} with "
            "fc_norm normalises after pooling (timm's fc_norm), a different function: no .npz layout "
            "holds it"
        )


def _split_heads_kernel(w, H, hd, D):
    """(H*hd, D) rows -> big_vision's (D, H, hd) kernel."""
    return w.reshape(H, hd, D).transpose(2, 0, 1)


def to_npz(state: Mapping[str, np.ndarray], config: ViTConfig, flavour: str = "vit") -> dict[str, np.ndarray]:
    """flavour 'vit': the original ViT layout (the class token has its position entry);
    'big_vision': no position entry for the class token, so pos_embed[:, 0] must be zero
    (or the config has no_embed_class); SigLIP's MAP head as ``MAPHead_0``."""
    _check_npz_pooling(config, flavour)
    n = _npz_names(config, flavour)
    p, D, H, hd = n["prefix"], config.embed_dim, config.num_heads, config.head_dim
    pos = state["pos_embed"]
    if flavour == "big_vision" and config.class_token and not config.no_embed_class:
        if np.any(pos[:, 0]):
            raise WeightError(
                "big_vision gives the class token no position embedding, but pos_embed[:, 0] is not "
                "zero: write the original ViT layout ('vit') instead"
            )
        pos = pos[:, 1:]
    out = {
        f"{p}embedding/kernel": state["patch_embed.proj.weight"].transpose(2, 3, 1, 0),  # OIHW -> HWIO
        f"{p}embedding/bias": state["patch_embed.proj.bias"],
        f"{p}{n['pos']}": pos,
    }
    if config.pos_embed_grid_size is not None:  # NaFlex: a Dense over (h w c) patches, a (n, n, D) table
        out[f"{p}embedding/kernel"] = out[f"{p}embedding/kernel"].reshape(-1, D)
        out[f"{p}{n['pos']}"] = pos.reshape(*config.pos_grid, D)
    if config.class_token:
        out[f"{p}cls"] = state["cls_token"]
    for i in range(config.depth):
        b, e = f"blocks.{i}.", f"{p}Transformer/encoderblock_{i}/"
        m = f"{e}{n['mha']}/"
        out[f"{e}LayerNorm_0/scale"], out[f"{e}LayerNorm_0/bias"] = state[b + "norm1.weight"], state[b + "norm1.bias"]
        qkv = state[b + "attn.qkv.weight"].reshape(3, H, hd, D)
        for j, name in enumerate(("query", "key", "value")):
            out[f"{m}{name}/kernel"] = qkv[j].transpose(2, 0, 1)  # (H, hd, D) -> (D, H, hd)
            out[f"{m}{name}/bias"] = (
                state[b + "attn.qkv.bias"].reshape(3, H, hd)[j] if config.qkv_bias else np.zeros((H, hd), np.float32)
            )
        out[f"{m}out/kernel"] = state[b + "attn.proj.weight"].reshape(D, H, hd).transpose(1, 2, 0)  # (H, hd, D)
        out[f"{m}out/bias"] = state[b + "attn.proj.bias"]
        out[f"{e}{n['ln2']}/scale"], out[f"{e}{n['ln2']}/bias"] = state[b + "norm2.weight"], state[b + "norm2.bias"]
        for j, fc in enumerate(("fc1", "fc2")):
            out[f"{e}{n['mlp']}/Dense_{j}/kernel"] = state[f"{b}mlp.{fc}.weight"].T
            out[f"{e}{n['mlp']}/Dense_{j}/bias"] = state[f"{b}mlp.{fc}.bias"]
    out[f"{p}Transformer/encoder_norm/scale"], out[f"{p}Transformer/encoder_norm/bias"] = (
        state["norm.weight"],
        state["norm.bias"],
    )
    if config.global_pool == "map":
        h, m = f"{p}MAPHead_0/", f"{p}MAPHead_0/MultiHeadDotProductAttention_0/"
        out[h + "probe"] = state["attn_pool.latent"]
        kv = state["attn_pool.kv.weight"].reshape(2, D, D)
        kv_bias = state["attn_pool.kv.bias"].reshape(2, H, hd)
        for name, w, bias in (
            ("query", state["attn_pool.q.weight"], state["attn_pool.q.bias"].reshape(H, hd)),
            ("key", kv[0], kv_bias[0]),
            ("value", kv[1], kv_bias[1]),
        ):
            out[f"{m}{name}/kernel"], out[f"{m}{name}/bias"] = _split_heads_kernel(w, H, hd, D), bias
        out[f"{m}out/kernel"] = state["attn_pool.proj.weight"].reshape(D, H, hd).transpose(1, 2, 0)
        out[f"{m}out/bias"] = state["attn_pool.proj.bias"]
        out[h + "LayerNorm_0/scale"], out[h + "LayerNorm_0/bias"] = (
            state["attn_pool.norm.weight"],
            state["attn_pool.norm.bias"],
        )
        for j, fc in enumerate(("fc1", "fc2")):
            out[f"{h}MlpBlock_0/Dense_{j}/kernel"] = state[f"attn_pool.mlp.{fc}.weight"].T
            out[f"{h}MlpBlock_0/Dense_{j}/bias"] = state[f"attn_pool.mlp.{fc}.bias"]
    if config.num_classes:
        out[f"{p}head/kernel"], out[f"{p}head/bias"] = state["head.weight"].T, state["head.bias"]
    return {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in out.items()}


def detect_npz_flavour(w: Mapping) -> tuple[str, str]:
    """(flavour, key prefix) of a ViT .npz."""
    for prefix in ("params/", "params/img/"):
        if f"{prefix}embedding/kernel" in w:
            return "big_vision", prefix
    if "embedding/kernel" in w:
        return "vit", ""
    raise WeightError(
        "an .npz with neither 'embedding/kernel' (original ViT) nor 'params/embedding/kernel' / "
        "'params/img/embedding/kernel' (big_vision, SigLIP): not a ViT checkpoint layout this "
        "project knows"
    )


class _Blocks:
    """A block's tensors, from encoderblock_{i}/ or from big_vision's scanned encoderblock/ (a
    leading depth axis, as timm's _load_weights reads it)."""

    def __init__(self, w: Mapping, p: str):
        self.w, self.p = w, p
        self.scanned = f"{p}Transformer/encoderblock/LayerNorm_0/scale" in w

    def __call__(self, i: int, name: str):
        if self.scanned:
            return self.w[f"{self.p}Transformer/encoderblock/{name}"][i]
        return self.w[f"{self.p}Transformer/encoderblock_{i}/{name}"]

    def depth(self) -> int:
        if self.scanned:
            return int(self.w[f"{self.p}Transformer/encoderblock/LayerNorm_0/scale"].shape[0])
        return 1 + max(int(m.group(1)) for k in self.w if (m := re.search(r"encoderblock_(\d+)/", k)))


def infer_npz_config(w: Mapping, norm_eps: float = 1e-6, img_size=None, act_layer: str = "gelu") -> ViTConfig:
    """The config of an .npz from its shapes; the activation and eps are not stored (defaults:
    timm's exact GELU and 1e-6, as timm reads these checkpoints)."""
    flavour, p = detect_npz_flavour(w)
    n = _npz_names(None, flavour, p)
    blocks = _Blocks(w, p)
    if w[f"{p}embedding/kernel"].ndim == 2:  # big_vision's NaFlex ViT (SigLIP 2)
        return _infer_naflex_config(w, p, blocks, norm_eps, img_size, act_layer)
    ph, pw, C, _ = w[f"{p}embedding/kernel"].shape
    class_token = f"{p}cls" in w
    pool = "map" if f"{p}MAPHead_0/probe" in w else ("token" if class_token else "avg")
    n_pos = w[f"{p}{n['pos']}"].shape[1] - (1 if flavour == "vit" else 0)
    if img_size is None:
        side = int(round(n_pos**0.5))
        if side * side != n_pos:
            raise WeightError(f"position embedding has {n_pos} patch positions, not a square grid: pass img_size")
        img_size = (side * ph, side * pw)
    return ViTConfig(
        img_size=img_size,
        patch_size=(ph, pw),
        in_chans=C,
        class_token=class_token,
        qkv_bias=any(np.any(w[k]) for k in w if re.search(r"encoderblock.*/(query|key|value)/bias$", k)),
        **_encoder(w, p, blocks, (n["mha"], n["mlp"]), pool, norm_eps=norm_eps, act_layer=act_layer),
    )


def _encoder(w: Mapping, p: str, blocks, names: tuple[str, str], pool: str, **defaults) -> dict:
    """What both flavours read alike: the head, the pooling's norm, the blocks' sizes (``names``:
    the attention's and the MLP's modules), and ``defaults``, what is not stored."""
    mha, mlp = names
    D, H, _ = blocks(0, f"{mha}/query/kernel").shape
    return dict(
        num_classes=w[f"{p}head/bias"].shape[0] if f"{p}head/bias" in w else 0,
        global_pool=pool,
        fc_norm=False if pool == "avg" else None,
        embed_dim=D,
        depth=blocks.depth(),
        num_heads=H,
        mlp_ratio=blocks(0, f"{mlp}/Dense_0/kernel").shape[1] / D,
        **defaults,
    )


def _infer_naflex_config(w: Mapping, p: str, blocks, norm_eps: float, img_size, act_layer: str) -> ViTConfig:
    """big_vision's NaFlex ViT (models/proj/image_text/naflex_vit.py): a Dense over each patch
    flattened (h w c), read as 3 channels of a square patch; a square (n, n, D) table resized
    bilinearly with antialias (jax.image.scale_and_translate: torch's bilinear antialiased
    resampling, aa_matrix)."""
    k, _ = w[f"{p}embedding/kernel"].shape
    side = int(round((k / 3) ** 0.5))
    if 3 * side * side != k:
        raise WeightError(f"embedding/kernel reads {k} values a patch, not 3 channels of a square patch: pass a config")
    n = w[f"{p}pos_embedding"].shape[0]
    pool = "map" if f"{p}MAPHead_0/probe" in w else "avg"
    return ViTConfig(
        img_size=img_size or n * side,
        patch_size=side,
        class_token=False,
        **_encoder(
            w, p, blocks, ("MultiHeadDotProductAttention_0", "MlpBlock_0"), pool, norm_eps=norm_eps, act_layer=act_layer
        ),
        no_embed_class=True,
        dynamic_img_size=True,
        pos_embed_grid_size=n,
        pos_embed_interp_mode="bilinear",
    )


def from_npz(w: Mapping[str, np.ndarray], config: ViTConfig) -> dict[str, np.ndarray]:
    flavour, p = detect_npz_flavour(w)
    _check_npz_pooling(config, flavour)
    n = _npz_names(config, flavour, p)
    D = config.embed_dim
    blk = _Blocks(w, p)
    out = {}
    try:
        kernel, pos = w[f"{p}embedding/kernel"], w[f"{p}{n['pos']}"]
        if config.pos_embed_grid_size is not None:  # NaFlex: (h w c, D) and (n, n, D)
            kernel, pos = kernel.reshape(*config.patch_size, config.in_chans, D), pos.reshape(1, -1, D)
        out["patch_embed.proj.weight"] = kernel.transpose(3, 2, 0, 1)  # HWIO -> OIHW
        out["patch_embed.proj.bias"] = w[f"{p}embedding/bias"]
        if config.class_token:
            out["cls_token"] = w[f"{p}cls"]
            if flavour == "big_vision" and not config.no_embed_class:  # no position for the class token: a zero
                pos = np.concatenate([np.zeros_like(pos[:, :1]), pos], axis=1)  # entry is the same function
        out["pos_embed"] = pos
        for i in range(config.depth):
            b, m = f"blocks.{i}.", f"{n['mha']}/"
            out[b + "norm1.weight"], out[b + "norm1.bias"] = blk(i, "LayerNorm_0/scale"), blk(i, "LayerNorm_0/bias")
            out[b + "attn.qkv.weight"] = np.concatenate(
                [blk(i, f"{m}{x}/kernel").reshape(D, -1).T for x in ("query", "key", "value")]
            )
            bias = np.concatenate([blk(i, f"{m}{x}/bias").reshape(-1) for x in ("query", "key", "value")])
            if config.qkv_bias:
                out[b + "attn.qkv.bias"] = bias
            elif np.any(bias):
                raise WeightError(f"block {i} {m}: non-zero q/k/v biases, but the config has qkv_bias=False")
            out[b + "attn.proj.weight"] = blk(i, f"{m}out/kernel").reshape(-1, D).T  # (H, hd, D) -> (D, H*hd)
            out[b + "attn.proj.bias"] = blk(i, f"{m}out/bias")
            out[b + "norm2.weight"], out[b + "norm2.bias"] = blk(i, f"{n['ln2']}/scale"), blk(i, f"{n['ln2']}/bias")
            for j, fc in enumerate(("fc1", "fc2")):
                out[f"{b}mlp.{fc}.weight"] = blk(i, f"{n['mlp']}/Dense_{j}/kernel").T
                out[f"{b}mlp.{fc}.bias"] = blk(i, f"{n['mlp']}/Dense_{j}/bias")
        out["norm.weight"], out["norm.bias"] = (
            w[f"{p}Transformer/encoder_norm/scale"],
            w[f"{p}Transformer/encoder_norm/bias"],
        )
        if config.global_pool == "map":
            h, m = f"{p}MAPHead_0/", f"{p}MAPHead_0/MultiHeadDotProductAttention_0/"
            out["attn_pool.latent"] = w[h + "probe"]
            out["attn_pool.q.weight"] = w[m + "query/kernel"].reshape(D, -1).T
            out["attn_pool.q.bias"] = w[m + "query/bias"].reshape(-1)
            out["attn_pool.kv.weight"] = np.concatenate(
                [w[f"{m}{x}/kernel"].reshape(D, -1).T for x in ("key", "value")]
            )
            out["attn_pool.kv.bias"] = np.concatenate([w[f"{m}{x}/bias"].reshape(-1) for x in ("key", "value")])
            out["attn_pool.proj.weight"] = w[m + "out/kernel"].reshape(-1, D).T
            out["attn_pool.proj.bias"] = w[m + "out/bias"]
            out["attn_pool.norm.weight"], out["attn_pool.norm.bias"] = (
                w[h + "LayerNorm_0/scale"],
                w[h + "LayerNorm_0/bias"],
            )
            for j, fc in enumerate(("fc1", "fc2")):
                out[f"attn_pool.mlp.{fc}.weight"] = w[f"{h}MlpBlock_0/Dense_{j}/kernel"].T
                out[f"attn_pool.mlp.{fc}.bias"] = w[f"{h}MlpBlock_0/Dense_{j}/bias"]
        if config.num_classes:
            out["head.weight"], out["head.bias"] = w[f"{p}head/kernel"].T, w[f"{p}head/bias"]
    except KeyError as e:
        raise WeightError(f"{flavour} .npz is missing key {e.args[0]!r} for {config}") from None
    return {k: np.ascontiguousarray(out[k], dtype=np.float32) for k in expected_shapes(config)}


# ----------------------------------------------------------------------------- open_clip

# a member that inflates more than this many times its stored bytes (and past 1 MiB) is refused
# before it is inflated: weights compress by a few times at most, a zip bomb by thousands
MAX_INFLATION = 100


def read_npz(path) -> dict[str, np.ndarray]:
    """An .npz's arrays (never unpickled), each in its stored dtype."""
    path = str(path)
    if not os.path.isfile(path):
        raise WeightError(f"weight file {path!r} does not exist")
    _check_inflation(path)
    try:
        with np.load(path, allow_pickle=False) as f:  # never unpickle
            return {k: f[k] for k in f.files}
    except ValueError as e:
        if "pickle" in str(e):
            raise WeightError(f"{path!r} holds pickled objects; refusing to load them ({e})") from None
        raise WeightError(f"{path!r} has a truncated or malformed member: {e}") from None
    except Exception as e:  # noqa: BLE001
        raise WeightError(f"{path!r} is not a readable .npz file: {e}") from None


def _check_inflation(path: str) -> None:
    """Each member's declared inflated size against what it stores (the zip's directory, read
    before anything is inflated)."""
    try:
        with zipfile.ZipFile(path) as z:
            members = z.infolist()
    except (zipfile.BadZipFile, OSError) as e:
        raise WeightError(f"{path!r} is not a readable .npz file: {e}") from None
    for m in members:
        if m.file_size > 1 << 20 and m.file_size > MAX_INFLATION * max(m.compress_size, 1):
            raise WeightError(
                f"{path!r}: member {m.filename!r} declares {m.file_size} bytes inflated from {m.compress_size} "
                f"(over {MAX_INFLATION} times): refused before inflating it (weights compress by a few times at most)"
            )


def write_npz(state, config: ViTConfig, path, flavour: str = "vit") -> None:
    with open(path, "wb") as f:  # a file object: NumPy appends no ".npz" to a name without it
        np.savez(f, **to_npz(state, config, flavour))


def detect(path, header) -> bool:
    return header is None and str(path).endswith(".npz")


def read(path, config=None, img_size=None, cast=False, **options):
    w = read_npz(path)
    config = config or infer_npz_config(w, img_size=img_size)
    state = from_npz(stored_float32(w, cast, path), config)
    return config, check(state, config, what=str(path))


def write(state, config, path, npz_flavour="vit", **options) -> None:
    write_npz(state, config, path, npz_flavour)
