"""A model the config cannot describe, told as such: when canonical keys have nowhere to go in a
model, the config names parts the model does not have. That is not a finding about the port
(verify exits 2, never NOT CONFORMANT at ``load``): one line per missing part, saying what the
model appears to compute instead and the config option that expresses it where one exists.

A mapping that forgot an entry looks the same from here; each line names the keys, so either
reading is one edit away (the option, or the mapping).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import numpy as np

from conformance.capture.mapping import module_of
from conformance.report import CannotJudge
from weights.canonical import expected_shapes
from weights.config import ConfigError, ViTConfig
from weights.options import ATTN_OUT_BIAS, BY_FIELD, MLP_BIAS, OPTIONS

# (canonical key pattern, what the model lacks, the option that expresses it): each option's own
# (weights/options.py, ``Option.lacks``)
PARTS = tuple(part for option in OPTIONS for part in option.lacks)
# (what the option is called, the config changes that add a canonical key): a mapping that reads
# a key only these add needs the option (``Option.adds``)
ADDS = tuple(option.adds for option in OPTIONS if option.adds)


def adding(key: str, config) -> tuple[str, tuple] | None:
    """(the option, the key's shape) for a canonical key ``config`` lacks that an option adds."""

    for option, changes in ADDS:
        field = next(iter(changes))  # the option itself; the rest only makes it valid
        try:
            shapes = expected_shapes(config.replace(**changes))
            without = expected_shapes(config.replace(**{k: v for k, v in changes.items() if k != field}))
        except ConfigError:
            continue
        if key in shapes and key not in without:
            return option, shapes[key]
    return None


def options_read(convert, state, config, first: str) -> NotExpressible | None:
    """The answer for a convert that reads canonical keys ``config`` lacks (``first`` the first
    it asked for), where options add them: each such key filled with zeros of its shape, the
    convert run again, until it asks for none; one line per option."""
    state, lines, key = dict(state), {}, first
    for _ in range(64):  # every optional key at most once
        found = adding(key, config)
        if found is None:
            return None if not lines else _needs(lines)
        lines.setdefault(found[0], []).append(_fold(key))
        state[key] = np.zeros(found[1], np.float32)
        try:
            convert(state)
            break
        except KeyError as e:
            key = e.args[0] if e.args and isinstance(e.args[0], str) else None
            if key is None or key in state:
                break
    error = _needs(lines)
    error.reads, error.state = _read_lines(lines), state  # the whole state, for the rest of the answer
    return error


def _read_lines(lines) -> dict[str, list[str]]:
    return {f"it has a part the config does not name: {o} expresses it": k for o, k in lines.items()}


def _needs(lines) -> NotExpressible:
    body = "\n".join(f"  {what} ({', '.join(dict.fromkeys(k))})" for what, k in _read_lines(lines).items())
    return NotExpressible(f"the mapping reads canonical keys the config does not have:\n{body}")


class NotExpressible(CannotJudge):
    """The config names parts the model does not have (exit 2): the message has a line for each."""

    label = "the config cannot express this model"


# What a model computes that the config must say (a position scheme beyond one table added once, a
# norm of another kind), found by its modules' class names
# or its parameters' names: (what it is, a class-name pattern, a parameter-name pattern, the
# option that expresses it or None). With that option unset, or no option for it yet, such a
# model is not a wrong port: verify cannot judge it, and says so (exit 2) before anything runs.
LEARNED_ROTARY = "it learns its rotary frequencies, per block and head (RoPE-Mixed)"
RMS_NORM = "it normalises by the root mean square, without a mean or a bias (RMSNorm: AIMv2)"
SEQUENCE_ROTARY = (
    "it rotates q and k by each token's index in the sequence (a 1-D rotary embedding), not by a patch's row and column"
)
SCHEMES = (
    (
        LEARNED_ROTARY,
        None,
        r"(.*\.)?\w*(rope|rotary)\w*\.freqs",
        "rope_type='mixed'",
    ),
    (
        SEQUENCE_ROTARY,
        # mlx.nn.RoPE and x-transformers' RotaryEmbedding turn a token by its index in the sequence
        r"RoPE|RotaryEmbedding",
        r"(.*\.)?\w*(rope|rotary)\w*\.inv_freq",
        None,
    ),
    (
        "it rotates q and k by their positions (a rotary position embedding: EVA02, DINOv3, timm's "
        "rope ViTs, Perception Encoder)",
        # the module that makes the angles of a patch's row and column (an attention class that can
        # rotate, timm's AttentionRope, also runs without them)
        r"(?!(RoPE|RotaryEmbedding)$).*(Rotary|RoPE|Rope(?![a-z])).*(Emb|Position|Freq).*",
        r"(.*\.)?\w*(rope|rotary)\w*\.periods",
        "rope_type",
    ),
    (
        RMS_NORM,
        r".*(RMSNorm|RmsNorm).*",  # timm's RmsNorm, torch.nn.RMSNorm, transformers' Aimv2RMSNorm, mlx's, nnx's
        r"(?!)",  # no parameter shows it: an RMSNorm's weight is a LayerNorm's
        "norm_layer='rmsnorm'",
    ),
    (
        "it adds a learned relative position bias to each block's attention logits (BEiT)",
        r".*RelativePosition.*",
        r".*relative_position_bias_table",
        "rel_pos_bias",
    ),
)
# how the option that expresses a scheme is named to the user
EXPRESSED_BY = {
    "rope_type": "rope_type ('cat': EVA02, the axial rope ViTs and Llama 4's tower; 'dinov3'; 'pixtral': Pixtral's "
    "bands; with rope_temperature, rope_grid_indexing, rope_grid_offset, rope_rotate_half, ref_feat_shape) "
    "expresses it",
    "rope_type='mixed'": "rope_type='mixed' (its frequencies the canonical rope.freqs, (2, depth, heads, "
    "head_dim / 2); with rope_grid_indexing) expresses it",
    "norm_layer='rmsnorm'": "norm_layer='rmsnorm' (the model's norms; qk-norm's and the attention pool's stay "
    "LayerNorms) expresses it",
    "rel_pos_bias": "rel_pos_bias=true (each block's attn.relative_position_bias_table, ((2 gh - 1)(2 gw - 1) + 3, "
    "heads); BEiT has no position table: pos_embed='none') expresses it",
}
# whether a config says what the option names
SAID = {
    "rope_type": lambda c: c.rope_type is not None,
    "rope_type='mixed'": lambda c: c.rope_type == "mixed",
    "rel_pos_bias": lambda c: c.rel_pos_bias,
    "norm_layer='rmsnorm'": lambda c: c.norm_layer == "rmsnorm",
}
NO_WORD = "the config has no word for it yet"


def schemes(kinds: Mapping[str, str], keys, config=None) -> dict[str, list[str]]:
    """{what the model computes that ``config`` does not say: the modules or parameters that show
    it}, from its modules' class names (``kinds``, path -> class name) and parameter keys."""
    found: dict[str, list[str]] = {}
    for what, kind, key, option in SCHEMES:
        shown = sorted({_fold(p) + f" ({k})" for p, k in kinds.items() if kind and re.fullmatch(kind, k)})
        shown += sorted({_fold(k) for k in keys if re.fullmatch(key, k)})
        if option and config is not None and SAID[option](config):
            continue  # the config says it: the model is judged
        if shown and option == "rope_type" and any(w.startswith(LEARNED_ROTARY) for w in found):
            continue  # its rotation is the learned kind: the line above says which option that is
        if shown:
            found[f"{what}: {EXPRESSED_BY[option] if option else NO_WORD}"] = shown
    return found


def _fold(key: str) -> str:
    return re.sub(r"\.\d+\.", ".{i}.", key) if key else "the model"


# LayerScale held as bare vectors: timm's Beit and Eva (gamma_1), transformers' BEiT (lambda_1)
# and DINOv3 (layer_scale1.lambda1)
HELD_LAYERSCALE = r".*\.(gamma_[12]|lambda_?[12])"


def split_qv_bias(extra) -> list[str]:
    """The model's q and v biases held apart with no k bias (timm's Beit and Eva: ``q_bias``,
    ``v_bias``, beside a qkv without bias)."""
    return [k for k in extra if re.fullmatch(r".*\.(q_bias|v_bias)", k)]


def optional_parts(keys) -> bool:
    """Whether every canonical key of ``keys`` is a part some model leaves out (a bias, a token,
    the position table, a norm): a mapping that sends a weight matrix nowhere made a mistake."""
    return all(any(re.fullmatch(pattern, k) for pattern, _, _ in PARTS) for k in keys)


FUSED_QKV = r"blocks\.\d+\.attn\.qkv\.(weight|bias)"  # the config's one projection of q, k and v


NECK = (
    "it has a convolutional neck after its blocks ({module}: SAM's): no option yet; ModelPort(tower='blocks.{{last}}') "
    "checks the tower up to it"
)


def _neck(extra, shapes, width: int) -> list[str]:
    """The model's unfilled parameters that make a convolutional neck over the blocks' tokens: a
    convolution reading ``width`` channels (in any framework's kernel layout) and every unfilled
    parameter beside it in its parent module (SAM's neck: two convolutions, two channel norms)."""
    convs = [k for k in extra if len(shapes.get(k, ())) == 4 and width in tuple(shapes[k])[1:]]
    if not convs:
        return []
    parent = module_of(module_of(convs[0]))
    return [k for k in extra if k.startswith(parent + ".")] if parent else convs


def extra_parts(extra, shapes, config) -> dict[str, list[str]]:
    """The model's unfilled parameters that are parts an option adds: a norm's weight and bias
    over a flattened patch (``patch_norm``), or over the width beside the patch projection's
    module (``embed_norm``, given as ``shapes['patch_embed.proj']``: the module receiving it)."""
    if config is None:
        return {}
    found: dict[str, list[str]] = {}
    proj = shapes.get("patch_embed.proj")
    for key in extra:
        module, _, leaf = key.rpartition(".")
        shape = tuple(shapes.get(key, ()))
        if leaf not in ("weight", "bias", "gamma", "scale") or len(shape) != 1:
            continue
        if shape == (config.patch_dim,) and config.patch_dim != config.embed_dim:
            found.setdefault(
                "it normalises the raw patches: patch_norm=true (and ModelPort(patch_order=...)) expresses it", []
            ).append(key)
        elif shape == (config.embed_dim,) and proj and module.rpartition(".")[0] == proj.rpartition(".")[0]:
            found.setdefault("it normalises the patch embedding: embed_norm=true expresses it", []).append(key)
    D = config.embed_dim
    regs = [k for k in extra if re.search(r"reg(ister)?_tokens?$", k) and len(shapes.get(k, ())) == 3]
    if regs and tuple(shapes[regs[0]])[2] == D:
        n = tuple(shapes[regs[0]])[1]
        found[f"it has {n} register tokens: reg_tokens={n} expresses it"] = regs
        extra = [k for k in extra if k not in regs]
    gammas = [k for k in extra if re.fullmatch(HELD_LAYERSCALE, k) and tuple(shapes.get(k, ())) == (D,)]
    if gammas:
        what = (
            "it scales its residual branches by held vectors (LayerScale as timm's Beit and Eva hold it): "
            "init_values with a rename of blocks.{i}.ls1.gamma and ls2.gamma to them expresses it"
        )
        found[what] = gammas
        extra = [k for k in extra if k not in gammas]
    qv = split_qv_bias(extra)
    if qv:
        what = (
            "its q and v projections have biases of their own and k none (BEiT, EVA): k_bias=false expresses it "
            "(or qkv_bias=true with a convert that sends qkv.bias's q and v thirds there, where no rotary "
            "embedding turns k: then a k bias changes no attention)"
        )
        found[what] = qv
        extra = [k for k in extra if k not in qv]
    neck = _neck(extra, shapes, D)
    if neck:
        found[NECK.format(module=module_of(module_of(neck[0])) or neck[0])] = neck
        extra = [k for k in extra if k not in neck]
    tokens = [k for k in extra if tuple(shapes.get(k, ())) in ((1, 1, D), (1, D))]
    heads = [k for k in extra if config.num_classes and tuple(shapes.get(k, ())) == (config.num_classes, D)]
    if tokens and (heads or not config.num_classes):  # a token and a classifier no key fills: DeiT's
        what = "it has a second token and head (DeiT's distillation token): distilled=true expresses it"
        found[what] = tokens + heads
    return found


def not_expressible(
    dropped: list[str],
    extra: list[str] = (),
    shapes=None,
    config=None,
    reads=None,
    kinds=None,
    norm_at=None,
    apart=(),
    tower=None,
) -> NotExpressible:
    """The answer for canonical keys with nowhere to go in the model: one line per part the model
    lacks, naming its keys (blocks folded) and the option that expresses it; ``extra``, the
    model's parameters no canonical key fills: the parts an option adds named (``extra_parts``,
    from the parameters' ``shapes``), the rest in a line of their own; what the config has no
    word for (``schemes``, from the modules' class names ``kinds``) first; ``norm_at``: the module
    where the mapping sends the final norm on every token, ``norm``, where the model has one; ``apart``:
    the model's keys where it sends q, k and v projected apart, where the model has every one;
    ``tower``: the port's ``tower=``, whose parameters after it are set apart only once the rest is
    expressed (the model must run for that), said so on their line."""
    lines: dict[str, list[str]] = schemes(kinds or {}, list(shapes or {}), config)
    shown = {k for keys in lines.values() for k in keys}
    extra = [k for k in extra if _fold(k) not in shown]
    if lines and "pos_embed" in dropped:  # no learned table: its positions come from the scheme
        lines[next(iter(lines))].append("and no pos_embed")
        dropped = [k for k in dropped if k != "pos_embed"]
    if any(w.startswith(RMS_NORM) for w in lines):  # an RMSNorm has no bias: not a bias-free LayerNorm
        biases = [k for k in dropped if re.fullmatch(BY_FIELD["norm_bias"].lacks[0][0], k)]
        lines[next(w for w in lines if w.startswith(RMS_NORM))] += (
            ["and no " + ", ".join(map(_fold, biases))] if biases else []
        )
        dropped = [k for k in dropped if k not in biases]
    lines.update(reads or {})
    dropped, extra = _paired(lines, dropped, extra, norm_at, apart)
    for key in dropped:
        # a module whose weight is gone too is missing whole, not bias-free: the weight's line
        part = key.removesuffix(".bias") + ".weight" if f"{key.removesuffix('.bias')}.weight" in dropped else key
        lacks, option = next(
            ((lacks, option) for pattern, lacks, option in PARTS if re.fullmatch(pattern, part)),
            (f"it has no place for {key}", None),
        )
        what = f"{lacks}: " + (f"{option} expresses it" if option else "no option of the config expresses it yet")
        lines.setdefault(what, []).append(_fold(key))
    found = extra_parts(extra, shapes or {}, config)
    for what, keys in found.items():
        lines[what] = [_fold(k) for k in keys]
        extra = [k for k in extra if k not in keys]
    if extra:
        what = "and it has parameters no canonical key fills"
        if tower is not None:  # a merger's, an adapter's: out of scope once the model runs
            what += f" (those after the tower's output, ModelPort(tower={tower!r}), are set apart once the rest is expressed)"
        lines[what] = [_fold(k) for k in extra]
    body = "\n".join(
        f"  {what}" + (f" ({', '.join(dict.fromkeys(keys))})" if keys else "") for what, keys in lines.items()
    )
    return NotExpressible(f"canonical keys have nowhere to go in the model (or the mapping forgot them):\n{body}")


def _paired(lines: dict, dropped: list[str], extra: list[str], norm_at=None, apart=()) -> tuple[list[str], list[str]]:
    """Dropped keys whose part the model holds another way, told as one line each (the attention
    output's and the MLP's biases, the final norm after the pooling or on every token, q, k and v
    projected apart), or left to the line of the part it holds instead (q and v biases apart,
    LayerScale as gamma_1)."""
    attn_out, mlp = (any(re.fullmatch(p, k) for k in dropped) for p in (ATTN_OUT_BIAS, MLP_BIAS))
    if attn_out and not mlp:  # timm's proj_bias drops both; the MLP's kept on their own
        lines["its attention output has no bias, its MLP has: proj_bias=false with mlp_bias=true expresses it"] = []
        dropped = [k for k in dropped if not re.fullmatch(ATTN_OUT_BIAS, k)]
    elif attn_out and mlp:
        lines["its attention output and its MLP have no biases: proj_bias=false expresses it"] = []
        dropped = [k for k in dropped if not re.fullmatch(f"{ATTN_OUT_BIAS}|{MLP_BIAS}", k)]
    if any(k.startswith("fc_norm.") for k in extra) and any(k.startswith("norm.") for k in dropped):
        # timm moves the final norm after the pooling under global_pool='avg' (fc_norm)
        what = "its final norm comes after the pooling (timm's fc_norm): fc_norm=true expresses it"
        lines[what] = [k for k in dropped if k.startswith("norm.")]
        dropped = [k for k in dropped if not k.startswith("norm.")]
        extra = [k for k in extra if not k.startswith("fc_norm.")]
    fc = [k for k in dropped if k.startswith("fc_norm.")]
    if fc and norm_at and any(k.startswith(norm_at + ".") for k in extra):
        # and back: the config's norm after the pooling (global_pool='avg' takes fc_norm by default),
        # the model's on every token before it, where the mapping sends norm
        what = f"its final norm acts on every token, before the pooling ({norm_at}): fc_norm=false expresses it"
        lines[what] = fc
        dropped = [k for k in dropped if k not in fc]
        extra = [k for k in extra if not k.startswith(norm_at + ".")]
    if split_qv_bias(extra):
        dropped = [k for k in dropped if not re.fullmatch(r"blocks\.\d+\.attn\.qkv\.bias", k)]
    if any(re.fullmatch(HELD_LAYERSCALE, k) for k in extra):
        dropped = [k for k in dropped if not re.fullmatch(r"blocks\.\d+\.ls[12]\.gamma", k)]
    fused = [k for k in dropped if re.fullmatch(FUSED_QKV, k)]
    if fused and apart:  # the config's one projection, the model's three
        what = f"its q, k and v are projected apart ({module_of(apart[0])}, ...): qkv_fused=false expresses it"
        lines[what] = [_fold(k) for k in fused]
        dropped = [k for k in dropped if k not in fused]
        extra = [k for k in extra if k not in set(apart)]
    return dropped, extra


def why_absent(key: str, config: ViTConfig) -> str:
    """Why the convert found no ``key`` in the canonical state of ``config``."""
    why = "this config has no such key (weights.expected_shapes lists them)"
    if key.startswith("norm.") and config.use_fc_norm:
        why = f"timm moves the final norm after the pooling (fc_norm.{key.partition('.')[2]}) when global_pool={config.global_pool!r}"
    elif key in ("cls_token", "dist_token", "reg_token", "pos_embed") or key.startswith(("head.", "head_dist.")):
        why = f"this config has none (class_token={config.class_token}, reg_tokens={config.reg_tokens}, num_classes={config.num_classes})"
    return f"the convert reads {key!r}, which the canonical state does not hold: {why}"


def windowed(blocks: Mapping[int, list[int]], config) -> NotExpressible:
    """A model whose fused attention runs on windows of an image's tokens (``cu_seqlens``: Qwen2.5-VL's
    window attention, its windows of merge groups cut at the image's edge, in window order), under a
    config without ``window_partition='truncate'`` (SAM's padded windows are another scheme)."""
    shown = ("block " if len(blocks) == 1 else "blocks ") + ", ".join(map(str, sorted(blocks)))
    sizes = ", ".join(map(str, sorted({n for counts in blocks.values() for n in counts})))
    return NotExpressible(
        f"it attends within windows of each image's {config.num_tokens} tokens (in {shown} its fused "
        f"attention called on {sizes} tokens at a time, Qwen2.5-VL's window attention): window_size (the "
        "windows' side in patches) with window_partition='truncate' expresses it, global_attn_indexes its "
        "blocks that attend the whole image"
    )


def hierarchical(canonical: Mapping[str, str], params: Mapping[str, tuple], config) -> NotExpressible | None:
    """For a mapping whose shapes do not fit (``canonical``: model key -> the canonical key sent
    there; ``params``: the model's shapes): the answer where they show the model's width changing
    across its blocks (hierarchical stages: Hiera, Swin, MViT), which one embed_dim cannot express."""
    widths = {}
    for key, shape in params.items():
        m = re.fullmatch(r"blocks\.(\d+)\.norm1\.weight", canonical.get(key, ""))
        if m and len(shape) == 1:
            widths[int(m.group(1))] = shape[0]
    if len(set(widths.values())) < 2:
        return None
    seen = ", ".join(f"{i}: {w}" for i, w in sorted(widths.items()))
    return NotExpressible(
        "its width changes across its blocks (block: width "
        f"{seen}; the config's embed_dim is {config.embed_dim}): hierarchical stages (Hiera, Swin, MViT), "
        "which no option of the config expresses yet"
    )
