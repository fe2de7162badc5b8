"""The whole model's bug classes, each as the oracle computes it from a stage's inputs
(``CLASSES``), with the operands and variants they are built from."""

from __future__ import annotations


from collections.abc import Callable

import numpy as np

from conformance.numerics.error_model import evaluate, softmax_weights
from conformance.numerics.evaluate import on_grid
from impls import numpy_vit as O
from impls.protocol import ViTConfig
from impls.stages import BY_KIND, stage_inputs, stage_kind
from impls.windows import window_mask
from weights.canonical import qkv_parts
from conformance.diagnosis.bugclass import BugClass, QUIET
from conformance.diagnosis.position_classes import POSITION_CLASSES, TABLE_CLASSES
from conformance.diagnosis.tower_classes import TOWER_CLASSES

# ----------------------------------------------------------------------------- operands


def _block(name: str) -> tuple[str, str]:
    """'blocks.3.attn.q' -> ('blocks.3', 'attn.q')."""
    _, i, *rest = name.split(".", 2)
    return f"blocks.{i}", rest[0] if rest else ""


_NORMS = {  # a LayerNorm stage kind -> the weights' prefix in its scope
    "norm1": "{b}.norm1",
    "norm2": "{b}.norm2",
    "attn.q_norm": "{b}.attn.q_norm",
    "attn.k_norm": "{b}.attn.k_norm",
    "norm": "norm",
    "norm_pre": "norm_pre",
    "attn_pool.norm": "attn_pool.norm",
    "patch_embed.norm": "patch_embed.norm",
}
NORM_KINDS = tuple(_NORMS)


def norm_operands(name: str, t, config: ViTConfig, grid=None):
    """A LayerNorm stage's input and its weights' prefix (``grid``: the images' patch grid, where
    a windowed block's attention comes back to it; the config's own by default)."""
    kind = stage_kind(name)
    inputs = on_grid(name, [t[k] for k in stage_inputs(name, config)], config, grid or config.grid_size)
    x = inputs[0] + inputs[1] if kind == "norm2" else inputs[0]
    b = _block(name)[0] if name.startswith("blocks.") else ""
    return x, _NORMS[kind].format(b=b)


def layer_norm_as(x, w, b, eps, *, unbiased=False, eps_outside=False, stats_dtype=None):
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):  # a class may overflow: its NaN is its match
        if stats_dtype is not None:  # E[x^2] - E[x]^2 in a lower dtype, as the port rounds it
            xs = x.astype(stats_dtype)
            mu = xs.mean(-1, keepdims=True, dtype=stats_dtype)
            var = np.maximum((xs * xs).mean(-1, keepdims=True, dtype=stats_dtype) - mu * mu, 0).astype(np.float64)
            mu = mu.astype(np.float64)
        else:
            mu = x.mean(-1, keepdims=True)
            var = ((x - mu) ** 2).mean(-1, keepdims=True)
        if unbiased:
            var = var * x.shape[-1] / max(x.shape[-1] - 1, 1)
        sigma = np.sqrt(var) + eps if eps_outside else np.sqrt(var + eps)
        return (x - mu) / sigma * w + b


def _norm_variant(**how):
    def stage(name, t, images, s, config):
        if stage_kind(name) not in _NORMS:
            return None
        x, prefix = norm_operands(name, t, config, config.grid_at(images.shape[2:]))
        return layer_norm_as(x, s[f"{prefix}.weight"], s.get(f"{prefix}.bias", 0.0), config.norm_eps, **how)

    return stage


def _no_affine(name, t, images, s, config):
    if stage_kind(name) not in _NORMS:
        return None
    x, _ = norm_operands(name, t, config, config.grid_at(images.shape[2:]))
    return layer_norm_as(x, 1.0, 0.0, config.norm_eps)


def _norm2_with_norm1(s, config):
    pairs = (
        (f"blocks.{i}.norm2.{p}", f"blocks.{i}.norm1.{p}") for i in range(config.depth) for p in ("weight", "bias")
    )
    return {two: s[one] for two, one in pairs if one in s}  # a bias-free norm (RMSNorm, norm_bias=False) has none


