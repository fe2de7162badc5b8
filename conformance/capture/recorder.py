"""What a captured forward records: module inputs and outputs by path, and per block the
attention's q, k, v and weights as the model computes them; the wrappers that feed it."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from contextlib import contextmanager
from typing import Any

from conformance.report import ToolError, describe_exception
from conformance.returned import Taps  # noqa: F401 - what a captured forward records into, re-exported
from impls.protocol import ViTConfig
from types import SimpleNamespace


def merge_second(taps: Taps, second: Taps, how: str) -> None:
    """The stages only a second pass read, into ``taps`` (the model's own path), each named so."""
    for stage, why in second.unseen.items():
        if stage in taps.unseen and taps.unseen[stage] != why:
            taps.unseen[stage] = f"{taps.unseen[stage]} on the model's own path, and {why} off it"
    for stage in second:
        if stage in taps:
            continue
        own = taps.unseen.pop(stage, "not read")
        second.sources[stage] = f"{second.sources[stage]}, {how} (on the model's own path: {own})"
        taps.sources[stage] = second.sources[stage]
        taps[stage] = second[stage]
        if stage in second.dtypes:
            taps.dtypes[stage] = second.dtypes[stage]
        taps.from_second.add(stage)
    taps.second = second


def guarded(method):
    """A recorder callback runs inside the model's call: an exception in it is the tool's, kept
    (the first) and raised as a ToolError after the call, never let loose inside the model."""

    @functools.wraps(method)
    def call(self, *args, **kwargs):
        try:
            return method(self, *args, **kwargs)
        except Exception as e:  # noqa: BLE001 - re-raised as the tool's own after the model returns
            if self.error is None:
                self.error = e

    return call


class Recorder:
    """Module inputs and outputs by path (copied at once), and per block the attention's q, k,
    v and weights as the model computes them."""

    def __init__(self, adapter, config: ViTConfig, batch: int, blocks: dict[str, int]):
        self.adapter = adapter
        self.N, self.H, self.hd, self.B = config.num_tokens, config.num_heads, config.head_dim, batch
        self.blocks = blocks  # block module path -> index
        self.block: int | None = None
        self.inputs: dict[str, Any] = {}
        self.outputs: dict[str, Any] = {}
        self.calls: dict[str, int] = {}
        self.attn: dict[int, dict[str, Any]] = {}
        self.scaled: dict[int, tuple] = {}
        self.error: Exception | None = None

    def raise_error(self) -> None:
        if self.error is not None:
            raise ToolError(
                f"capture failed while recording the forward: {describe_exception(self.error)}"
            ) from self.error

    @guarded
    def native(self, query):
        """torch._native_multi_head_attention ran in this block (nn.MultiheadAttention's fast path)."""
        self._slot().setdefault(
            "native", "torch._native_multi_head_attention (nn.MultiheadAttention's native fast path)"
        )

    @guarded
    def scaled_inside(self, where):
        """q was scaled inside ``where`` before q kᵀ, where no scalar multiply is seen: the left
        operand of q kᵀ is not q."""
        slot = self._slot()
        if "logits_q" in slot and "q" not in slot:
            slot.setdefault("q_scaled", where)

    @guarded
    def enter(self, path, value):
        self.calls[path] = self.calls.get(path, 0) + 1
        if path in self.blocks:
            self.block = self.blocks[path]
        if path not in self.inputs and value is not None:
            self.inputs[path] = self.adapter.copy(value)

    @guarded
    def leave(self, path, output):
        if path in self.blocks:
            self.block = None
        if path not in self.inputs:  # a module watched for its output only
            self.calls[path] = self.calls.get(path, 0) + 1
        if path not in self.outputs:
            self.outputs[path] = map_arrays(output, self.adapter.copy, self.adapter.is_array)

    def _slot(self):
        return self.attn.setdefault(self.block, {})

    def _is(self, x, *tail) -> bool:
        return self.adapter.is_array(x) and tuple(x.shape[-len(tail) :]) == tail and len(x.shape) >= 3

    @guarded
    def fused(self, q, k, v, where, heads_first, bias=None):
        slot = self._slot()
        if "q" in slot and slot.get("fused") == where and all(self.adapter.is_array(t) for t in (q, k, v)):
            # one call per image or window of a packed sequence (cu_seqlens): its tokens, in order
            slot.setdefault("chunks", []).append({n: self.adapter.copy(t) for n, t in zip("qkv", (q, k, v))})
            return
        if "q" not in slot and all(self.adapter.is_array(t) for t in (q, k, v)):
            copy = self.adapter.copy
            if self.adapter.is_array(bias) and not str(bias.dtype).endswith("bool"):  # added to the logits
                slot["bias"] = copy(bias)
            slot.update(
                q=copy(q),
                k=copy(k),
                v=copy(v),
                heads_first=heads_first,
                where=f"the q, k, v arguments of {where}",
                fused=where,
            )

    @guarded
    def softmax(self, out):
        slot = self._slot()
        if "weights" not in slot and self._is(out, self.N, self.N):
            slot["weights"] = self.adapter.copy(out)

    @guarded
    def scalar_op(self, args, out):
        # Only q-shaped results are kept (a q scaled before q kᵀ), and kept alive so ids stay unique.
        if len(args) == 2 and self._is(out, self.N, self.hd):
            a, b = args
            tensor = a if self.adapter.is_array(a) else b
            other = b if tensor is a else a
            if isinstance(other, (int, float)) or (self.adapter.is_array(other) and other.ndim == 0):
                self.scaled[id(out)] = (tensor, out)

    def _unscaled(self, x):
        hit = self.scaled.get(id(x))
        return hit[0] if hit is not None and hit[1] is x else x

    @guarded
    def product(self, a, b, out, equation):
        if not (self.adapter.is_array(a) and self.adapter.is_array(b) and self.adapter.is_array(out)):
            return
        if len(a.shape) < 3 or len(b.shape) < 3:
            return  # a Linear's x @ Wᵀ
        slot = self._slot()
        N, hd = self.N, self.hd
        if "logits_q" not in slot and self._is(out, N, N) and tuple(a.shape[-2:]) == (N, hd):
            k_transposed = True  # q @ kᵀ: the right operand is kᵀ
            if equation is not None:  # einsum: kᵀ if k's last index is the output's key index
                ins, _, res = equation.replace(" ", "").partition("->")
                k_transposed = ins.split(",")[1][-1] == res[-1]
            slot["logits_q"] = self.adapter.copy(self._unscaled(a))
            slot["logits_k"] = self.adapter.copy(swap_last(b) if k_transposed else b)
        elif "logits_q" in slot and "product_v" not in slot and self._is(a, N, N) and self._is(b, N, hd):
            slot["product_v"] = self.adapter.copy(b)


def swap_last(x):
    axes = list(range(len(x.shape)))
    axes[-1], axes[-2] = axes[-2], axes[-1]
    return x.permute(*axes) if hasattr(x, "permute") else x.transpose(axes)


def map_arrays(x, fn, is_array):
    if is_array(x):
        return fn(x)
    if isinstance(x, (tuple, list)):
        return type(x)(map_arrays(v, fn, is_array) for v in x) if not hasattr(x, "_fields") else x
    return x


def arrays_in(x, is_array):
    """The arrays an output holds: itself, a tuple's elements, a mapping's or ModelOutput's values."""
    if is_array(x):
        return [x]
    if isinstance(x, Mapping) or hasattr(x, "to_tuple"):
        return [v for v in (x.values() if isinstance(x, Mapping) else x.to_tuple()) if is_array(v)]
    if isinstance(x, (tuple, list)):
        return [a for v in x for a in arrays_in(v, is_array)]
    return []


def first_array(args, kwargs, adapter):
    for a in list(args) + list(kwargs.values()):
        if adapter.is_array(a):
            return a
    return None


@contextmanager
def patched(patches):
    """Framework functions replaced by their recording wrappers, restored however the call ends."""
    saved = [(owner, attr, getattr(owner, attr)) for owner, attr, _ in patches]
    try:
        for owner, attr, new in patches:
            setattr(owner, attr, new)
        yield
    finally:
        for owner, attr, old in saved:
            setattr(owner, attr, old)


def hooked(owner, attr: str, on_call):
    """A patch for ``patched``: ``owner.attr`` replaced by its wrapper calling ``on_call``."""
    return owner, attr, wrapped(getattr(owner, attr), on_call)


def wrapped(fn, on_call):
    def wrapper(*args, **kwargs):
        out = fn(*args, **kwargs)
        on_call(args, kwargs, out)
        return out

    return wrapper


def callbacks(recorder, see=None):
    """The recorder's hooks for wrapped framework functions, each acting inside a block only;
    ``see(args, kwargs, out)``: what the hook is handed instead (Equinox's: arrays for tracers)."""

    def inside(fn):
        def hook(args, kwargs, out):
            if recorder.block is not None:
                fn(*(see(args, kwargs, out) if see is not None else (args, kwargs, out)))

        return hook

    def fused(where, heads_first, names):
        """names: q's, k's and v's keywords, then the additive bias's (its 4th argument)."""

        def hook(a, k, out):
            bias = a[3] if len(a) > 3 else k.get(names[3])
            recorder.fused(*(list(a) + [k.get(n) for n in names[:3]])[:3], where, heads_first=heads_first, bias=bias)

        return inside(hook)

    return SimpleNamespace(
        softmax=inside(lambda a, k, out: recorder.softmax(out)),
        product=inside(lambda a, k, out: recorder.product(a[0], a[1], out, None)),
        einsum=inside(lambda a, k, out: recorder.product(a[1], a[2], out, a[0]) if len(a) == 3 else None),
        scale=inside(lambda a, k, out: recorder.scalar_op(a, out)),
        fused=fused,
    )
