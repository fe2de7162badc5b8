"""Ports a user might write, outside the project: a small correct ViT in plain NumPy float32 (its
own code, not the oracle's) and broken variants of it, including ports that tamper with what
they are handed. The tests copy this file to a temporary
directory and point `verify` and `pytest --port` at it."""

import numpy as np
from scipy.special import erf

from impls import get_config


def _ln(x, w, b, eps):
    mu = x.mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + eps) * w + b


def _vit(
    config,
    s,
    images,
    shared_norm=False,
    softmax_axis=-1,
    emit_taps=True,
    dtype=np.float32,
    eps=None,
    attn_residual=True,
    mlp_taps=False,
):
    p = {k: v.astype(dtype) for k, v in s.items()}
    config = config if eps is None else config.replace(norm_eps=eps)
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
        a = q @ k.transpose(0, 1, 3, 2) * dtype(hd**-0.5)
        a = np.exp(a - a.max(softmax_axis, keepdims=True))
        a = a / a.sum(softmax_axis, keepdims=True)
        taps[b + "attn.weights"] = a
        h = (a @ v).transpose(0, 2, 1, 3).reshape(B, N, D) @ p[b + "attn.proj.weight"].T + p[b + "attn.proj.bias"]
        taps[b + "attn"] = h
        x = x + h if attn_residual else h
        norm = "norm1" if shared_norm else "norm2"
        h = _ln(x, p[b + norm + ".weight"], p[b + norm + ".bias"], config.norm_eps)
        taps[b + "norm2"] = h
        h = h @ p[b + "mlp.fc1.weight"].T + p[b + "mlp.fc1.bias"]
        h = 0.5 * h * (1 + erf(h / dtype(np.sqrt(2))))
        h = h @ p[b + "mlp.fc2.weight"].T + p[b + "mlp.fc2.bias"]
        if mlp_taps:  # then the block's output is judged locally, from the taps it sums
            taps[b + "mlp"] = h
        x = x + h
        taps[f"blocks.{i}"] = x
    if config.global_pool == "avg":
        x = _ln(x[:, config.num_prefix_tokens :].mean(1), p["fc_norm.weight"], p["fc_norm.bias"], config.norm_eps)
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


def _emitted_in_float32(**options):
    """A port computing in float64 and emitting float32 taps (more precise than it emits)."""

    def make(config, state):
        def forward(images):
            taps = _vit(config, state, images, dtype=np.float64, mlp_taps=True, **options)
            return {k: v.astype(np.float32) for k, v in taps.items()}

        return forward

    return make


precise = _emitted_in_float32()
precise_shared_norm = _emitted_in_float32(shared_norm=True)
precise_softmax_wrong_axis = _emitted_in_float32(softmax_axis=-2)
precise_eps_1e5 = _emitted_in_float32(eps=1e-5)
precise_no_attn_residual = _emitted_in_float32(attn_residual=False)


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


def _written_for_one_checkpoint(config, shared_norm=False):
    """A port hard-wired to one checkpoint's config (as most are): it refuses any other."""

    expected = get_config("vit_test_token")
    if config != expected:
        raise ValueError(f"this port is written for vit_test_token, got {config}")
    return shared_norm


def single_config(config, state):
    _written_for_one_checkpoint(config)
    return lambda images: _vit(config, state, images)


def single_config_shared_norm(config, state):
    _written_for_one_checkpoint(config)
    return lambda images: _vit(config, state, images, shared_norm=True)


# What they support: the one config (a preset name, a ViTConfig, or constraints; see conformance.support).
single_config.supports = single_config_shared_norm.supports = "vit_test_token"


def _attention(state, num_heads, head_dim, dead_rows):
    p = {k: np.asarray(v, np.float64) for k, v in state.items()}

    def forward(x, context=None, mask=None):
        context = x if context is None else context
        B, Nq, _ = x.shape
        Nk = context.shape[1]
        q = (x @ p["q.weight"].T + p.get("q.bias", 0.0)).reshape(B, Nq, num_heads, head_dim).transpose(0, 2, 1, 3)
        kv = (context @ p["kv.weight"].T + p.get("kv.bias", 0.0)).reshape(B, Nk, 2, num_heads, head_dim)
        k, v = kv.transpose(2, 0, 3, 1, 4)
        logits = q @ k.transpose(0, 1, 3, 2) * head_dim**-0.5
        if mask is not None:
            m = np.asarray(mask)
            logits = np.where(m, logits, -np.inf) if m.dtype == bool else logits + m
        dead = np.isneginf(logits).all(-1, keepdims=True)
        w = np.exp(np.where(dead, 0.0, logits - np.where(dead, 0.0, logits.max(-1, keepdims=True))))
        w = w / w.sum(-1, keepdims=True)
        if dead_rows == "zero":
            w = np.where(dead, 0.0, w)  # the documented behaviour: no key, zero weights, zero output
        out = (w @ v).transpose(0, 2, 1, 3).reshape(B, Nq, num_heads * head_dim)
        return (out @ p["proj.weight"].T + p["proj.bias"]).astype(np.float32), w.astype(np.float32)

    return forward


def correct_attention(state, dim, context_dim, num_heads, head_dim, qkv_bias):
    return _attention(state, num_heads, head_dim, "zero")


def mean_of_values_attention(state, dim, context_dim, num_heads, head_dim, qkv_bias):
    """Leaves a fully masked query row to the kernel's own behaviour: MLX's fused kernel gives it
    uniform weights, the mean of the values."""
    return _attention(state, num_heads, head_dim, "mean")


def strict_load_fails(config, state):
    """A strict load that fails: torch's message names the missing key on its second line."""
    import torch

    torch.nn.Linear(2, 2).load_state_dict({"weight": torch.zeros(2, 2)}, strict=True)


# --- gradient factories (verify --grad, --grad-port): the torch port's, as a user's code wraps it


def _torch_grad(config, state):
    from impls.torch_vit import make_grad

    return make_grad(config, state)


def grad_params_only(config, state):
    """Returns no tap cotangents: judged on its parameters' and the images' gradients."""
    grad = _torch_grad(config, state)
    return lambda images, loss: {k: v for k, v in grad(images, loss).items() if k != "taps"}


def grad_nan(config, state):
    grad = _torch_grad(config, state)

    def run(images, loss):
        out = grad(images, loss)
        out["params"]["head.bias"] = np.full_like(out["params"]["head.bias"], np.nan)
        return out

    return run


def grad_no_images(config, state):
    grad = _torch_grad(config, state)
    return lambda images, loss: {k: v for k, v in grad(images, loss).items() if k != "images"}


def grad_shared_norm_mapping(config, state):
    """The shared-norm bug written as a mapping mistake: it edits the state it is handed."""
    for i in range(config.depth):
        state[f"blocks.{i}.norm2.weight"] = state[f"blocks.{i}.norm1.weight"]
    return _torch_grad(config, state)
