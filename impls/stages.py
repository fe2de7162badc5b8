"""The model's stages, defined once: the table every consumer reads.

A stage is an intermediate result every port can emit (a "tap"), in the order the model
computes it. Its entry says what the rest of the project needs to know about it:

| field | meaning | read by |
|---|---|---|
| ``name`` | the stage's name in its scope (``norm1`` in ``blocks.{i}``, ``q`` in ``attn_pool``) | every consumer |
| ``kind`` | the calibrated tolerance's stage kind | compare, tolerances, calibrate |
| ``inputs`` | the stages it is computed from (patterns, below) | the error model's local checks |
| ``shape`` | its shape, in symbols (``B N D``, ``B H N hd``) | ``tap_shapes`` |
| ``when`` | the config option that makes it exist | ``tap_names`` |
| ``params`` | the canonical weights its operation uses (relative to its scope) | gradients (backward order) |
| ``contraction`` | it contracts (a matmul, the patch conv, q kᵀ, P v): its operands may be in a lower dtype than its output | mixed precision |
| ``residual`` | it is the residual stream or a LayerNorm of it: torch.autocast keeps it in float32 | ``verify --policy autocast`` |
| ``cotangent`` | the contraction length of its consumer's backward (gradients' rounding model) | gradients |
| ``op`` | the operation where stages share one, of its one input with its ``params[0]``'s weight and bias: ``norm``, the model's norm (``norm_layer``); ``layer_norm``, a LayerNorm whatever the model's | the error model (``conformance.numerics.evaluate``) |
| ``capture`` | where a model as its author wrote it shows the stage (rules below) | ``conformance.capture.plan`` |
| ``timm`` | where timm's ``VisionTransformer`` shows it (default ``out:`` its own name) | ``conformance.references`` |

Capture rules, in the canonical (timm) module names the user's mapping sends weights to:
``out:M`` / ``in:M`` the output / input of the model module that receives canonical module
``M``'s weights (``@patches``: a convolution's output brought to tokens, ``@heads``: split into
heads, ``@patch_order``: a patch vector's features brought from the model's order to (c p1 p2)); ``in:next`` the input of the first block (or of ``norm_pre``); ``attn:PART`` q, k, v or
the weights as the block's attention computes them (a fused call's arguments, q kᵀ's operands,
the softmax's output; failing those, the projections' outputs), or ``bias``, what it adds to
its logits (the output of a module holding the table alone, else a fused call's float mask);
``block`` the smallest module
holding all the block's weights; ``pool`` the attention pool's module; ``head`` the input of
the head (a headless model's output); ``return`` what the model returns; ``unseen:REASON``.

timm rules, in timm's module names relative to the stage's scope (the model, ``blocks[i]``,
``attn_pool``), read by forward hooks: ``out:M`` / ``in:M`` as above (``out:`` the scope's own
module; ``@tokens`` an NHWC output flattened, ``@v`` the value part of a fused projection, split
into heads); ``softmax`` the softmax called inside the scope; ``typed:I`` the I-th tensor the
scope's attention casts with ``type_as`` (timm's Eva: its rotated q, then k); ``values`` the
second operand of its attention's P v (Eva computes its q, k and v in no module of their own);
``added`` the second operand of the first sum in its attention (timm's Beit: the bias it adds
to the logits, (1, H, N, N), broadcast over the batch); ``return`` the model's output.

Input patterns: ``{b}`` the stage's block (``blocks.3``); ``{prev}`` the block's input (the
previous block, or ``norm_pre`` / ``embed`` before block 0); ``{q}``, ``{k}`` q and k as the
attention weights see them (``attn.q_rope`` with rotary embeddings, else ``attn.q_norm`` with
qk-norm); ``{q_in}``, ``{k_in}`` what the rotation reads (``attn.q_norm`` with qk-norm);
``{mlp_in}`` what fc2 reads (``mlp.norm`` with ``scale_mlp``); ``{attn_out}``, ``{mlp_out}`` what a residual adds (``ls1``/``ls2`` with LayerScale); ``{features}`` the tokens the head pools (the
final norm, or the last block with fc_norm); ``{pool_in}`` what ``pooled`` reads;
``{patch_in}`` what the projection reads (the patch norm, or the images); ``{patches}`` the patch
embedding's output (``patch_embed.norm`` with ``embed_norm``); ``{dist}`` the distillation
token's features (``distilled``); ``{bias}`` what the logits add (BEiT's ``attn.rel_pos_bias``,
or SAM's ``attn.rel_pos``). Shape symbols ``Bw`` and ``Nw`` are a windowed block's windows and
each window's tokens (``tap_symbols``), B and N elsewhere.

Adding a stage is one entry here, its math in ``conformance.numerics.error_model.evaluate``, a tap in
each of the four ports, and its capture rule (docs/model.md, "Adding a stage").
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from operator import attrgetter
from typing import Callable

from impls.windows import num_windows
from weights.config import ViTConfig


def _always(config: ViTConfig) -> bool:
    return True


@dataclass(frozen=True)
class Stage:
    name: str
    kind: str
    inputs: tuple[str, ...]
    shape: str
    scope: str = ""  # "", "block" (blocks.{i}.name) or "attn_pool"
    when: Callable[[ViTConfig], bool] = _always
    params: tuple[str, ...] = ()
    contraction: bool = False
    residual: bool = False
    cotangent: str = "1"  # a symbol of the config, or "1": a sum or a selection, one rounding
    op: str = ""  # "norm" (the model's norm_layer) or "layer_norm" of its one input, its params[0]'s (``evaluate``)
    capture: str | Callable[[ViTConfig], str] = ""  # where a model as written shows it (``capture_rule``)
    timm: str = ""  # where timm's VisionTransformer shows it (``timm_rule``)
    note: str = ""  # what it is, for docs/model.md

    def timm_rule(self) -> str:
        return self.timm or f"out:{self.name}"

    def capture_rule(self, config: ViTConfig) -> str:
        return self.capture(config) if callable(self.capture) else self.capture

    def full_name(self, i: int | None = None) -> str:
        if self.scope == "block":
            return f"blocks.{i}.{self.name}" if self.name else f"blocks.{i}"
        if self.scope == "attn_pool":
            return f"attn_pool.{self.name}" if self.name else "attn_pool"
        return self.name


# the stages' conditions that are a config field as it is
_pre_norm = attrgetter("pre_norm")
_qk_norm = attrgetter("qk_norm")
_rel_pos_bias = attrgetter("rel_pos_bias")
_use_rel_pos = attrgetter("use_rel_pos")
_scale_mlp = attrgetter("scale_mlp")
_final_norm = attrgetter("use_final_norm")
_distilled = attrgetter("distilled")
_patch_norm = attrgetter("patch_norm")
_embed_norm = attrgetter("embed_norm")


def _layer_scale(c):
    return c.init_values is not None


def _rope(c):
    return c.rope_type is not None


def _map(c):
    return c.global_pool == "map"


def _before_rotation(c, part: str) -> str:
    """q or k as projected: what the attention reads, unless a norm or a rotation comes between
    (then qk-norm's input, or the projection's own output)."""
    if c.qk_norm or (c.rope_type and c.qkv_fused):
        return f"in:attn.{part}_norm@heads"
    return f"out:attn.{part}_proj@heads" if c.rope_type else f"attn:{part}"


_POOL_INSIDE = "unseen:inside the attention pool: its q, k, v and weights are not read yet"

# A table: one entry per row (the formatter would give each argument a line).
# fmt: off
MODEL_IN = (
    Stage("patch_embed.patch_norm", "patch_embed.patch_norm", (), "B P patch", when=_patch_norm,
          params=("patch_embed.patch_norm",), cotangent="D", capture="out:patch_embed.patch_norm@patch_order",
          note="each raw patch flattened (c p1 p2), normalised"),
    Stage("patch_embed", "patch_embed", ("{patch_in}",), "B P D", params=("patch_embed.proj",), contraction=True,
          cotangent="embed_in", capture="out:patch_embed.proj@patches",
          timm="in:patch_embed.norm@tokens",
          note='the projection, before prefix tokens and position'),
    Stage("patch_embed.norm", "patch_embed.norm", ("patch_embed",), "B P D", when=_embed_norm,
          params=("patch_embed.norm",), capture="out:patch_embed.norm", note="timm's `embed_norm_layer`", op="norm"),
    Stage("embed", "embed", ("{patches}",), "B N D", params=("pos_embed", "cls_token", "dist_token", "reg_token"),
          residual=True,
          cotangent="D", capture="in:next", timm="in:norm_pre",
          note='after prefix tokens and position; N = prefix tokens + P'),
    Stage("norm_pre", "norm_pre", ("embed",), "B N D", when=_pre_norm, params=("norm_pre",), residual=True,
          cotangent="D", capture="out:norm_pre", op="norm"),
)
BLOCK = (
    Stage("norm1", "norm1", ("{prev}",), "B N D", "block", params=("norm1",), residual=True, cotangent="3D",
          capture="out:norm1", op="norm"),
    Stage("attn.q", "attn.q", ("{b}.norm1",), "Bw H Nw hd", "block", params=("attn.qkv", "attn.q_bias", "attn.q_proj"),
          contraction=True,
          cotangent="qk", capture=lambda c: _before_rotation(c, "q"),
          timm="in:attn.q_norm",
          note='split from `qkv`, q before scaling'),
    Stage("attn.k", "attn.k", ("{b}.norm1",), "Bw H Nw hd", "block", params=("attn.k_proj",), contraction=True,
          cotangent="qk",
          capture=lambda c: _before_rotation(c, "k"), timm="in:attn.k_norm"),
    Stage("attn.v", "attn.v", ("{b}.norm1",), "Bw H Nw hd", "block", params=("attn.v_bias", "attn.v_proj"),
          contraction=True, cotangent="N", capture="attn:v",
          timm="values"),
    Stage("attn.q_norm", "attn.q_norm", ("{b}.attn.q",), "Bw H Nw hd", "block", _qk_norm, ("attn.q_norm",),
          cotangent="qk_out", capture="out:attn.q_norm@heads", op="layer_norm"),
    Stage("attn.k_norm", "attn.k_norm", ("{b}.attn.k",), "Bw H Nw hd", "block", _qk_norm, ("attn.k_norm",),
          cotangent="qk_out", capture="out:attn.k_norm@heads", op="layer_norm"),
    Stage("attn.q_rope", "attn.q_rope", ("{q_in}",), "B H N hd", "block", _rope, cotangent="N", capture="attn:q",
          timm="typed:0", note="q turned by its position (the prefix tokens as they are; timm's Eva)"),
    Stage("attn.k_rope", "attn.k_rope", ("{k_in}",), "B H N hd", "block", _rope, cotangent="N", capture="attn:k",
          timm="typed:1"),
    Stage("attn.rel_pos_bias", "attn.rel_pos_bias", (), "B H N N", "block", _rel_pos_bias,
          ("attn.relative_position_bias_table",), capture="attn:bias", timm="added",
          note="BEiT's bias, the table's row at each (query, key) pair's relative position (timm's Beit)"),
    Stage("attn.rel_pos", "attn.rel_pos", ("{q_in}",), "Bw H Nw Nw", "block", _use_rel_pos,
          ("attn.rel_pos_h", "attn.rel_pos_w"), contraction=True, capture="attn:bias", timm="added",
          note="SAM's decomposed relative positions: q's products with rel_pos_h's and rel_pos_w's rows at each "
          "key's row and column offsets, summed (timm's VisionTransformerSAM)"),
    Stage("attn.weights", "attn.weights", ("{q}", "{k}", "{bias}"), "Bw H Nw Nw", "block", contraction=True, cotangent="hd",
          capture="attn:weights", timm="out:attn.attn_drop",
          note='softmax over the last axis'),
    Stage("attn", "attn", ("{b}.attn.weights", "{b}.attn.v"), "Bw Nw D", "block", params=("attn.proj",),
          contraction=True, capture="out:attn.proj",
          note='after `proj`'),
    Stage("ls1", "ls1", ("{b}.attn",), "Bw Nw D", "block", _layer_scale, ("ls1",), capture="out:ls1",
          note='`attn * gamma`'),
    Stage("norm2", "norm2", ("{prev}", "{attn_out}"), "B N D", "block", params=("norm2",), residual=True,
          cotangent="hidden", capture="out:norm2"),
    Stage("mlp.act", "mlp.act", ("{b}.norm2",), "B N act", "block",
          params=("mlp.fc1", "mlp.fc1_g", "mlp.fc1_x"), contraction=True, cotangent="mlp_act",
          capture=lambda c: "in:mlp.norm" if c.scale_mlp else "in:mlp.fc2", timm="in:mlp.norm",
          note="the activation, or SwiGLU's `act(gate) * value`: fc2's input without `scale_mlp`"),
    Stage("mlp.norm", "mlp.norm", ("{b}.mlp.act",), "B N act", "block", _scale_mlp, ("mlp.norm",), cotangent="D",
          capture="out:mlp.norm", note="EVA02's norm over the hidden features (timm's Eva `scale_mlp`)", op="layer_norm"),
    Stage("mlp", "mlp", ("{mlp_in}",), "B N D", "block", params=("mlp.fc2",), contraction=True,
          capture="out:mlp.fc2"),
    Stage("ls2", "ls2", ("{b}.mlp",), "B N D", "block", _layer_scale, ("ls2",), capture="out:ls2"),
    Stage("", "block", ("{prev}", "{attn_out}", "{mlp_out}"), "B N D", "block", residual=True, cotangent="D",
          capture="block",
          note='the block output'),
)
MODEL_OUT = (
    Stage("norm", "norm", ("{last}",), "B N D", when=_final_norm, params=("norm",), residual=True, capture="out:norm", op="norm"),
    Stage("q", "attn_pool.q", (), "B Hp 1 hdp", "attn_pool", _map, ("latent", "q"), contraction=True,
          cotangent="Np", capture=_POOL_INSIDE, timm="in:q_norm"),
    Stage("k", "attn_pool.k", ("{features}",), "B Hp Np hdp", "attn_pool", _map, ("kv",), contraction=True,
          capture=_POOL_INSIDE, timm="in:k_norm"),
    Stage("v", "attn_pool.v", ("{features}",), "B Hp Np hdp", "attn_pool", _map, contraction=True, capture=_POOL_INSIDE,
          timm="out:kv@v"),
    Stage("weights", "attn_pool.weights", ("attn_pool.q", "attn_pool.k"), "B Hp 1 Np", "attn_pool", _map,
          contraction=True, cotangent="hd", capture=_POOL_INSIDE, timm="softmax"),
    Stage("proj", "attn_pool.proj", ("attn_pool.weights", "attn_pool.v"), "B 1 D", "attn_pool", _map, ("proj",),
          contraction=True, cotangent="D", capture="out:proj"),
    Stage("norm", "attn_pool.norm", ("attn_pool.proj",), "B 1 D", "attn_pool", _map, ("norm",), cotangent="mlp",
          capture="out:norm", op="layer_norm"),
    Stage("mlp.act", "attn_pool.mlp.act", ("attn_pool.norm",), "B 1 mlp", "attn_pool", _map, ("mlp.fc1",),
          contraction=True, cotangent="D", capture="in:mlp.fc2", timm="in:mlp.fc2"),
    Stage("mlp", "attn_pool.mlp", ("attn_pool.mlp.act",), "B 1 D", "attn_pool", _map, ("mlp.fc2",), contraction=True,
          capture="out:mlp.fc2"),
    Stage("", "attn_pool", ("attn_pool.proj", "attn_pool.mlp"), "B D", "attn_pool", _map, cotangent="D",
          capture="pool",
          note="the latent's output"),
    Stage("pooled", "pooled", ("{pool_in}",), "B D", params=("fc_norm",), cotangent="classes", capture="head",
          timm="in:head",
          note="the head's input (after `fc_norm` where there is one)"),
    Stage("pooled_dist", "pooled_dist", ("{features}",), "B D", when=_distilled, cotangent="classes",
          capture="in:head_dist", timm="in:head_dist", note="the distillation token: head_dist's input"),
    Stage("logits", "logits", ("pooled", "{dist}"), "B classes", params=("head", "head_dist"), contraction=True,
          capture="return", timm="return", note="with `distilled`: the mean of head's and head_dist's"),
)
# fmt: on
STAGES = MODEL_IN + BLOCK + MODEL_OUT
BY_KIND = {s.kind: s for s in STAGES}


def block_taps(config: ViTConfig) -> tuple[str, ...]:
    """The stages inside each block for ``config``, in order ('' is the block's output)."""
    return tuple(s.name for s in BLOCK if s.when(config))


def tap_names(config: ViTConfig) -> list[str]:
    """The stages every port can emit, in the order the model computes them."""
    names = [s.name for s in MODEL_IN if s.when(config)]
    for i in range(config.depth):
        names += [s.full_name(i) for s in BLOCK if s.when(config)]
    return names + [s.full_name() for s in MODEL_OUT if s.when(config)]


def stage_of(name: str) -> tuple[Stage, int | None]:
    """The table's entry for a stage name, and its block index (None outside the blocks)."""
    if name.startswith("blocks."):
        _, i, *rest = name.split(".", 2)
        return BY_KIND[rest[0] if rest else "block"], int(i)
    return BY_KIND[name], None


def stage_kind(name: str) -> str:
    """'blocks.3.attn.q' -> 'attn.q', 'blocks.3' -> 'block', 'logits' -> 'logits'."""
    return stage_of(name)[0].kind


def tap_symbols(config: ViTConfig, batch: int, patches: int | None = None, block: int | None = None) -> dict[str, int]:
    """Each shape symbol's size for a batch of ``batch`` (``patches`` a row's patches where they are
    not the config's grid's: a packed batch's padded rows); in ``block``, if it attends in windows,
    ``Bw`` and ``Nw`` (otherwise ``B`` and ``N``) are its windows' count and tokens."""
    patches = config.num_patches if patches is None else patches
    tokens = patches + config.num_prefix_tokens
    w = 0 if block is None else config.block_window(block)
    return {
        "B": batch,
        "N": tokens,
        "Bw": batch * num_windows(config.grid_size, w) if w else batch,
        "Nw": w * w if w else tokens,
        "D": config.embed_dim,
        "H": config.num_heads,
        "hd": config.head_dim,
        "P": patches,
        "Hp": config.pool_num_heads,
        "hdp": config.embed_dim // config.pool_num_heads,
        "Np": tokens - config.pool_skip,  # what the pool reads
        "act": config.mlp_act_dim,
        "patch": config.patch_dim,
        "mlp": config.mlp_hidden_dim,
        "classes": config.num_features,
        "1": 1,
    }


def tap_shapes(config: ViTConfig, batch: int, img_size=None) -> dict[str, tuple[int, ...]]:
    """The shape each tap must have for a batch of ``batch`` images (of ``img_size``, which
    only a dynamic_img_size config takes other than its own)."""
    config = config if img_size is None else config.at_img_size(img_size)
    shapes = {}
    for name in tap_names(config):
        stage, i = stage_of(name)
        symbols = tap_symbols(config, batch, block=i)
        shapes[name] = tuple(symbols[s] for s in stage.shape.split())
    return shapes


@lru_cache(maxsize=4096)  # read for every stage of every noisy run
def stage_inputs(name: str, config: ViTConfig) -> tuple[str, ...]:
    """The taps a stage is computed from (the images are always there)."""
    stage, i = stage_of(name)
    b = f"blocks.{i}"
    if i is not None:
        prev = f"blocks.{i - 1}" if i else ("norm_pre" if config.pre_norm else "embed")
    else:
        prev = None
    last = f"blocks.{config.depth - 1}"
    features = "norm" if config.use_final_norm else last
    qk_in = (f"{b}.attn.q_norm", f"{b}.attn.k_norm") if config.qk_norm else (f"{b}.attn.q", f"{b}.attn.k")
    qk = (f"{b}.attn.q_rope", f"{b}.attn.k_rope") if config.rope_type else qk_in
    scaled = config.init_values is not None
    values = {
        "{b}": b,
        "{prev}": prev,
        "{q_in}": qk_in[0],
        "{k_in}": qk_in[1],
        "{q}": qk[0],
        "{k}": qk[1],
        "{last}": last,
        "{features}": features,
        "{attn_out}": f"{b}.ls1" if scaled else f"{b}.attn",
        "{mlp_out}": f"{b}.ls2" if scaled else f"{b}.mlp",
        "{mlp_in}": f"{b}.mlp.norm" if config.scale_mlp else f"{b}.mlp.act",
        "{pool_in}": "attn_pool" if config.global_pool == "map" else features,
        "{patch_in}": "patch_embed.patch_norm" if config.patch_norm else "",
        "{patches}": "patch_embed.norm" if config.embed_norm else "patch_embed",
        "{dist}": "pooled_dist" if config.distilled else "",
        "{bias}": f"{b}.attn.rel_pos_bias"
        if config.rel_pos_bias
        else f"{b}.attn.rel_pos"
        if config.use_rel_pos
        else "",
    }

    def resolve(pattern: str) -> str:
        for key, value in values.items():
            if key in pattern:
                pattern = pattern.replace(key, value)
        return pattern

    return tuple(r for r in (resolve(p) for p in stage.inputs) if r)  # "": the images


def cotangent_length(name: str, config: ViTConfig, tokens: int | None = None) -> int:
    """K of the backward contraction that produces the cotangent at ``name``: its consumer's
    (gradients' rounding model); 1 for a sum or a selection. ``tokens``: at the images' grid."""
    stage, i = stage_of(name)
    tokens = config.num_tokens if tokens is None else tokens
    w = 0 if i is None else config.block_window(i)
    tokens = w * w if w else tokens  # the keys a query meets: its window's
    hidden = config.mlp_act_dim if config.mlp_layer == "mlp" else 2 * config.mlp_act_dim
    lengths = {
        "1": 1,
        "D": config.embed_dim,
        "embed_in": config.embed_dim if config.embed_norm else 1,  # patch_embed.norm's, or the sum's
        "3D": 3 * config.embed_dim,
        "N": tokens,
        "hd": config.head_dim,
        # q's and k's consumer: qk-norm (over head_dim), the rotation (two products' sum), or q kᵀ
        "qk": config.head_dim if config.qk_norm else (2 if config.rope_type else tokens),
        "qk_out": 2 if config.rope_type else tokens,
        "mlp_act": config.mlp_act_dim if config.scale_mlp else config.embed_dim,  # mlp.norm's, or fc2's
        "hidden": hidden,
        "Np": tokens - config.pool_skip,
        "mlp": config.mlp_hidden_dim,
        "classes": max(config.num_classes, 1),
    }
    return lengths[stage.cotangent]


# Parameters every block reads: their gradient is whole where the backward reaches the first block
SHARED_PARAMS = {"rope.freqs": "blocks.0.attn.q_rope"}  # RoPE-Mixed's frequencies


def param_stage(key: str) -> str:
    """The stage whose operation uses the canonical parameter ``key``: its gradient is computed
    when the backward reaches that stage's output (a fused qkv at q, the first of the three in
    backward order to have all three cotangents; a parameter of every block at the first's)."""
    if key in SHARED_PARAMS:
        return SHARED_PARAMS[key]
    if key.startswith("blocks."):
        _, i, rest = key.split(".", 2)
        scope, entries = f"blocks.{i}", BLOCK
    elif key.startswith("attn_pool."):
        rest, scope, entries = key[len("attn_pool.") :], "attn_pool", [s for s in MODEL_OUT if s.scope == "attn_pool"]
    else:
        rest, scope, entries = key, "", [s for s in STAGES if not s.scope]
    for stage in entries:
        for prefix in stage.params:
            if rest == prefix or rest.startswith(prefix + "."):
                return f"{scope}.{stage.name}".strip(".") if scope else stage.name
    raise KeyError(f"no stage uses the parameter {key!r} (impls.stages)")


# The option each ``when`` stands for (docs/model.md's table).
OPTIONS = {
    _always: "",
    _pre_norm: "`pre_norm`",
    _qk_norm: "`qk_norm`",
    _layer_scale: "`init_values`",
    _rope: "`rope_type`",
    _rel_pos_bias: "`rel_pos_bias`",
    _use_rel_pos: "`use_rel_pos`",
    _scale_mlp: "`scale_mlp`",
    _final_norm: "`final_norm`, no `fc_norm`",
    _map: '`global_pool="map"`',
    _patch_norm: "`patch_norm`",
    _embed_norm: "`embed_norm`",
    _distilled: "`distilled`",
}

CONTRACTIONS = frozenset(s.kind for s in STAGES if s.contraction)
RESIDUAL = frozenset(s.kind for s in STAGES if s.residual)