def _attention_operands(name: str, t, config: ViTConfig, images):
    """An attention-weights stage's q and k, its head_dim, and what its logits add: BEiT's bias, and
    -inf outside each query's own window where the block attends in windows (Qwen2.5-VL's, as the
    oracle masks them: a class of how the softmax is computed keeps the windows), else 0."""
    q, k, *bias = (t[n] for n in stage_inputs(name, config))
    bias = bias[0] if bias else 0.0
    cut = config.block_window_cut(int(name.split(".")[1])) if name.startswith("blocks.") else 0
    if cut:
        bias = np.where(window_mask(config.grid_at(images.shape[2:]), cut), bias, -np.inf)
    return q, k, config.head_dim, bias


_WEIGHTS = ("attn.weights", "attn_pool.weights")


def _weights_variant(scale: Callable, swap: bool = False, axis: int = -1, causal: bool = False, after=None):
    """softmax(scale(config) q kᵀ) over ``axis`` (-1 keys, -2 queries, 0 the batch), of k qᵀ where
    ``swap``, causally masked where ``causal``, then times ``after(config)``; with the error
    model's softmax bound (``softmax_weights``) where there is one."""

    def stage(name, t, images, s, config, precision=QUIET):
        if stage_kind(name) not in _WEIGHTS:
            return None
        q, k, hd, bias = _attention_operands(name, t, config, images)
        a, b = (k, q) if swap != (axis == -2) else (q, k)  # over queries: (softmax over keys of k qᵀ)ᵀ
        bias = np.swapaxes(bias, -1, -2) if axis == -2 and np.ndim(bias) else bias  # (transposed back below)
        if axis == 0:
            P, bound = O.softmax(scale(config) * qk_logits(a, b) + bias, axis=0), None
        else:
            n, m = a.shape[-2], b.shape[-2]
            mask = np.tril(np.ones((n, m), bool)) if causal else None
            if np.ndim(bias):  # an added bias: the mask as its -inf where causal
                mask = bias if mask is None else np.where(mask, bias, -np.inf)
            P, bound = softmax_weights(a, b, scale(config), precision, mask)
            if not precision.bounds:
                bound = None
            if axis == -2:
                P, bound = np.swapaxes(P, -1, -2), None if bound is None else np.swapaxes(bound, -1, -2)
        if after is not None:
            P, bound = P * after(config), None if bound is None else bound * after(config)
        return P, bound

    stage.bounded = True
    return stage


def qk_logits(q, k):
    return q @ np.swapaxes(k, -2, -1)


def _inverse_sqrt_head_dim(config):
    return config.head_dim**-0.5


def _softmax_naive(dtype):
    """exp(l) / Σ exp(l) in the port's dtype, no maximum subtracted: inf / inf once a logit passes
    the dtype's exp range (88.7 in float32, 11.1 in float16)."""

    def stage(name, t, images, s, config):
        if stage_kind(name) not in _WEIGHTS:
            return None
        q, k, hd, bias = _attention_operands(name, t, config, images)
        logits = (hd**-0.5 * qk_logits(q, k) + bias).astype(dtype)
        with np.errstate(over="ignore", invalid="ignore"):
            e = np.exp(logits)
            total = e.sum(-1, keepdims=True, dtype=np.float32).astype(dtype)  # a float32 accumulator, stored
            return (e / total).astype(dtype).astype(np.float64)

    return stage


