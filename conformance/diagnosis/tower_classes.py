"""The bug classes the vision towers of VLMs brought (issue 60): a norm of the other kind (LayerNorm
where RMSNorm, and back), a packed batch's images attending to each other, tokens in a merger's 2 x 2
order read as row-major, SwiGLU's gate and value swapped, LayerScale's two gammas swapped, SAM's
relative position tables swapped or read backwards, Qwen2.5-VL's windows ignored. Registered
with the whole model's classes (model_classes.CLASSES)."""

from __future__ import annotations

import numpy as np

from conformance.capture.sequence import merge_order
from conformance.diagnosis.bugclass import QUIET, BugClass
from conformance.numerics.error_model import evaluate
from conformance.numerics.evaluate import attend_and_project, on_grid
from conformance.numerics.kinds.attention import softmax_weights
from conformance.numerics.kinds.layer_norm import layer_norm, rms_norm
from impls.stages import stage_inputs, stage_kind

_MODEL_NORMS = ("patch_embed.norm", "norm1", "norm2", "norm", "norm_pre")  # the stages config.norm_layer decides


def _norm_of_kind(rms: bool):
    """The model's norms computed as the other kind: RMSNorm (no mean, no bias) or LayerNorm, each
    with its own error model's bound (a LayerNorm's grows with the mean against the spread)."""

    def stage(name, t, images, s, config, precision=QUIET):
        if stage_kind(name) not in _MODEL_NORMS:
            return None
        grid = config.grid_at(images.shape[2:])  # norm2 reads the residual sum, a window's branch on the grid
        inputs = on_grid(name, [t[k] for k in stage_inputs(name, config)], config, grid)
        x, prefix = inputs[0] + inputs[1] if stage_kind(name) == "norm2" else inputs[0], name
        norm = rms_norm if rms else layer_norm
        return norm(x, s[f"{prefix}.weight"], 0.0 if rms else s.get(f"{prefix}.bias", 0.0), config.norm_eps, precision)

    stage.bounded = True  # returns (value, bound) in ``precision``
    return stage


def _across_images(name, t, images, s, config):
    """Every image's queries over every image's keys: a packed batch (one sequence of all the
    images' tokens) whose block-diagonal mask leaks, or an attention over the batch."""
    if stage_kind(name) != "attn" or not name.startswith("blocks."):
        return None
    b = ".".join(name.split(".")[:2])
    q, k = (t[n] for n in stage_inputs(f"{b}.attn.weights", config)[:2])
    B, H, N, hd = q.shape
    q, k, v = (x.transpose(1, 0, 2, 3).reshape(1, H, B * N, hd) for x in (q, k, t[f"{b}.attn.v"]))
    logits = q @ k.swapaxes(-1, -2) * hd**-0.5
    w = np.exp(logits - logits.max(-1, keepdims=True))
    o = ((w / w.sum(-1, keepdims=True)) @ v).reshape(H, B, N, hd).transpose(1, 2, 0, 3).reshape(B, N, H * hd)
    return o @ s[f"{b}.attn.proj.weight"].T + s.get(f"{b}.attn.proj.bias", 0.0)


def _windows_ignored(name, t, images, s, config, precision=QUIET):
    """A block that attends within windows cut at the image's edge (Qwen2.5-VL's) attending over the
    whole image (its window mask, its cu_seqlens of windows, left out): its weights, or its output,
    each with its error model's bound (the weights a window masks are zero, their bound none)."""
    kind = stage_kind(name)
    if kind not in ("attn.weights", "attn") or not config.block_window_cut(int(name.split(".")[1])):
        return None
    b = ".".join(name.split(".")[:2])
    q, k = (t[n] for n in stage_inputs(f"{b}.attn.weights", config)[:2])
    weights = softmax_weights(q, k, q.shape[-1] ** -0.5, precision)
    if kind == "attn.weights":
        return weights
    return attend_and_project(weights[0], t[f"{b}.attn.v"], s, f"{b}.attn.proj", precision)


_windows_ignored.bounded = True


def _tokens_in_merge_order(name, t, images, s, config):
    """The patch tokens in 2 x 2 merge groups (Qwen2-VL's order) where the grid's row-major is read."""
    gh, gw = config.grid_at(images.shape[2:])
    if name != "patch_embed" or gh % 2 or gw % 2:
        return None
    return evaluate(name, t, images, s, config, QUIET)[0][:, merge_order((gh, gw), 2)]


def _gammas_swapped(s, config):
    """Each block's ls1 gamma where its ls2 is, and back."""
    return {
        f"blocks.{i}.ls{a}.gamma": s[f"blocks.{i}.ls{b}.gamma"]
        for i in range(config.depth)
        for a, b in ((1, 2), (2, 1))
    }


