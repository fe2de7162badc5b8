"""Which module (or record) each stage is read from, from where the mapping sends the weights."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from conformance.capture.mapping import common_module, module_of
from impls.config import ViTConfig, tap_names


@dataclass
class Source:
    """Where a tap is read: a module's input or output, the attention record of a block, or the
    model's return value; ``shape``: how to bring it to the tap's (B, ...) layout."""

    kind: str  # "in" | "out" | "attn" | "return"
    path: str = ""
    part: str = ""  # for "attn": q, k, v, weights; for a qkv projection: q, k, v
    shape: str = ""  # "", "patches", "heads", "qkv"
    block: int | None = None
    fallback: tuple[str, str] | None = None  # for q, k, v: ("heads", a q/k/v projection) or ("qkv", fused)


@dataclass
class Plan:
    sources: dict[str, Source] = field(default_factory=dict)
    unseen: dict[str, str] = field(default_factory=dict)
    blocks: dict[str, int] = field(default_factory=dict)

    def watch(self) -> dict[str, tuple[bool, bool]]:
        out: dict[str, list[bool]] = {p: [True, True] for p in self.blocks}
        for s in self.sources.values():
            if s.kind in ("in", "out"):
                w = out.setdefault(s.path, [False, False])
                w[0 if s.kind == "in" else 1] = True
            if s.fallback is not None:
                out.setdefault(s.fallback[1], [False, False])[1] = True
        return {p: (w[0], w[1]) for p, w in out.items()}


# Framework attention modules that project q, k, v and the output themselves: their output is
# the attention stage (``attn``), and what they compute inside is read where the framework shows it.
ATTENTION_MODULES = {
    "MultiheadAttention": "torch.nn.MultiheadAttention: in_proj_weight (fused qkv, or q/k/v_proj_weight), "
                          "in_proj_bias, out_proj (used by the module directly, never called)",
    "MultiHeadAttention": "mlx.nn.MultiHeadAttention (query_proj, key_proj, value_proj, out_proj) or "
                          "flax.nnx.MultiHeadAttention (query, key, value, out: LinearGeneral)",
    "MultiHeadDotProductAttention": "flax.linen.MultiHeadDotProductAttention (query, key, value, out: DenseGeneral)",
}


# Child modules whose parameters their parent uses directly (they are never called themselves).
_USED_BY_PARENT = {"MultiheadAttention": ("out_proj",)}


def kind_name(module) -> str:
    return module if isinstance(module, str) else type(module).__name__


def caller(path: str, modules: Mapping[str, Any]) -> str:
    """The module that uses ``path``'s parameters: itself, or its parent where the parent reads
    them directly (torch's MultiheadAttention and its out_proj)."""
    parent, _, leaf = path.rpartition(".")
    if parent in modules and leaf in _USED_BY_PARENT.get(kind_name(modules[parent]), ()):
        return parent
    return path


class TapOverrideError(ValueError):
    """A ``taps=`` / ``--tap`` entry that names no stage or no module: a usage error."""


def _override(spec: str) -> Source:
    path, _, side = spec.partition(":")
    if side not in ("", "in", "out"):
        raise TapOverrideError(f"tap override {spec!r}: the side after ':' must be 'in' or 'out'")
    return Source("in" if side == "in" else "out", path)


def infer_plan(config: ViTConfig, key_map: Mapping[str, list[str]], modules: Mapping[str, Any],
               overrides: Mapping[str, str] | None = None, has_head: bool = True) -> Plan:
    """Which module (or record) each tap is read from, from where the mapping sends the weights."""
    plan = Plan()

    def owners(canonical_module: str) -> list[str]:
        """The model modules that receive a canonical module's weights, in the order of the rows
        they receive (so a split qkv gives its q, k, v projections in that order)."""
        keys = [k for k in key_map if module_of(k) == canonical_module]
        return list(dict.fromkeys(module_of(m) for k in sorted(keys, reverse=True) for m in key_map[k]))

    def one(canonical_module: str, stage: str) -> str | None:
        found = [caller(m, modules) for m in owners(canonical_module)]
        if len(found) == 1 and found[0] in modules:
            return found[0]
        plan.unseen[stage] = (f"no module of its own holds {canonical_module}'s weights" if not found else
                              f"{canonical_module}'s weights go to {len(found)} modules ({', '.join(found)})"
                              if len(found) > 1 else f"{canonical_module}'s weights sit in {found[0] or 'the root'}, "
                              "not a submodule that is called")
        return None

    def put(stage, source):
        if source is not None and stage not in plan.unseen:
            plan.sources[stage] = source

    m = one("patch_embed.proj", "patch_embed")
    put("patch_embed", Source("out", m, shape="patches") if m is not None else None)
    block_paths = []
    for i in range(config.depth):
        keys = [k for k in key_map if k.startswith(f"blocks.{i}.")]
        path = common_module({module_of(mk) for k in keys for mk in key_map[k]})
        block_paths.append(path if path and path in modules else None)
    if len(set(block_paths)) != len(block_paths):
        block_paths = [None] * config.depth  # blocks share a module: the weights are not per block
    plan.blocks = {p: i for i, p in enumerate(block_paths) if p is not None}
    if config.pre_norm:
        m = one("norm_pre", "norm_pre")
        put("norm_pre", m and Source("out", m))
        put("embed", m and Source("in", m))
        if m is None:
            plan.unseen["embed"] = plan.unseen["norm_pre"]
    elif block_paths and block_paths[0] is not None:
        plan.sources["embed"] = Source("in", block_paths[0])
    else:
        plan.unseen["embed"] = "no module holds block 0's weights alone, so its input cannot be read"
    for i in range(config.depth):
        b = f"blocks.{i}"
        for part in ("norm1", "norm2"):
            m = one(f"{b}.{part}", f"{b}.{part}")
            put(f"{b}.{part}", m and Source("out", m))
        qkv = owners(f"{b}.attn.qkv")
        for n, part in enumerate("qkv"):
            if block_paths[i] is None:
                plan.unseen[f"{b}.attn.{part}"] = "the block has no module of its own"
            elif len(qkv) == 1 and kind_name(modules.get(qkv[0])) in ATTENTION_MODULES:
                # the attention module projects q, k and v itself: its output is the attention's
                plan.sources[f"{b}.attn.{part}"] = Source("attn", part=part, block=i)
            elif len(qkv) == 3:  # separate q, k, v projections, in q, k, v order (see key_map)
                plan.sources[f"{b}.attn.{part}"] = Source("attn", part=part, block=i, fallback=("heads", qkv[n]))
            elif len(qkv) == 1:
                plan.sources[f"{b}.attn.{part}"] = Source("attn", part=part, block=i, fallback=("qkv", qkv[0]))
            else:
                plan.sources[f"{b}.attn.{part}"] = Source("attn", part=part, block=i)
        if config.qk_norm:  # the attention call sees the normalised q and k; the projections' are the norms' inputs
            for part in "qk":
                m = one(f"{b}.attn.{part}_norm", f"{b}.attn.{part}_norm")
                put(f"{b}.attn.{part}", m and Source("in", m, shape="heads"))
                put(f"{b}.attn.{part}_norm", m and Source("out", m, shape="heads"))
                if m is None:
                    plan.unseen[f"{b}.attn.{part}"] = plan.unseen[f"{b}.attn.{part}_norm"]
        for ls in ("ls1", "ls2") if config.init_values is not None else ():
            m = one(f"{b}.{ls}", f"{b}.{ls}")
            put(f"{b}.{ls}", m and Source("out", m))
        if block_paths[i] is not None:
            plan.sources[f"{b}.attn.weights"] = Source("attn", part="weights", block=i)
        else:
            plan.unseen[f"{b}.attn.weights"] = "the block has no module of its own"
        m = one(f"{b}.attn.proj", f"{b}.attn")
        put(f"{b}.attn", m and Source("out", m))
        m = one(f"{b}.mlp.fc2", f"{b}.mlp")
        put(f"{b}.mlp", m and Source("out", m))
        if m:
            plan.sources[f"{b}.mlp.act"] = Source("in", m)
        else:
            plan.unseen[f"{b}.mlp.act"] = plan.unseen[f"{b}.mlp"]
        if block_paths[i] is not None:
            plan.sources[b] = Source("out", block_paths[i])
        else:
            plan.unseen[b] = "no module holds this block's weights alone"
    if not config.use_fc_norm:
        m = one("norm", "norm")
        put("norm", m and Source("out", m))
    if config.global_pool == "map":
        keys = [k for k in key_map if k.startswith("attn_pool.")]
        pool = common_module({module_of(mk) for k in keys for mk in key_map[k]})
        if pool and pool in modules:
            plan.sources["attn_pool"] = Source("out", pool)
        else:
            plan.unseen["attn_pool"] = "no module of its own holds the attention pool's weights"
        for stage, owner in (("attn_pool.proj", "attn_pool.proj"), ("attn_pool.norm", "attn_pool.norm"),
                             ("attn_pool.mlp", "attn_pool.mlp.fc2")):
            m = one(owner, stage)
            put(stage, m and Source("out", m))
            if stage == "attn_pool.mlp":
                put("attn_pool.mlp.act", m and Source("in", m))
                if m is None:
                    plan.unseen["attn_pool.mlp.act"] = plan.unseen[stage]
        for part in ("q", "k", "v", "weights"):
            plan.unseen[f"attn_pool.{part}"] = "inside the attention pool: its q, k, v and weights are not read yet"
    if has_head:
        m = one("head", "pooled")
        put("pooled", m and Source("in", m))
        plan.sources["logits"] = Source("return")
    elif not config.num_classes:  # headless (timm's num_classes=0): the output is the pooled features
        plan.sources["pooled"] = Source("return", part="pooled")
        plan.sources["logits"] = Source("return")
    else:
        plan.unseen["pooled"] = plan.unseen["logits"] = "the model has no classifier head (the mapping drops head)"
    for pattern, spec in (overrides or {}).items():
        for i in range(config.depth) if "{i}" in pattern else [None]:
            stage = pattern.replace("{i}", str(i)) if i is not None else pattern
            if stage not in tap_names(config):
                raise TapOverrideError(f"tap override {pattern!r}: {stage!r} is not a stage of this config "
                                 "(see impls.tap_names)")
            src = _override(spec.replace("{i}", str(i)) if i is not None else spec)
            if src.path not in modules:
                raise TapOverrideError(f"tap override {pattern!r}: the model has no module {src.path!r}")
            if stage.endswith(("attn.q", "attn.k", "attn.v")):
                src.shape = "heads"
            plan.sources[stage] = src
            plan.unseen.pop(stage, None)
    return plan