def _softmax_in(dtype: str):
    """The softmax with its maximum subtracted, its exponentials and their sum stored in the port's
    low-precision dtype (MLX's mx.softmax without precise=True, a half softmax without an upcast):
    the sum, rounded at each addition, runs low, and every weight high."""

    def stage(name, t, images, s, config):
        if stage_kind(name) not in _WEIGHTS:
            return None
        import ml_dtypes

        low = ml_dtypes.bfloat16 if dtype == "bfloat16" else np.float16
        q, k, hd, bias = _attention_operands(name, t, config, images)
        logits = (hd**-0.5 * qk_logits(q, k) + bias).astype(low)
        e = np.exp((logits - logits.max(-1, keepdims=True)).astype(np.float32)).astype(low)
        total = np.add.reduce(e, axis=-1, keepdims=True, dtype=low)  # an accumulator of the dtype
        return (e.astype(np.float32) / total.astype(np.float32)).astype(low).astype(np.float64)

    return stage


def _scaled_after_product(dtype):
    """(q kᵀ) · scale in the port's dtype: the unscaled product overflows first."""

    def stage(name, t, images, s, config):
        if stage_kind(name) not in _WEIGHTS:
            return None
        q, k, hd, bias = _attention_operands(name, t, config, images)
        with np.errstate(over="ignore", invalid="ignore"):
            product = qk_logits(q, k).astype(dtype)  # accumulated in float32, stored: inf past 65504
            return O.softmax((product * np.asarray(hd**-0.5, dtype)).astype(np.float64) + bias)

    return stage


def _qkv_rows(order: str):
    """The fused qkv weight's rows read as ``order`` ("h qkv d" or "h d qkv") where timm's are
    (qkv h d): the state whose timm reading gives what the port computes."""

    def state(s, config):
        H, hd = config.num_heads, config.head_dim
        out = {}
        for i in range(config.depth):
            for p in ("weight", "bias"):
                key = f"blocks.{i}.attn.qkv.{p}"
                if key not in s:
                    continue
                w = s[key]
                tail = w.shape[1:]
                shape = (H, 3, hd) if order == "h qkv d" else (H, hd, 3)
                axes = (1, 0, 2) if order == "h qkv d" else (2, 0, 1)
                out[key] = w.reshape(*shape, *tail).transpose(*axes, *range(3, 3 + len(tail))).reshape(w.shape)
        return out

    return state


def _qkv_bias_dropped(s, config):
    return {k: np.zeros_like(v) for k, v in s.items() if k.endswith("attn.qkv.bias")}


def _merged_head_dim_first(name, t, images, s, config):
    if stage_kind(name) not in ("attn", "attn_pool.proj"):
        return None
    P, v = (t[n] for n in stage_inputs(name, config))
    o = P @ v  # (B, H, N, hd)
    B, H, N, hd = o.shape
    merged = o.transpose(0, 2, 3, 1).reshape(B, N, hd * H)
    prefix = f"{_block(name)[0]}.attn.proj" if name.startswith("blocks.") else "attn_pool.proj"
    return merged @ s[f"{prefix}.weight"].T + s.get(f"{prefix}.bias", 0.0)


def _qv_biases_misplaced(name, t, images, s, config):
    """k with v's bias and v with none: q's and v's biases joined as (q, v, 0), timm's Eva's (q, 0, v)."""
    if stage_kind(name) not in ("attn.k", "attn.v"):
        return None
    b = _block(name)[0]
    j = "qkv".index(name[-1])
    w, _ = qkv_parts(s, f"{b}.attn", config.embed_dim)[j]
    x, window = t[stage_inputs(name, config)[0]], config.block_window(int(name.split(".")[1]))
    x = O.window_partition(x, config.grid_at(images.shape[2:]), window) if window else x
    y = x @ w.T + (s[f"{b}.attn.v_bias"] if j == 1 else 0.0)
    return O.split_heads(y, config.num_heads)


def _projects_input(name, t, images, s, config):
    if stage_kind(name) != "attn" or not name.startswith("blocks."):
        return None
    b = _block(name)[0]
    return t[f"{b}.norm1"] @ s[f"{b}.attn.proj.weight"].T + s.get(f"{b}.attn.proj.bias", 0.0)


def _kernel_hw_swapped(s, config):
    return {"patch_embed.proj.weight": np.swapaxes(s["patch_embed.proj.weight"], -1, -2)}


