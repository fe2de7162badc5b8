"""ModelPort: a model in its own framework and the mapping from the canonical weights; what it
builds is the captured forward (conformance.capture.captured)."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from conformance.capture.adapters import ADAPTERS, BaseAdapter, check_not_quantized, framework_of
from conformance.capture.expressible import (
    FUSED_QKV,
    NotExpressible,
    extra_parts,
    hierarchical,
    not_expressible,
    optional_parts,
    options_read,
    why_absent,
    schemes,
)
from conformance.capture.mapping import (
    PATCH_ORDERS,
    LoadError,
    config_argument,
    k_bias_free,
    module_of,
    patch_layout,
    prefix_rows,
    rename_function,
    unit_axes,
)
from conformance.capture.captured import CapturedForward
from conformance.capture.plan import TapOverrideError, infer_plan
from conformance.capture.scope import after_tower, no_gradient_past_tower
from conformance.capture.sequence import PREFIXES, SEQUENCES
from conformance.capture.quantize import quantized_port
from conformance.report import CannotJudge, ToolError, describe_exception
from conformance.support import check_supported, supports_of
from impls.protocol import ViTConfig
import difflib
from dataclasses import replace


MASK_TOKEN = re.compile(r"(.*\.)?mask_token")


@dataclass
class ModelPort:
    """A model in its own framework, with the mapping from the canonical (timm) weights.

    build: ``config -> model`` (an unloaded PyTorch, MLX or Flax NNX module, or an unbound linen one).
    rename: a rename table or key function (names only; layouts follow the module types), or
    convert: ``state -> {model key: array}`` in the model's own layouts.
    images: "NCHW" (the canonical layout) or "NHWC" (what MLX and Flax convolutions take).
    taps: overrides, ``{"blocks.{i}.attn.weights": "layers.{i}.attn.softmax"}`` (":in" for a
    module's input).
    output: ``model output -> logits`` (default: the array, a tuple's first, ``.logits``); for a
    headless model (``num_classes=0``) its pooled features.
    supports: the configs the port is written for (see conformance.support).
    call_kwargs: passed to every call of the model (``train=False``, ``deterministic=True``).
    autocast: a PyTorch model keeps float32 weights and runs under ``torch.autocast`` in the
    dtype asked for (bfloat16, float16): mixed precision as PyTorch users run it.
    patch_order: how the model flattens a patch where it does (a Linear patch embedding, a norm
    over raw patches): "p1 p2 c" (einops' channels last) or "c p1 p2" (a conv kernel reshaped);
    rename= lays out the conv kernel and the patch norm's weights in it.
    tower: the stage whose output is the tower's (``"norm"``, ``"blocks.{last}"``: a VLM's encoder
    before its merger or projector); the stages after it are out of scope, unseen as such, and so
    are the parameters no canonical key fills that none of the tower's stages depend on (scope.py).
    sequence: "one" for a tower that packs a batch into one sequence (Pixtral; capture/sequence.py).
    prefix: "last" for a model that keeps its class (and register) tokens after the patches (Llama 4's
    vision tower): its taps read in the canonical order, rename= moves the table's prefix rows last.
    quantize: ``model -> model or None``, applied once the float weights are loaded (MLX's
    ``nn.quantize``, in place): the port is judged on its own quantized weights, read back from
    its packed tensors, and its cost against the float model is measured (docs/quantization.md).

    ``build`` is called as ``build(config, dtype=...)`` when it takes ``dtype`` (then the model
    chooses each parameter's precision: Flax ``dtype``/``param_dtype``, Hugging Face
    ``torch_dtype``), else ``build(config)`` and every parameter is cast to the dtype asked for.
    ``convert`` is called as ``convert(state, config)`` when it takes two arguments (whatever
    their names) or a ``config`` keyword, else ``convert(state)``.
    """

    build: Callable[[ViTConfig], Any]
    rename: Mapping[str, str | None] | Callable[[str], str | None] | None = None
    convert: Callable[[dict], dict] | None = None
    images: str = "NCHW"
    taps: Mapping[str, str] = field(default_factory=dict)
    output: Callable[[Any], Any] | None = None
    supports: Any = None
    call_kwargs: Mapping[str, Any] = field(default_factory=dict)
    autocast: bool = False
    patch_order: str | None = None
    quantize: Callable[[Any], Any] | None = None
    tower: str | None = None
    sequence: str = "batch"
    prefix: str = "first"

    def __post_init__(self):
        if (self.rename is None) == (self.convert is None):
            raise TypeError("ModelPort needs exactly one of rename= (names) or convert= (a state -> state function)")
        if self.patch_order not in (None, *PATCH_ORDERS):
            raise ValueError(f"patch_order must be one of {PATCH_ORDERS} (or None), got {self.patch_order!r}")
        if self.images not in ("NCHW", "NHWC") or self.sequence not in SEQUENCES or self.prefix not in PREFIXES:
            raise ValueError(
                f"images must be 'NCHW' or 'NHWC', sequence one of {SEQUENCES}, prefix one of {PREFIXES}: "
                f"{self.images!r}, {self.sequence!r}, {self.prefix!r}"
            )

    def with_taps(self, taps: Mapping[str, str]) -> "ModelPort":

        return replace(self, taps={**self.taps, **taps})

    # -- weights

    def _call_convert(self, state, config):
        how = config_argument(self.convert, positional=2)
        if how == "keyword":
            return self.convert(state, config=config)
        return self.convert(state, config) if how == "positional" else self.convert(state)

    def _convert(self, state, config):
        try:
            return self._call_convert(state, config)
        except KeyError as e:  # a canonical key this config does not have: said why, where it bites
            key = e.args[0] if e.args else None
            if (
                isinstance(key, str)
                and key not in state
                and ("." in key or key in ("cls_token", "dist_token", "reg_token", "pos_embed"))
            ):
                needs = options_read(lambda s: self._call_convert(s, config), state, config, key)
                raise needs or LoadError(why_absent(key, config)) from None
            raise

    def _build(self, config: ViTConfig, dtype: str):
        """(model, whether the model chose its own parameter dtypes)."""
        if config_argument(self.build, positional=None, keyword="dtype") == "keyword":
            return self.build(config, dtype=dtype), True
        return self.build(config), False

    def key_map(self, state: Mapping[str, np.ndarray], config: ViTConfig) -> dict[str, list[str]]:
        """canonical key -> the model keys it is sent to."""
        if self.rename is not None:
            rename = rename_function(self.rename)
            return {k: [m] if (m := rename(k)) is not None else [] for k in state}
        # Probe the convert function with each key filled with its own index; a key sent to
        # several model keys (a qkv split in three) is probed again with its element indices,
        # which orders its targets by the rows they take.
        probe = {k: np.full(v.shape, i + 1, np.float32) for i, (k, v) in enumerate(state.items())}
        names = list(state)
        out = {k: [] for k in state}
        for mk, value in self._convert(probe, config).items():
            for tag in np.unique(np.asarray(value)):
                if float(tag).is_integer() and 1 <= tag <= len(names):
                    out[names[int(tag) - 1]].append(mk)
        for k, targets in out.items():
            if len(targets) > 1:
                probe = {n: np.zeros(v.shape, np.float32) for n, v in state.items()}
                probe[k] = np.arange(1, state[k].size + 1, dtype=np.float32).reshape(state[k].shape)
                converted = self._convert(probe, config)
                out[k] = sorted(targets, key=lambda mk: float(np.min(np.asarray(converted[mk]))))
        return out

    def mapped(
        self, state: Mapping[str, np.ndarray], adapter: BaseAdapter, config: ViTConfig
    ) -> tuple[dict, list[str]]:
        """The model's arrays from the canonical state, strictly: (arrays, unfilled model keys)."""
        params = adapter.params()
        source: dict[str, str] = {}  # model key -> the canonical key sent there (rename)
        if self.rename is not None:
            rename = rename_function(self.rename)
            arrays = {}
            for k, v in state.items():
                mk = rename(k)
                if mk is None:
                    continue
                mk = adapter.resolve(mk, params)
                source[mk] = k
                if mk in arrays:
                    raise LoadError(f"the rename sends two canonical keys to {mk!r} (the second is {k!r})")
                shape = params.get(mk, np.shape(v))
                laid = patch_layout(k, np.asarray(v), shape, config, self.patch_order)
                arrays[mk] = adapter.native(mk, prefix_rows(k, laid, config, self.prefix), shape)
        else:
            # in the model's own layouts, but for size-1 axes (a (1, 1, D) class token for a (1, D) one)
            converted = {adapter.resolve(k, params): v for k, v in self._convert(dict(state), config).items()}
            arrays = {k: unit_axes(np.asarray(v), params.get(k)) for k, v in converted.items()}
        unknown = sorted(set(arrays) - set(params))
        homeless = [source.get(k, k) for k in unknown]
        apart = unknown and self._apart(adapter, params, config)
        fused = [k for k in homeless if re.fullmatch(FUSED_QKV, k)] if apart else []
        if unknown and optional_parts([k for k in homeless if k not in fused]):  # parts the config names, or fused
            raise self._unexpressed(homeless, self.key_map(state, config), adapter, config)
        if unknown:
            near = difflib.get_close_matches(unknown[0], sorted(set(params) - set(arrays)), n=3, cutoff=0.5)
            raise LoadError(
                f"the mapping gives {len(unknown)} key(s) the model does not have: "
                f"{', '.join(repr(k) for k in unknown[:8])}{' ...' if len(unknown) > 8 else ''}; "
                f"closest model keys to {unknown[0]!r}: {', '.join(repr(k) for k in near) or 'none'}"
            )
        wrong = [
            f"{k!r}: mapped {tuple(arrays[k].shape)}, the model has {params[k]}"
            for k in sorted(arrays)
            if tuple(arrays[k].shape) != tuple(params[k])
        ]
        if wrong:
            canonical = source or {mk: k for k, mks in self.key_map(state, config).items() for mk in mks}
            raise hierarchical(canonical, params, config) or LoadError(
                f"{len(wrong)} shape mismatch(es): " + "; ".join(wrong[:6])
            )
        unfilled = sorted(set(params) - set(arrays))
        for k in unfilled:
            arrays[k] = adapter.current(k)
        # a parameter with no elements (vit-pytorch's (0, D) class token under mean pooling) holds no
        # value; transformers' mask_token (ViT, DINOv2, DINOv3, BEiT) replaces the patches only under
        # bool_masked_pos, masked-image pretraining's input: an image's forward never reads it (and if
        # a model did, its stages would show it)
        return arrays, [k for k in unfilled if int(np.prod(params[k])) > 0 and not MASK_TOKEN.fullmatch(k)]

    def _k_bias_free(self, state, config: ViTConfig) -> list[int]:
        """The blocks whose model has no k bias (``conformance.capture.mapping.k_bias_free``)."""
        if self.convert is None:
            return []
        return k_bias_free(lambda s: self._convert(s, config), state, config)

    def _unexpressed(self, dropped, key_map, adapter: BaseAdapter, config: ViTConfig, reads=None, besides=()):
        """The answer for a model the config does not describe: the canonical keys it has no place
        for, and its parameters no canonical key fills (those an option adds named; ``besides``:
        those after a tower's output, not told)."""
        params = adapter.params()
        targets = {adapter.resolve(m, params) for ms in key_map.values() for m in ms}
        extra = sorted(k for k in set(params) - targets - set(besides) if int(np.prod(params[k])) > 0)
        shapes = dict(params)
        proj = key_map.get("patch_embed.proj.weight")
        if proj:  # the module that takes the patch kernel: an embed norm sits beside it
            shapes["patch_embed.proj"] = module_of(adapter.resolve(proj[0], params))
        # where the rename sends the final norm on every token (the config may hold it after the pooling)
        norm = rename_function(self.rename)("norm.weight") if self.rename is not None else None
        norm_at = module_of(adapter.resolve(norm, params)) if norm else None
        apart = self._apart(adapter, params, config)
        return not_expressible(dropped, extra, shapes, config, reads, adapter.kinds(), norm_at, apart, self.tower)

    def _apart(self, adapter: BaseAdapter, params, config: ViTConfig) -> list[str]:
        """The model's keys where the rename sends q, k and v projected apart (``qkv_fused=False``'s
        attn.q_proj, k_proj, v_proj), when the config fuses them and the model holds every one."""
        if self.rename is None or not config.qkv_fused:
            return []
        rename = rename_function(self.rename)
        leaves = ("weight", "bias") if config.qkv_bias else ("weight",)
        keys = [f"blocks.{i}.attn.{p}_proj.{leaf}" for i in range(config.depth) for p in "qkv" for leaf in leaves]
        targets = [rename(k) for k in keys]
        if not all(targets):
            return []
        targets = [adapter.resolve(t, params) for t in targets]
        return targets if all(t in params for t in targets) else []

    # -- the factory

    def __call__(self, config: ViTConfig, state: Mapping[str, np.ndarray], dtype: str = "float32"):

        check_supported(supports_of(self), config)
        model, chosen = self._build(config, dtype)
        framework = ADAPTERS[framework_of(model)]
        if self.autocast and not framework.supports_autocast:
            raise TypeError(
                f"ModelPort(autocast=True) runs a PyTorch model under torch.autocast; this is a "
                f"{framework.name} model (give build a dtype= argument instead)"
            )
        adapter = framework.bind(model, config, self.images)
        check_not_quantized(adapter, self.quantize is not None)  # before its parameters are read
        adapter.call_kwargs = dict(self.call_kwargs)
        try:
            key_map = self.key_map(state, config)
        except NotExpressible as e:  # the convert reads keys options add: the rest of the answer too
            if getattr(e, "state", None) is None:
                raise
            key_map = self.key_map(e.state, config)  # the keys options add, and where they go
            dropped = sorted(k for k in state if not key_map[k] and not k.startswith("head."))
            raise self._unexpressed(dropped, key_map, adapter, config, e.reads) from None
        dropped = sorted(k for k, targets in key_map.items() if not targets and not k.startswith("head."))
        params = adapter.params()
        key_map = {k: [adapter.resolve(m, params) for m in targets] for k, targets in key_map.items()}
        # the config names parts the model lacks, or the model computes what the config has no
        # word for (no mapping could make it fit): not a finding about the port
        if dropped or schemes(adapter.kinds(), params, config):
            raise self._unexpressed(dropped, key_map, adapter, config)
        arrays, unfilled = self.mapped(state, adapter, config)
        # the model has parts the config does not name; under a tower, asked once those after its
        # output are set apart (a merger's bias can have a patch norm's shape): below
        deferred = bool(extra_parts(unfilled, params, config))
        if deferred and self.tower is None:
            raise self._unexpressed([], key_map, adapter, config)
        mixed = self.autocast and dtype != "float32"
        cast = not (chosen or self.autocast)
        adapter.load(arrays, dtype, cast=cast)
        if mixed:
            adapter.autocast = dtype
        quantized = None
        if self.quantize is not None:
            adapter, quantized = quantized_port(self, model, adapter, state, config, arrays, dtype)
        has_head = any(key_map.get(k) for k in ("head.weight", "head.bias"))
        try:
            plan = infer_plan(config, key_map, adapter.modules(), self.taps, has_head, self.tower)
        except (TapOverrideError, CannotJudge):  # the port's own word (its taps, its tower), not the tool's
            raise
        except Exception as e:  # noqa: BLE001 - the plan is the tool's
            if deferred:  # a model with parts the config does not name: that answer first
                raise self._unexpressed([], key_map, adapter, config) from None
            raise ToolError(f"capture could not plan the taps: {describe_exception(e)}") from e
        findings = []
        forward = CapturedForward(self, adapter, plan, config, dtype, findings)
        forward.quantized = quantized
        forward.k_bias = {i: state[f"blocks.{i}.attn.qkv.bias"] for i in self._k_bias_free(state, config)}
        forward.input_dtype = "float32" if mixed else dtype  # autocast casts the model's inputs itself
        kept = unfilled
        if unfilled and quantized is None:  # a tower's merger, projector or neck: out of scope
            kept = after_tower(self.build, forward, lambda a: adapter.load(a, dtype, cast=cast), arrays, unfilled)
        if deferred and extra_parts(kept, params, config):  # parts before the tower's output
            raise self._unexpressed([], key_map, adapter, config, besides=set(unfilled) - set(kept))
        unfilled = kept
        if unfilled:
            findings.append(
                (
                    "load",
                    f"the model has {len(unfilled)} parameter(s) the canonical weights do not fill, "
                    f"left at the model's initial values: {', '.join(unfilled[:6])}"
                    + (" ..." if len(unfilled) > 6 else ""),
                )
            )
        return forward

    def make_grad(self, config: ViTConfig, state: Mapping[str, np.ndarray], dtype: str = "float32"):
        """A gradient factory (docs/gradients.md) from the unmodified model: grad(images, loss)
        differentiates the framework's own loss of the model's logits with respect to its
        parameters and the images, and brings each parameter's gradient back to its canonical
        key and layout through the mapping (the adjoint of a re-layout is its inverse, found by
        sending each entry's index through it). A PyTorch or MLX model also returns the cotangent
        at every stage its forward is read at a module boundary (docs/gradients.md); a Flax NNX
        one is located at the first wrong parameter gradient in backward order."""
        forward = self(config, state, dtype)  # loaded strictly, as the forward is
        no_gradient_past_tower(forward.plan, self.tower)
        adapter = forward.adapter
        if not adapter.supports_gradients:
            adapter.gradients(None, None, forward)  # raises Unsupported, naming the framework
        where = self.entry_map(state, adapter, config)

        def grad(images, loss):
            images = np.asarray(images)
            x = images.transpose(0, 2, 3, 1) if self.images == "NHWC" else images
            value, native, g_x, taps = adapter.gradients(
                adapter.to_input(np.ascontiguousarray(x), dtype), loss, forward
            )
            params = {}
            for key, targets in where.items():
                g = np.zeros(state[key].size, np.float64)
                for mk, index in targets:
                    taken = index >= 0
                    np.add.at(g, index[taken], np.asarray(native[mk], np.float64).ravel()[taken])
                params[key] = g.reshape(state[key].shape)
            out = {
                "loss": value,
                "params": params,
                "images": g_x.transpose(0, 3, 1, 2) if self.images == "NHWC" else g_x,
            }
            return out if taps is None else out | {"taps": taps}

        return grad

    def entry_map(self, state, adapter: BaseAdapter, config: ViTConfig) -> dict[str, list[tuple[str, np.ndarray]]]:
        """canonical key -> [(model key, the canonical flat index of each of its entries)]: each
        key's entries numbered and sent through the mapping, as the weights are."""
        probe = {k: np.arange(1, np.size(v) + 1, dtype=np.float64).reshape(np.shape(v)) for k, v in state.items()}
        out: dict[str, list] = {k: [] for k in state}
        if self.rename is not None:
            arrays, _ = self.mapped(probe, adapter, config)
            rename = rename_function(self.rename)
            for k in state:
                mk = rename(k)
                if mk is not None:
                    mk = adapter.resolve(mk, adapter.params())
                    out[k].append((mk, np.asarray(arrays[mk]).ravel().astype(np.int64) - 1))
            return out
        for k, v in state.items():  # convert: one key at a time, the others zero
            converted = self._convert(
                {n: probe[n] if n == k else np.zeros(np.shape(w), np.float32) for n, w in state.items()}, config
            )
            for mk, value in converted.items():
                index = np.asarray(value, np.float64).ravel()
                if not np.any(index):
                    continue
                whole = index == np.round(index)
                if not np.all(whole[index != 0]) or index.max() > np.size(v):
                    raise LoadError(
                        f"the convert function does more than re-lay out {k!r} (into {mk!r}: it scales or "
                        "mixes entries), so its gradient cannot be brought back"
                    )
                # -1 where the model's entry does not come from k; an entry sent to two places (tied
                # weights) gets both gradients summed by np.add.at, the adjoint of a copy
                out[k].append((mk, index.astype(np.int64) - 1))
        return out
