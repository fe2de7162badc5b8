"""A model the config cannot describe, told as such: when canonical keys have nowhere to go in a
model, the config names parts the model does not have. That is not a finding about the port
(verify exits 2, never NOT CONFORMANT at ``load``): one line per missing part, saying what the
model appears to compute instead and the config option that expresses it where one exists.

A mapping that forgot an entry looks the same from here; each line names the keys, so either
reading is one edit away (the option, or the mapping).
"""

from __future__ import annotations

import re

from conformance.report import UsageError

# (canonical key pattern, what the model lacks, the option that expresses it, or None)
PARTS = (
    (r"blocks\.\d+\.attn\.qkv\.bias", "its q, k and v projections have no bias", "qkv_bias=false"),
    (r"blocks\.\d+\.attn\.proj\.bias", "its attention output has no bias", "proj_bias=false"),
    (r"blocks\.\d+\.mlp\.fc[12](_[gx])?\.bias", "its MLP has no biases", "mlp_bias=false"),
    (
        r"(blocks\.\d+\.norm[12]|norm|fc_norm|norm_pre|patch_embed\.(patch_)?norm)\.bias",
        "its LayerNorms have no bias (a bias-free norm)",
        "norm_bias=false",
    ),
    (r"cls_token", "it has no class token", "class_token=false (with global_pool='avg')"),
    (r"reg_token", "it has no register tokens", "reg_tokens=0"),
    (r"dist_token|head_dist\.(weight|bias)", "it has no distillation token and head", "distilled=false"),
    (
        r"pos_embed",
        "it has no learned position table",
        "pos_embed='sincos' (SimpleViT's fixed 2-D table, computed at the grid) or pos_embed='none'",
    ),
    (
        r"patch_embed\.proj\.bias",
        "its patch embedding has no bias",
        "pre_norm=true (CLIP: with a norm after the embedding)",
    ),
    (r"blocks\.\d+\.ls[12]\.gamma", "its residual branches have no LayerScale", "init_values=null"),
    (r"blocks\.\d+\.attn\.[qk]_norm\.(weight|bias)", "it normalises neither q nor k", "qk_norm=false"),
    (r"(norm|fc_norm)\.weight", "it has no final norm", None),
)


# (canonical key pattern, the option that adds it): a model whose mapping reads it needs the option
ADDS = (
    (r"dist_token|head_dist\.(weight|bias)", "distilled=true"),
    (r"cls_token", "class_token=true"),
    (r"reg_token", "reg_tokens > 0"),
    (r"pos_embed", "pos_embed='learn'"),
    (r"patch_embed\.patch_norm\.(weight|bias)", "patch_norm=true"),
    (r"patch_embed\.norm\.(weight|bias)", "embed_norm=true"),
    (r"norm_pre\.(weight|bias)", "pre_norm=true"),
    (r"blocks\.\d+\.ls[12]\.gamma", "init_values"),
    (r"blocks\.\d+\.attn\.[qk]_norm\.(weight|bias)", "qk_norm=true"),
)


def needs_option(key: str) -> NotExpressible | None:
    """The answer for a mapping that reads a canonical key the config does not have, where an
    option adds it: the model has a part the config does not name."""
    option = next((option for pattern, option in ADDS if re.fullmatch(pattern, key)), None)
    if option is None:
        return None
    return NotExpressible(
        f"the model has a part the config does not name:\n  the mapping reads {key}: {option} expresses it"
    )


class NotExpressible(UsageError):
    """The config names parts the model does not have (exit 2): the message has a line for each."""

    label = "the config cannot express this model"


def optional_parts(keys) -> bool:
    """Whether every canonical key of ``keys`` is a part some model leaves out (a bias, a token,
    the position table, a norm): a mapping that sends a weight matrix nowhere made a mistake."""
    return all(any(re.fullmatch(pattern, k) for pattern, _, _ in PARTS) for k in keys)


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
    for key in extra:  # a second classifier beside the head, a token beside the class token: DeiT's
        shape = tuple(shapes.get(key, ()))
        if shape in ((1, 1, config.embed_dim), (1, config.embed_dim), (config.num_classes, config.embed_dim)):
            found.setdefault(
                "it has a second token and head (DeiT's distillation token): distilled=true expresses it", []
            ).append(key)
    return found


def not_expressible(dropped: list[str], extra: list[str] = (), shapes=None, config=None) -> NotExpressible:
    """The answer for canonical keys with nowhere to go in the model: one line per part the model
    lacks, naming its keys (blocks folded) and the option that expresses it; ``extra``, the
    model's parameters no canonical key fills: the parts an option adds named (``extra_parts``,
    from the parameters' ``shapes``), the rest in a line of their own."""
    lines: dict[str, list[str]] = {}
    attn_out, mlp = (any(re.fullmatch(p, k) for k in dropped) for p, _, _ in PARTS[1:3])
    if attn_out and not mlp:  # timm's proj_bias drops both; the MLP's kept on their own
        lines["its attention output has no bias, its MLP has: proj_bias=false with mlp_bias=true expresses it"] = []
        dropped = [k for k in dropped if not re.fullmatch(PARTS[1][0], k)]
    elif attn_out and mlp:
        lines["its attention output and its MLP have no biases: proj_bias=false expresses it"] = []
        dropped = [k for k in dropped if not re.fullmatch(PARTS[1][0], k) and not re.fullmatch(PARTS[2][0], k)]
    if any(k.startswith("fc_norm.") for k in extra) and any(k.startswith("norm.") for k in dropped):
        # timm moves the final norm after the pooling under global_pool='avg' (fc_norm)
        what = "its final norm comes after the pooling (timm's fc_norm): fc_norm=true expresses it"
        lines[what] = [k for k in dropped if k.startswith("norm.")]
        dropped = [k for k in dropped if not k.startswith("norm.")]
        extra = [k for k in extra if not k.startswith("fc_norm.")]
    for key in dropped:
        lacks, option = next(
            ((lacks, option) for pattern, lacks, option in PARTS if re.fullmatch(pattern, key)),
            (f"it has no place for {key}", None),
        )
        what = f"{lacks}: " + (f"{option} expresses it" if option else "no option of the config expresses it yet")
        lines.setdefault(what, []).append(re.sub(r"blocks\.\d+\.", "blocks.{i}.", key))
    for what, keys in extra_parts(extra, shapes or {}, config).items():
        lines[what] = keys
        extra = [k for k in extra if k not in keys]
    if extra:
        lines["and it has parameters no canonical key fills"] = [re.sub(r"\.\d+\.", ".{i}.", k) for k in extra]
    body = "\n".join(
        f"  {what}" + (f" ({', '.join(dict.fromkeys(keys))})" if keys else "") for what, keys in lines.items()
    )
    return NotExpressible(f"canonical keys have nowhere to go in the model (or the mapping forgot them):\n{body}")