def _kernel_channels_last(s, config):
    w = s["patch_embed.proj.weight"]
    O_, C, ph, pw = w.shape
    return {"patch_embed.proj.weight": w.reshape(O_, ph, pw, C).transpose(0, 3, 1, 2)}


def _tokens_column_major(name, t, images, s, config):
    if name != "patch_embed":
        return None
    y = evaluate(name, t, images, s, config, QUIET)[0]
    B, _, D = y.shape
    gh, gw = config.grid_at(images.shape[2:])
    return y.reshape(B, gh, gw, D).transpose(0, 2, 1, 3).reshape(B, gh * gw, D)


def _pooled(select: Callable, tokens: Callable | None = None):
    """``pooled`` as ``select(features, config)``; ``tokens(features, config)``: the tokens it is
    a mean of (its bound is a mean's: u_c √N rms + u_s |mean|), else a selection's."""

    def stage(name, t, images, s, config, precision=QUIET):
        if name != "pooled":
            return None
        feats = t[stage_inputs(name, config)[0]]
        y = select(feats, config)
        if precision.bounds and tokens is not None:
            x = tokens(feats, config)
            bound = precision.compute * np.sqrt(x.shape[1]) * np.sqrt((x * x).mean(1)) + precision.output * np.abs(y)
        else:
            bound = precision.inputs * np.abs(y) if precision.bounds else None
        if config.use_fc_norm:
            y = layer_norm_as(y, s["fc_norm.weight"], s.get("fc_norm.bias", 0.0), config.norm_eps)
            bound = None  # through the norm: as the oracle's, scaled (fit)
        return y, bound

    stage.bounded = True  # returns (value, bound) in ``precision``
    return stage


def _token_sum(dtype):
    """The token mean as a running sum in the port's dtype."""

    def select(x, config):
        x = x[:, config.pool_skip :].astype(dtype)
        total = np.zeros(x[:, 0].shape, dtype)
        with np.errstate(over="ignore"):  # past 65504 the sum is inf: the class's overflow, matched by where
            for i in range(x.shape[1]):
                total = (total + x[:, i]).astype(dtype)
        return (total / np.asarray(x.shape[1], dtype)).astype(np.float64)

    return select


def _layerscale(power: float):
    def state(s, config):
        return {k: v**power for k, v in s.items() if k.endswith(("ls1.gamma", "ls2.gamma"))}

    return state


def _extra_mlp_norm(name, t, images, s, config):
    """fc2(LayerNorm(act)) with the extra norm at its default init (eps 1e-5, MLX's and torch's)."""
    if stage_kind(name) != "mlp" or not name.startswith("blocks."):
        return None
    b = _block(name)[0]
    h = layer_norm_as(t[f"{b}.mlp.act"], 1.0, 0.0, 1e-5)
    return h @ s[f"{b}.mlp.fc2.weight"].T + s.get(f"{b}.mlp.fc2.bias", 0.0)


def _summands(name, t, images, config) -> list:
    """The block's residual summands, a windowed block's attention branch back on the images' grid."""
    return on_grid(name, [t[k] for k in stage_inputs(name, config)], config, config.grid_at(images.shape[2:]))


def _residual_dropped(name, t, images, s, config):
    if stage_kind(name) != "block":
        return None
    _, a, m = _summands(name, t, images, config)
    return a + m


def _residual_from_norm(name, t, images, s, config):
    """x + attn(norm1(x)) written as norm1(x) + attn(norm1(x)): the residual taken after the norm."""
    if stage_kind(name) != "block":
        return None
    b = _block(name)[0]
    _, a, m = _summands(name, t, images, config)
    return t[f"{b}.norm1"] + a + m


def _norm_after_pooling(name, t, images, s, config):
    """The final norm applied to the pooled vector where timm norms every token, then pools."""
    if name != "pooled":
        return None
    x = t[f"blocks.{config.depth - 1}"][:, config.pool_skip :].mean(1)
    return layer_norm_as(x, s["norm.weight"], s.get("norm.bias", 0.0), config.norm_eps)


