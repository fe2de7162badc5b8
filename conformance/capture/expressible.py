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
    (
        r"blocks\.\d+\.(attn\.proj|mlp\.fc[12](_[gx])?)\.bias",
        "its attention output or MLP projections have no bias",
        "proj_bias=false (drops the attention output's and the MLP's biases together)",
    ),
    (r"(blocks\.\d+\.norm[12]|norm|fc_norm|norm_pre)\.bias", "its LayerNorms have no bias (a bias-free norm)", None),
    (r"cls_token", "it has no class token", "class_token=false (with global_pool='avg')"),
    (r"reg_token", "it has no register tokens", "reg_tokens=0"),
    (r"pos_embed", "it has no learned position table (a fixed one computed from the grid, or none)", None),
    (
        r"patch_embed\.proj\.bias",
        "its patch embedding has no bias",
        "pre_norm=true (CLIP: with a norm after the embedding)",
    ),
    (r"blocks\.\d+\.ls[12]\.gamma", "its residual branches have no LayerScale", "init_values=null"),
    (r"blocks\.\d+\.attn\.[qk]_norm\.(weight|bias)", "it normalises neither q nor k", "qk_norm=false"),
    (r"(norm|fc_norm)\.weight", "it has no final norm", None),
)


class NotExpressible(UsageError):
    """The config names parts the model does not have (exit 2): the message has a line for each."""

    label = "the config cannot express this model"


def optional_parts(keys) -> bool:
    """Whether every canonical key of ``keys`` is a part some model leaves out (a bias, a token,
    the position table, a norm): a mapping that sends a weight matrix nowhere made a mistake."""
    return all(any(re.fullmatch(pattern, k) for pattern, _, _ in PARTS) for k in keys)


def not_expressible(dropped: list[str], extra: list[str] = ()) -> NotExpressible:
    """The answer for canonical keys with nowhere to go in the model: one line per part the model
    lacks, naming its keys (blocks folded) and the option that expresses it; ``extra``, the
    model's parameters no canonical key fills, in a line of their own."""
    lines: dict[str, list[str]] = {}
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
    if extra:
        lines["and it has parameters no canonical key fills"] = [re.sub(r"\.\d+\.", ".{i}.", k) for k in extra]
    body = "\n".join(f"  {what} ({', '.join(dict.fromkeys(keys))})" for what, keys in lines.items())
    return NotExpressible(f"canonical keys have nowhere to go in the model (or the mapping forgot them):\n{body}")
