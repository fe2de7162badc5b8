"""The built-in ports as frameworks: each one's module with arrays in and out, its fused attention
kernel called from given q, k, v, and q, k, v drawn for an attention shape (shared by the
calibration and the attention tests)."""

from __future__ import annotations

import numpy as np

from conformance import generators as S
import importlib


def framework(port: str):
    """(module, to_framework, to_numpy) for a built-in port."""

    module = importlib.import_module(f"impls.{port}_vit")
    if port == "torch":
        import torch

        return module, torch.as_tensor, lambda t: t.numpy()
    if port == "mlx":
        import mlx.core as mx

        return module, mx.array, np.array
    if port == "jax":
        import jax

        return module, jax.device_put, np.asarray  # (jnp.asarray compiles a program per shape)
    return module, np.asarray, np.asarray


# Each framework's fused scaled-dot-product attention, from (B, H, N, hd) q, k, v.
FUSED = {
    "torch": lambda m, q, k, v, mask, scale: m.F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale),
    "mlx": lambda m, q, k, v, mask, scale: m.mx.fast.scaled_dot_product_attention(q, k, v, scale=scale, mask=mask),
    "jax": lambda m, q, k, v, mask, scale: m.jax.nn.dot_product_attention(
        q.swapaxes(1, 2),
        k.swapaxes(1, 2),
        v.swapaxes(1, 2),
        scale=scale,
        mask=mask if mask is not None and mask.dtype == m.jnp.bool_ else None,
        bias=mask if mask is not None and mask.dtype != m.jnp.bool_ else None,
    ).swapaxes(1, 2),
}


def qkv_arrays(case: S.AttentionShape, scale: float):
    rng = np.random.default_rng(case.seed)
    shape_q = (case.batch, case.num_heads, case.q_len, case.head_dim)
    shape_kv = (case.batch, case.num_heads, case.kv_len, case.head_dim)
    return [rng.normal(0, scale, s).astype(np.float32) for s in (shape_q, shape_kv, shape_kv)]