def _bias_dropped(suffix: str):
    def state(s, config):
        return {k: np.zeros_like(v) for k, v in s.items() if k.endswith(suffix)}

    return state


def _several_heads(config: ViTConfig) -> bool:
    return config.num_heads > 1


def _class_token(config: ViTConfig) -> bool:
    return config.class_token


_GELU_HINT = "nn.GELU() / nn.gelu / jax.nn.gelu(approximate=False) for 'gelu'"

# fmt: off
CLASSES: tuple[BugClass, ...] = (
    # LayerNorm
    BugClass("layernorm_eps_1e-5", NORM_KINDS, "norms with eps 1e-5 (LayerNorm's or RMSNorm's, as the config's)",
             "timm's ViTs use eps 1e-6: nn.LayerNorm(dim, eps=1e-6) (nn.LayerNorm's default is 1e-5)",
             config={"norm_eps": 1e-5}),
    BugClass("layernorm_eps_1e-6", NORM_KINDS, "norms with eps 1e-6 (LayerNorm's or RMSNorm's, as the config's)",
             "this config's eps is another: read it from the checkpoint's config", config={"norm_eps": 1e-6}),
    BugClass("layernorm_eps_1e-12", NORM_KINDS, "norms with eps 1e-12 (BERT's)",
             "Hugging Face ViT configs carry layer_norm_eps=1e-12; timm's use 1e-6", config={"norm_eps": 1e-12}),
    BugClass("layernorm_eps_fitted", NORM_KINDS, "norms with another eps",
             "read eps from the checkpoint's config (timm's ViTs: 1e-6)", family="eps"),
    BugClass("layernorm_unbiased_variance", NORM_KINDS, "LayerNorm with the unbiased (n - 1) variance",
             "LayerNorm divides by n: x.var(unbiased=False), jnp.var", stage=_norm_variant(unbiased=True)),
    BugClass("layernorm_eps_outside_root", NORM_KINDS, "LayerNorm as (x - mean) / (std + eps)",
             "eps goes inside the root: (x - mean) / sqrt(var + eps)", stage=_norm_variant(eps_outside=True)),
    BugClass("layernorm_fast_variance", NORM_KINDS, "LayerNorm statistics as E[x^2] - E[x]^2 in float32",
             "Flax: nn.LayerNorm(use_fast_variance=False); compute the variance of x - mean",
             family="token_statistics"),
    BugClass("layernorm_stats_float16", NORM_KINDS, "LayerNorm statistics as E[x^2] - E[x]^2 in float16",
             "keep LayerNorm's statistics in float32 (x.float(), upcast before the reduction)",
             stage=_norm_variant(stats_dtype=np.float16), overflow=True),
    BugClass("layernorm_without_affine", NORM_KINDS, "LayerNorm without its weight and bias",
             "load the norm's weight and bias (a non-strict load dropped them?)", stage=_no_affine),
    BugClass("norm2_with_norm1_weights", ("norm2",), "norm2 with norm1's weights (one LayerNorm reused)",
             "each block has two LayerNorms: norm1 before attention, norm2 before the MLP",
             state=_norm2_with_norm1),
    # activations
    BugClass("gelu_exact", ("mlp.act", "attn_pool.mlp.act"), "the exact (erf) GELU",
             "this config's activation is another (gelu_tanh: SigLIP; quick_gelu: OpenAI CLIP)",
             config={"act_layer": "gelu"}),
    BugClass("gelu_tanh", ("mlp.act", "attn_pool.mlp.act"), "the tanh-approximate GELU",
             "timm's vit_* use the exact GELU: " + _GELU_HINT, config={"act_layer": "gelu_tanh"}),
    BugClass("quick_gelu", ("mlp.act", "attn_pool.mlp.act"), "QuickGELU, x sigmoid(1.702 x)",
             "QuickGELU is OpenAI CLIP's only (timm's *_quickgelu names); others use GELU",
             config={"act_layer": "quick_gelu"}),
    BugClass("silu", ("mlp.act", "attn_pool.mlp.act"), "SiLU, x sigmoid(x)", "a ViT's MLP uses GELU",
             config={"act_layer": "silu"}),
    # attention weights
    BugClass("attention_scale_missing", _WEIGHTS, "softmax(q kᵀ) without the 1/sqrt(head_dim) scale",
             "scale the logits by head_dim ** -0.5", stage=_weights_variant(lambda c: 1.0)),
    BugClass("attention_scale_by_embed_dim", _WEIGHTS, "logits scaled by embed_dim ** -0.5",
             "the scale is head_dim ** -0.5 (head_dim = embed_dim / num_heads)",
             stage=_weights_variant(lambda c: c.embed_dim**-0.5), when=_several_heads),
    BugClass("attention_scale_after_softmax", _WEIGHTS, "softmax(q kᵀ) / sqrt(embed_dim): scaled after the softmax",
             "scale the logits before the softmax, by head_dim ** -0.5",
             stage=_weights_variant(lambda c: 1.0, after=lambda c: c.embed_dim**-0.5)),
    BugClass("attention_scale_on_q_and_k", _WEIGHTS, "the scale applied to q and to k (logits / head_dim)",
             "scale once: (q * head_dim ** -0.5) @ k.T",
             stage=_weights_variant(lambda c: 1.0 / c.head_dim)),
    BugClass("softmax_over_queries", _WEIGHTS, "the softmax over queries (axis -2)",
             "softmax over keys: softmax(dim=-1)",
             stage=_weights_variant(_inverse_sqrt_head_dim, axis=-2)),
    BugClass("softmax_over_batch", ("attn.weights",), "the softmax over the batch (dim=0)",
             "softmax over keys: softmax(dim=-1)",
             stage=_weights_variant(_inverse_sqrt_head_dim, axis=0)),
    BugClass("q_and_k_swapped", ("attn.weights",), "softmax(k qᵀ): q and k swapped",
             "logits are q @ k.T, rows the queries",
             stage=_weights_variant(_inverse_sqrt_head_dim, swap=True)),
    BugClass("causal_mask", ("attn.weights", "attn"), "a causal mask (is_causal=True) in an encoder",
             "a ViT encoder's attention is not causal: is_causal=False, no mask",
             stage=_weights_variant(_inverse_sqrt_head_dim, causal=True)),
    BugClass("softmax_without_max_float32", _WEIGHTS, "the softmax as exp(l) / sum(exp(l)) in float32",
             "subtract the row maximum (torch.softmax, jax.nn.softmax do)",
             stage=_softmax_naive(np.float32), overflow=True),
    BugClass("softmax_without_max_float16", _WEIGHTS, "the softmax as exp(l) / sum(exp(l)) in float16",
             "subtract the row maximum and keep the softmax in float32", stage=_softmax_naive(np.float16), overflow=True),
    BugClass("softmax_in_bfloat16", _WEIGHTS, "the softmax's exponentials and their sum in bfloat16",
             "keep the softmax in float32: mx.softmax(x, precise=True); F.softmax(x, dim=-1, dtype=torch.float32)",
             stage=_softmax_in("bfloat16")),
    BugClass("softmax_in_float16", _WEIGHTS, "the softmax's exponentials and their sum in float16",
             "keep the softmax in float32: mx.softmax(x, precise=True); F.softmax(x, dim=-1, dtype=torch.float32)",
             stage=_softmax_in("float16")),
    BugClass("logits_scaled_after_product_float16", _WEIGHTS,
             "q kᵀ in float16, scaled after the product: it overflows 65504",
             "scale q before the product: (q * scale) @ k.T, as timm", stage=_scaled_after_product(np.float16), overflow=True),
    # q, k, v
    BugClass("qkv_rows_h_qkv_d", ("attn.q", "attn.k", "attn.v"), "the fused qkv rows read as (heads, 3, head_dim)",
             "timm's qkv rows are (3, heads, head_dim): reshape(B, N, 3, H, hd)", state=_qkv_rows("h qkv d"),
             when=_several_heads),
    BugClass("qkv_rows_h_d_qkv", ("attn.q", "attn.k", "attn.v"), "the fused qkv rows read as (heads, head_dim, 3)",
             "rearrange 'b n (qkv h d) -> qkv b h n d', not (h d qkv)", state=_qkv_rows("h d qkv")),
    *POSITION_CLASSES,
    BugClass("qkv_bias_dropped", ("attn.q", "attn.k", "attn.v"), "q, k and v without the qkv bias",
             "load attn.qkv.bias (qkv_bias=True; a non-strict load drops it)", state=_qkv_bias_dropped,
             when=lambda c: c.qkv_bias),
    BugClass("qv_biases_misplaced", ("attn.k", "attn.v"), "k with v's bias and v with none",
             "timm's Eva joins the biases as cat(q_bias, zeros, v_bias): k has none (BEiT, EVA02)",
             stage=_qv_biases_misplaced, when=lambda c: not c.k_bias),
    # attention output
    BugClass("heads_merged_head_dim_first", ("attn", "attn_pool.proj"), "heads merged as (head_dim, heads)",
             "merge heads head-major: (B, H, N, hd) -> transpose(1, 2) -> (B, N, H * hd)",
             stage=_merged_head_dim_first, when=_several_heads),
    BugClass("attention_projects_input", ("attn",), "proj of the block's input: the attention result dropped",
             "proj takes softmax(q kᵀ) v merged over heads", stage=_projects_input),
    BugClass("proj_bias_dropped", ("attn",), "the attention's proj without its bias", "load attn.proj.bias",
             state=_bias_dropped("attn.proj.bias"), when=lambda c: c.proj_bias),
    # patch embedding
    BugClass("patch_kernel_hw_swapped", ("patch_embed",), "the patch kernel with H and W swapped (OIHW -> OWHI)",
             "convert a torch conv kernel OIHW to MLX/Flax as OHWI (transpose(0, 2, 3, 1))",
             state=_kernel_hw_swapped),
    BugClass("patch_flattened_channels_last", ("patch_embed",),
             "patches flattened (s1 s2 c) against a kernel flattened (c s1 s2)",
             "flatten the conv kernel in the order the patches are: w.permute(0, 2, 3, 1).reshape(D, -1)",
             state=_kernel_channels_last, when=lambda c: c.in_chans > 1),
    BugClass("tokens_column_major", ("patch_embed",), "the patch tokens flattened column-major (w, h)",
             "flatten the grid row-major: x.flatten(2).transpose(1, 2) from (B, D, h, w)",
             stage=_tokens_column_major),
    BugClass("patch_bias_dropped", ("patch_embed",), "the patch embedding without its bias",
             "load patch_embed.proj.bias", state=_bias_dropped("patch_embed.proj.bias")),
    *TABLE_CLASSES,
    *TOWER_CLASSES,
    # pooling
    BugClass("mean_pool_over_every_token", ("pooled",), "the mean over every token, the class token included",
             "global_pool='token' takes x[:, 0]; 'avg' the mean over the patch tokens x[:, num_prefix_tokens:] "
             "(a model meant to average them all, vit-pytorch's 'mean': pool_include_prefix=True)",
             stage=_pooled(lambda x, c: x.mean(1), lambda x, c: x),
             when=lambda c: not (c.pool_include_prefix and c.global_pool == "avg")),
    BugClass("mean_pool_skipping_only_the_class_token", ("pooled",),
             "the mean over every token but the class token (registers averaged in)",
             "average the patch tokens only: x[:, num_prefix_tokens:] (1 + reg_tokens prefix tokens)",
             stage=_pooled(lambda x, c: x[:, int(c.class_token):].mean(1), lambda x, c: x[:, int(c.class_token):]),
             when=lambda c: c.reg_tokens > 0),
    BugClass("class_token_pooled", ("pooled",), "the class token where the config averages",
             "global_pool='avg' averages the patch tokens", stage=_pooled(lambda x, c: x[:, 0]),
             when=lambda c: c.global_pool == "avg" and c.class_token),
    BugClass("mean_pool_instead_of_class_token", ("pooled",), "the patch-token mean where the config pools the class token",
             "global_pool='token' takes x[:, 0]",
             stage=_pooled(lambda x, c: x[:, c.num_prefix_tokens:].mean(1), lambda x, c: x[:, c.num_prefix_tokens:]),
             when=lambda c: c.global_pool == "token"),
    BugClass("last_token_pooled", ("pooled",), "the last token where the config pools the class token",
             "the class token is the first: x[:, 0] (a decoder's last-token pooling?)",
             stage=_pooled(lambda x, c: x[:, -1]), when=lambda c: c.global_pool == "token"),
    BugClass("norm_after_pooling", ("pooled",), "the final norm applied to the mean of the tokens",
             "timm norms every token, then averages: norm(x).mean(1) (open_clip's final_ln_after_pool differs)",
             stage=_norm_after_pooling, when=lambda c: c.global_pool == "avg" and c.use_final_norm),
    BugClass("token_sum_float16", ("pooled",), "the token mean as a running sum in float16",
             "accumulate the mean in float32: x.mean(1, dtype=torch.float32)", stage=_pooled(_token_sum(np.float16)),
             when=lambda c: c.global_pool == "avg"),
    # LayerScale, residual, MLP, head
    BugClass("layerscale_missing", ("ls1", "ls2", "block"), "the residual branches without LayerScale (gamma at 1)",
             "load ls1.gamma and ls2.gamma (DINOv2: init_values; a non-strict load drops them)",
             state=_layerscale(0.0), when=lambda c: c.init_values is not None),
    BugClass("layerscale_applied_twice", ("ls1", "ls2"), "LayerScale applied twice (gamma squared)",
             "multiply by gamma once", state=_layerscale(2.0), when=lambda c: c.init_values is not None),
    BugClass("residual_dropped", ("block",), "a block without its residual (x not added back)",
             "x = x + attn(norm1(x)); x = x + mlp(norm2(x))", stage=_residual_dropped),
    BugClass("residual_from_norm_output", ("block",), "the first residual taken from norm1's output",
             "add the block's input, not its normalised input: x = x + attn(norm1(x))", stage=_residual_from_norm),
    BugClass("extra_layernorm_in_mlp", ("mlp",), "an extra LayerNorm (default init) between the MLP's activation and fc2",
             "timm's Mlp is fc1, act, fc2 (its norm is Identity)", stage=_extra_mlp_norm,
             when=lambda c: c.mlp_layer == "mlp"),
    BugClass("fc2_bias_dropped", ("mlp",), "the MLP's fc2 without its bias", "load mlp.fc2.bias",
             state=_bias_dropped("mlp.fc2.bias")),
    BugClass("head_bias_dropped", ("logits",), "the head without its bias", "load head.bias",
             state=_bias_dropped("head.bias"), when=lambda c: c.num_classes > 0),
    BugClass("distillation_head_dropped", ("logits",), "the class token's head alone (no distillation head)",
             "DeiT's logits are (head(x[:, 0]) + head_dist(x[:, 1])) / 2: DeiTForImageClassificationWithTeacher",
             stage=lambda n, t, i, s, c: t["pooled"] @ s["head.weight"].T + s.get("head.bias", 0.0) if n == "logits" else None,
             when=lambda c: c.distilled and c.num_classes > 0),
    # any stage, last: a class of one operation above explains the same factor first
    BugClass("constant_factor", tuple(sorted(BY_KIND)), "this stage times a constant c",
             "a factor the reference does not apply, or one it does left out: the Transformer paper's "
             "embedding scale √d_model (a ViT has none), a scale applied twice or not at all, a sign",
             family="factor"),
)
# fmt: on
