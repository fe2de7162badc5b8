"""Ports a user might write, outside the project: a small correct ViT in plain NumPy float32 (its
own code, not the oracle's) and broken variants of it, including ports that tamper with what
they are handed. The tests copy this file to a temporary
directory and point `verify` and `pytest --port` at it."""

import numpy as np
from scipy.special import erf


def _ln(x, w, b, eps):
    mu = x.mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + eps) * w + b


def _vit(config, s, images, shared_norm=False, softmax_axis=-1, emit_taps=True, dtype=np.float32):
    p = {k: v.astype(dtype) for k, v in s.items()}
    B, C, H, W = images.shape
    (ph, pw), D, nh = config.patch_size, config.embed_dim, config.num_heads
    x = images.astype(dtype).reshape(B, C, H // ph, ph, W // pw, pw).transpose(0, 2, 4, 1, 3, 5)
    x = x.reshape(B, -1, C * ph * pw) @ p["patch_embed.proj.weight"].reshape(D, -1).T + p["patch_embed.proj.bias"]
    taps = {"patch_embed": x}
    if config.class_token:
        x = np.concatenate([np.broadcast_to(p["cls_token"], (B, 1, D)), x], axis=1)
    x = x + p["pos_embed"]
    taps["embed"] = x
    N, hd = x.shape[1], D // nh
    for i in range(config.depth):
        b = f"blocks.{i}."
        h = _ln(x, p[b + "norm1.weight"], p[b + "norm1.bias"], config.norm_eps)
        taps[b + "norm1"] = h
        qkv = h @ p[b + "attn.qkv.weight"].T + p.get(b + "attn.qkv.bias", 0.0)
        q, k, v = qkv.reshape(B, N, 3, nh, hd).transpose(2, 0, 3, 1, 4)
        a = q @ k.transpose(0, 1, 3, 2) * dtype(hd ** -0.5)
        a = np.exp(a - a.max(softmax_axis, keepdims=True))
        a = a / a.sum(softmax_axis, keepdims=True)
        taps[b + "attn.weights"] = a
        h = (a @ v).transpose(0, 2, 1, 3).reshape(B, N, D) @ p[b + "attn.proj.weight"].T + p[b + "attn.proj.bias"]
        taps[b + "attn"] = h
        x = x + h
        norm = "norm1" if shared_norm else "norm2"
        h = _ln(x, p[b + norm + ".weight"], p[b + norm + ".bias"], config.norm_eps)
        taps[b + "norm2"] = h
        h = h @ p[b + "mlp.fc1.weight"].T + p[b + "mlp.fc1.bias"]
        h = 0.5 * h * (1 + erf(h / dtype(np.sqrt(2))))
        x = x + h @ p[b + "mlp.fc2.weight"].T + p[b + "mlp.fc2.bias"]
        taps[f"blocks.{i}"] = x
    if config.global_pool == "avg":
        x = _ln(x[:, config.num_prefix_tokens:].mean(1), p["fc_norm.weight"], p["fc_norm.bias"], config.norm_eps)
    else:
        x = _ln(x, p["norm.weight"], p["norm.bias"], config.norm_eps)[:, 0]
    taps["logits"] = x @ p["head.weight"].T + p["head.bias"]
    return taps if emit_taps else taps["logits"]


def correct(config, state):
    return lambda images: _vit(config, state, images)


def logits_only(config, state):
    return lambda images: _vit(config, state, images, emit_taps=False)


def shared_norm(config, state):
    return lambda images: _vit(config, state, images, shared_norm=True)


def softmax_wrong_axis(config, state):
    return lambda images: _vit(config, state, images, softmax_axis=-2)


def crashing(config, state):
    def forward(images):
        raise RuntimeError("boom")
    return forward


def nan_logits(config, state):
    def forward(images):
        out = _vit(config, state, images)
        out["logits"] = np.full_like(out["logits"], np.nan)
        return out
    return forward


def misshaped_tap(config, state):
    def forward(images):
        out = _vit(config, state, images)
        out["blocks.0.attn.weights"] = out["blocks.0.attn.weights"].swapaxes(1, 2)
        return out
    return forward


def no_logits(config, state):
    def forward(images):
        out = _vit(config, state, images)
        del out["logits"]
        return out
    return forward


def float64(config, state):
    """Computes in float64 where float32 was asked for: more precise, and not what runs."""
    return lambda images: _vit(config, state, images, dtype=np.float64)


def squeezes(config, state):
    """`.squeeze()` on the logits: right for a batch of 2, wrong for a batch of 1."""
    return lambda images: _vit(config, state, images, emit_taps=False).squeeze()


def edits_state(config, state):
    """The shared-norm bug written as a mapping mistake: the state dict it is handed, edited."""
    state["blocks.0.norm2.weight"] = state["blocks.0.norm1.weight"]
    state["blocks.0.norm2.bias"] = state["blocks.0.norm1.bias"]
    return lambda images: _vit(config, state, images)


def pops_key(config, state):
    head_bias = state.pop("head.bias")
    return lambda images: _vit(config, dict(state, **{"head.bias": head_bias}), images)


def clips_images(config, state):
    def forward(images):
        np.clip(images, -1.0, 1.0, out=images)  # in place: normalising the caller's array
        return _vit(config, state, images)
    return forward