def _gate_and_value_swapped(s, config):
    """SwiGLU's gate (fc1_g) and value (fc1_x) projections each where the other is."""
    pairs = (
        (f"blocks.{i}.mlp.fc1_{a}.{p}", f"blocks.{i}.mlp.fc1_{b}.{p}")
        for i in range(config.depth)
        for a, b in (("g", "x"), ("x", "g"))
        for p in ("weight", "bias")
    )
    return {one: s[two] for one, two in pairs if two in s}


def _rel_pos_tables(change):
    """Every block's decomposed relative position tables (SAM's rel_pos_h, rel_pos_w) as ``change``
    makes them of the two: ``change(h, w) -> (h', w')``, or None where it does not apply."""

    def state(s, config):
        out = {}
        for i in range(config.depth):
            b = f"blocks.{i}.attn"
            changed = change(s[f"{b}.rel_pos_h"], s[f"{b}.rel_pos_w"])
            if changed is not None:
                out[f"{b}.rel_pos_h"], out[f"{b}.rel_pos_w"] = changed
        return out

    return state


def _swapped(h, w):
    return (w, h) if h.shape == w.shape else None


def _reversed(h, w):
    return h[::-1], w[::-1]  # row i - j + S - 1 read as j - i + S - 1: the offset key minus query


# fmt: off
TOWER_CLASSES: tuple[BugClass, ...] = (
    BugClass("layernorm_where_rmsnorm", _MODEL_NORMS, "a LayerNorm (the mean subtracted) where the model's is RMSNorm",
             "AIMv2's norms are RMSNorm, x / sqrt(mean(x^2) + eps) * weight: timm's RmsNorm, torch.nn.RMSNorm, "
             "mlx.nn.RMSNorm, flax.nnx.RMSNorm", stage=_norm_of_kind(rms=False), when=lambda c: c.norm_layer == "rmsnorm"),
    BugClass("rmsnorm_where_layernorm", _MODEL_NORMS, "an RMSNorm (no mean, no bias) where the model's is LayerNorm",
             "a ViT's norms are LayerNorm, (x - mean) / sqrt(var + eps) * weight + bias",
             stage=_norm_of_kind(rms=True), when=lambda c: c.norm_layer == "layernorm"),
    BugClass("attention_across_images", ("attn",), "every image's queries attending over every image's keys",
             "keep a packed batch's images apart: a block-diagonal mask over the sequence (cu_seqlens), "
             "or attend within each batch row", stage=_across_images, when=lambda c: not c.rel_pos_bias),
    BugClass("windows_ignored", ("attn.weights", "attn"), "a windowed block attending over the whole image",
             "Qwen2.5-VL's blocks but its fullatt_block_indexes attend within their windows (cu_window_seqlens): "
             "each token its own window's tokens", stage=_windows_ignored, when=lambda c: c.window_partition == "truncate"),
    BugClass("tokens_in_merge_order", ("patch_embed",), "the patch tokens in 2 x 2 merge groups, not row-major",
             "a tower that orders its tokens for a 2 x 2 merger (Qwen2-VL) says so: ModelPort(sequence='merge2x2')",
             stage=_tokens_in_merge_order),
    BugClass("swiglu_gate_and_value_swapped", ("mlp.act",), "SwiGLU's gate and value projections swapped",
             "act(gate) * value: the activation takes fc1_g (gate_proj), not fc1_x (up_proj)",
             state=_gate_and_value_swapped, when=lambda c: c.mlp_layer == "swiglu"),
    BugClass("layerscale_gammas_swapped", ("ls1", "norm2", "ls2", "block"), "ls1's gamma and ls2's swapped",
             "ls1 scales the attention's branch, ls2 the MLP's (transformers' lambda_1, lambda_2; timm's gamma_1, gamma_2)",
             state=_gammas_swapped, when=lambda c: c.init_values is not None),
    BugClass("rel_pos_rows_and_columns_swapped", ("attn.rel_pos",), "rel_pos_h and rel_pos_w swapped",
             "rel_pos_h is read at each key's row offset (y - y'), rel_pos_w at its column offset (x - x')",
             state=_rel_pos_tables(_swapped), when=lambda c: c.use_rel_pos),
    BugClass("rel_pos_offsets_reversed", ("attn.rel_pos",), "the relative positions read as key minus query",
             "the table's row is the query's position minus the key's plus S - 1 (timm's get_rel_pos: q_coords - "
             "k_coords)", state=_rel_pos_tables(_reversed), when=lambda c: c.use_rel_pos),
)
# fmt: on
