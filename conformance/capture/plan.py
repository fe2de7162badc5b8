"""Which module (or record) each stage is read from, from where the mapping sends the weights."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from conformance.capture.mapping import common_module, module_of
from conformance.report import CannotJudge
from impls.protocol import ViTConfig, tap_names
from impls.stages import stage_of


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


CONTAINERS = ("ModuleList", "ModuleDict")  # torch's containers of modules, never called themselves


AFTER_TOWER = "out of scope: after the tower's output"  # a stage's unseen reason (capture.port reads it)


def infer_plan(
    config: ViTConfig,
    key_map: Mapping[str, list[str]],
    modules: Mapping[str, Any],
    overrides: Mapping[str, str] | None = None,
    has_head: bool = True,
    tower: str | None = None,
) -> Plan:
    """Which module (or record) each tap is read from, from where the mapping sends the weights:
    each stage's capture rule in the stage table (impls.stages) applied to this model; the stages
    after ``tower`` (a stage name: the tower's output) out of scope."""
    planner = _Planner(config, key_map, modules, has_head)
    plan = planner.plan
    names = tap_names(config)
    end = tower.replace("{last}", str(config.depth - 1)) if tower else tower  # the last block, whatever the depth
    if tower is not None and end not in names:
        raise CannotJudge(f"ModelPort(tower={tower!r}) names no stage of this config: one of {', '.join(names)}")
    after = names[names.index(end) + 1 :] if tower else []
    for name in names:
        if name in after:  # what the model adds after the tower (a merger, a projector, a head)
            plan.unseen[name] = f"{AFTER_TOWER}, {end} (ModelPort(tower={tower!r}))"
            continue
        found = planner.source(name)
        if found is not None and name not in plan.unseen:
            plan.sources[name] = found
    _apply_overrides(plan, config, modules, overrides or {})
    return plan


def _apply_overrides(plan: Plan, config: ViTConfig, modules: Mapping[str, Any], overrides: Mapping[str, str]) -> None:
    """``--tap STAGE=MODULE`` (``{i}`` for every block) over what the rules found."""
    for pattern, spec in overrides.items():
        for i in range(config.depth) if "{i}" in pattern else [None]:
            stage = pattern.replace("{i}", str(i)) if i is not None else pattern
            if stage not in tap_names(config):
                raise TapOverrideError(
                    f"tap override {pattern!r}: {stage!r} is not a stage of this config (see impls.tap_names)"
                )
            src = _override(spec.replace("{i}", str(i)) if i is not None else spec)
            if src.path not in modules:
                raise TapOverrideError(f"tap override {pattern!r}: the model has no module {src.path!r}")
            if stage.endswith(("attn.q", "attn.k", "attn.v")):
                src.shape = "heads"
            plan.sources[stage] = src
            plan.unseen.pop(stage, None)


class _Planner:
    """The stage table's capture rules applied to one model: where its mapping sends each
    canonical module's weights, and which of its modules is each block."""

    def __init__(self, config: ViTConfig, key_map: Mapping[str, list[str]], modules: Mapping[str, Any], has_head: bool):
        self.config, self.key_map, self.modules, self.has_head = config, key_map, modules, has_head
        self.plan = Plan()
        block_paths = []
        for i in range(config.depth):
            keys = [k for k in key_map if k.startswith(f"blocks.{i}.")]
            path = common_module({module_of(mk) for k in keys for mk in key_map[k]})
            block_paths.append(path if path and path in modules else None)
        if len(set(block_paths)) != len(block_paths):
            block_paths = [None] * config.depth  # blocks share a module: the weights are not per block
        self.block_paths = block_paths
        # A block held in a container that is never called (a ModuleList of [attention, feed-forward]
        # whose residuals the parent adds): its parts are the block's modules, its input the first
        # part's, its output the next block's input (or the final norm's).
        self.parts = {i: self._parts(p) for i, p in enumerate(block_paths) if p is not None and self._container(p)}
        self.plan.blocks = {p: i for i, p in enumerate(block_paths) if p is not None and i not in self.parts}
        self.plan.blocks.update({part: i for i, parts in self.parts.items() for part in parts})
        self.headless = (
            not has_head and not config.num_classes
        )  # timm's num_classes=0: the output is the pooled features

    def _container(self, path: str) -> bool:
        return kind_name(self.modules.get(path)) in CONTAINERS

    def _parts(self, path: str) -> list[str]:
        """A container block's children that hold its weights, in their order."""
        prefix = path + "."
        targets = (mk for mks in self.key_map.values() for mk in mks if mk.startswith(prefix))
        held = {mk[len(prefix) :].split(".")[0] for mk in targets} & {
            m[len(prefix) :] for m in self.modules if m.startswith(prefix)
        }
        return [prefix + c for c in sorted(held, key=lambda c: (not c.isdigit(), int(c) if c.isdigit() else 0, c))]

    def _block_input(self, i: int) -> Source | None:
        """Where block i's input is read: its module's input, or its first part's."""
        path = self.block_paths[i]
        if path is None:
            return None
        return Source("in", self.parts[i][0] if i in self.parts and self.parts[i] else path)

    def owners(self, canonical_module: str) -> list[str]:
        """The model modules that receive a canonical module's weights, in the order of the rows
        they receive (so a split qkv gives its q, k, v projections in that order)."""
        keys = [k for k in self.key_map if module_of(k) == canonical_module]
        return list(dict.fromkeys(module_of(m) for k in sorted(keys, reverse=True) for m in self.key_map[k]))

    def one(self, canonical_module: str, stage: str) -> str | None:
        found = [caller(m, self.modules) for m in self.owners(canonical_module)]
        if len(found) == 1 and found[0] in self.modules and self._holds_others(found[0], canonical_module):
            self.plan.unseen[stage] = (
                f"{canonical_module}'s weights are bare parameters of {found[0] or 'the root'}, which holds other "
                "stages' modules too: they act inside its forward, where no module boundary shows them"
            )
            return None
        if len(found) == 1 and found[0] in self.modules:
            return found[0]
        self.plan.unseen[stage] = (
            f"timm shows it at {canonical_module}, a module without weights in this config: no weights say "
            "which of the model's modules computes the stage, if any does"
            if not found and not any(module_of(k) == canonical_module for k in self.key_map)
            else f"no module of its own holds {canonical_module}'s weights"
            if not found
            else f"{canonical_module}'s weights go to {len(found)} modules ({', '.join(found)})"
            if len(found) > 1
            else f"{canonical_module}'s weights sit in {found[0] or 'the root'}, not a submodule that is called"
        )
        return None

    def _holds_others(self, path: str, canonical_module: str) -> bool:
        """Whether the module at ``path`` holds another canonical module's weights in a submodule
        (BEiT's lambda_1 beside the layer's norms and attention): its output is not the stage's."""
        inside = path + "." if path else ""
        return any(
            module_of(mk).startswith(inside) and module_of(mk) != path
            for k, mks in self.key_map.items()
            if module_of(k) != canonical_module
            for mk in mks
        )

    def attention(self, i: int, part: str, stage: str) -> Source | None:
        """q, k, v or the weights of block i's attention: the attention record, failing it the
        projections' outputs (separate q/k/v modules, or a fused qkv split as timm's)."""
        qkv = self.owners(f"blocks.{i}.attn.qkv")
        if not self.config.qkv_fused:  # the canonical layout's own three projections
            qkv = [m for p in "qkv" for m in self.owners(f"blocks.{i}.attn.{p}_proj")]
        if self.block_paths[i] is None:  # (x-transformers' halves of a block in one list) no record
            if len(qkv) == 3 and part != "weights":  # but separate projections show q, k and v
                return Source("out", qkv["qkv".index(part)], shape="heads")
            self.plan.unseen[stage] = "the block has no module of its own, where its attention would be recorded"
            return None
        if part == "weights":
            return Source("attn", part="weights", block=i)
        if part == "bias":  # BEiT's: the output of a module holding the table alone, or a fused call's mask
            own = {module_of(m) for m in self.key_map.get(f"blocks.{i}.attn.relative_position_bias_table", [])}
            alone = len(own) == 1 and not any(
                module_of(m) == next(iter(own))
                for k, ms in self.key_map.items()
                for m in ms
                if "relative_position" not in k
            )
            if alone and next(iter(own)) in self.modules:
                return Source("out", next(iter(own)), shape="bias")
            return Source("attn", part="bias", block=i)
        if len(qkv) == 1 and kind_name(self.modules.get(qkv[0])) in ATTENTION_MODULES:
            return Source("attn", part=part, block=i)  # the module projects q, k and v itself
        if len(qkv) == 3:  # separate q, k, v projections, in q, k, v order (see key_map)
            return Source("attn", part=part, block=i, fallback=("heads", qkv["qkv".index(part)]))
        if len(qkv) == 1:
            return Source("attn", part=part, block=i, fallback=("qkv", qkv[0]))
        return Source("attn", part=part, block=i)

    def source(self, name: str) -> Source | None:
        """The rule of the stage table (impls.stages) applied to this model."""
        stage, i = stage_of(name)
        rule = stage.capture_rule(self.config)
        scope = f"blocks.{i}." if stage.scope == "block" else "attn_pool." if stage.scope == "attn_pool" else ""
        what, _, arg = rule.partition(":")
        if what in ("out", "in") and arg == "next":  # the input of block 0, or of norm_pre before it
            return self._first_input(name)
        if what in ("out", "in"):
            module, _, shape = arg.partition("@")
            m = self.one(scope + module, name)
            return m and Source(what, m, shape=shape)
        if what == "attn":
            return self.attention(i, arg, name)
        if what == "block":
            if self.block_paths[i] is None:
                self.plan.unseen[name] = "no module holds this block's weights alone"
                return None
            if i not in self.parts:
                return Source("out", self.block_paths[i])
            return self._container_output(i, name)
        if what == "pool":
            return self._pool(name)
        if what in ("head", "return"):
            return self._output(what, name)
        if what == "unseen":
            self.plan.unseen[name] = arg
            return None
        raise ValueError(f"stage {name!r}: unknown capture rule {rule!r} (impls.stages)")

    def _first_input(self, name: str) -> Source | None:
        if self.config.pre_norm:
            m = self.one("norm_pre", name)
            return m and Source("in", m)
        if self.block_paths and self.block_paths[0] is not None:
            return self._block_input(0)
        self.plan.unseen[name] = "no module holds block 0's weights alone, so its input cannot be read"
        return None

    def _container_output(self, i: int, name: str) -> Source | None:
        """A container block's output, which its parent computes: the next block's input, or the
        final norm's for the last block."""
        if i + 1 < self.config.depth:
            found = self._block_input(i + 1)
        elif self.config.use_final_norm or self.config.global_pool == "map":
            m = self.one("norm", name)
            found = m and Source("in", m)
        else:
            found = None
        if found is None:
            self.plan.unseen[name] = "the block's residuals are added by its parent and no module reads the sum"
        return found

    def _pool(self, name: str) -> Source | None:
        keys = [k for k in self.key_map if k.startswith("attn_pool.")]
        pool = common_module({module_of(mk) for k in keys for mk in self.key_map[k]})
        if pool and pool in self.modules:
            return Source("out", pool)
        self.plan.unseen[name] = "no module of its own holds the attention pool's weights"
        return None

    def _output(self, what: str, name: str) -> Source | None:
        """``pooled`` (the head's input) and ``logits`` (what the model returns)."""
        if self.headless:
            return Source("return", part="pooled" if what == "head" else "")
        if not self.has_head:
            self.plan.unseen[name] = "the model has no classifier head (the mapping drops head)"
            return None
        if what == "return":
            return Source("return")
        m = self.one("head", name)
        return m and Source("in", m)
