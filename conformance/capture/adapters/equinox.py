"""Equinox models: immutable pytrees of modules that act on one example each. The adapter calls
the model under ``jax.vmap`` over the batch (Equinox's convention), records modules by a class
swap, and reads what a module computes under vmap (its own ``jax.vmap`` over tokens too) with a
``jax.pure_callback``, whose batching hands the host the whole batched array once. Loading
replaces the model (``eqx.tree_at``); modules are named by their attribute path."""

from __future__ import annotations

import dataclasses
import itertools
import threading

import numpy as np

from conformance.capture.adapters.base import SwapAdapter
from conformance.capture.adapters.jax_arrays import JAXArrays, on_device
from conformance.capture.recorder import callbacks, hooked, map_arrays


class EquinoxAdapter(JAXArrays, SwapAdapter):
    name = "equinox"
    channels_first = True  # eqx.nn.Conv2d maps (C, H, W) to (D, h, w), as PyTorch's does

    def __init__(self, model):
        super().__init__(model)
        self._modules = dict(_walk(model, ""))
        self._whole: dict[int, tuple] = {}  # id(tracer) -> (tracer, its batched array), for one call

    def modules(self):
        return self._modules

    def _leaves(self) -> dict:
        import equinox as eqx
        import jax

        flat, _ = jax.tree_util.tree_flatten_with_path(eqx.filter(self.model, eqx.is_inexact_array))
        return {_dotted(path): leaf for path, leaf in flat}

    def params(self):
        return {k: tuple(v.shape) for k, v in self._leaves().items()}

    def by_type(self, kind, leaf, value):
        return value  # Equinox keeps PyTorch's layouts: Linear (out, in), Conv2d (out, in, kh, kw)

    def resolve(self, key, params):
        return key

    def current(self, key):
        return np.asarray(self._leaves()[key], np.float32)

    def load(self, arrays, dtype, cast=True):
        import equinox as eqx
        import jax.numpy as jnp

        leaves = self._leaves()
        keys = list(arrays)
        target = {k: (getattr(jnp, dtype) if cast else leaves[k].dtype) for k in keys}
        values = [on_device(arrays[k], target[k]) for k in keys]
        where = [_getter(k) for k in keys]
        self.model = eqx.tree_at(lambda m: [get(m) for get in where], self.model, values)
        self._modules = dict(_walk(self.model, ""))  # a new pytree: new module objects

    def is_array(self, x):
        import jax

        return isinstance(x, (jax.Array, jax.core.Tracer))

    def copy(self, x):
        """A concrete copy of ``x``: under vmap (a tracer), the batched array a pure_callback is
        handed (batch axes first, outermost first); inside jit, the tracer (read as traced)."""
        import jax

        if not isinstance(x, jax.core.Tracer):
            return x
        if id(x) in self._whole and self._whole[id(x)][0] is x:  # the same array each time it is seen
            return self._whole[id(x)][1]
        if isinstance(jax.numpy.zeros(()), jax.core.Tracer):  # traced inside jit: read as traced
            return x
        # One callback for every read (JAX compiles a callback's program once per callback and
        # shape: a new function per read compiled one each time, most of a small model's capture),
        # told which read it serves; run from JAX's cache, the program returns before its callback
        # has run, so the read waits for it.
        read = next(_READS)
        jax.pure_callback(_HOST, jax.ShapeDtypeStruct(x.shape, x.dtype), x, np.int32(read), vmap_method="expand_dims")
        self._whole[id(x)] = (x, jax.numpy.asarray(_HOST.take(read)))  # the tracer kept: its id stays its own
        return self._whole[id(x)][1]

    def seen(self, args, kwargs, out):
        """What a wrapped function's hook is handed: each tracer as its batched array (a softmax
        vmapped over heads, as eqx.nn.MultiheadAttention's is, seen whole: (B, heads, N, N))."""

        def whole(x):
            return map_arrays(x, self.copy, self.is_array)

        return tuple(whole(a) for a in args), {k: whole(v) for k, v in kwargs.items()}, whole(out)

    def numpy(self, x):
        return np.asarray(x, np.float32) if str(x.dtype) == "bfloat16" else np.asarray(x)

    def call(self, inputs):
        import jax

        return jax.vmap(lambda image: self.model(image, **self.call_kwargs))(inputs)

    def set_class(self, module, cls) -> None:
        object.__setattr__(module, "__class__", cls)  # an Equinox module is a frozen dataclass

    def run(self, inputs, recorder, watch, functions: bool = True):
        try:
            return super().run(inputs, recorder, watch, functions)
        finally:
            self._whole.clear()

    def patches(self, recorder):
        """JAX's functions, and a tracer's scalar multiply and divide: eqx.nn.MultiheadAttention
        scales q by 1/√head_dim under its vmap over heads, before q kᵀ (q is read unscaled)."""
        import jax

        on = callbacks(recorder, self.seen)
        Tracer = jax.core.Tracer
        return super().patches(recorder) + [hooked(Tracer, name, on.scale) for name in ("__mul__", "__truediv__")]


def _dotted(path) -> str:
    import jax

    parts = []
    for entry in path:
        if isinstance(entry, jax.tree_util.GetAttrKey):
            parts.append(entry.name)
        elif isinstance(entry, jax.tree_util.SequenceKey):
            parts.append(str(entry.idx))
        elif isinstance(entry, jax.tree_util.DictKey):
            parts.append(str(entry.key))
        else:
            parts.append(str(entry))
    return ".".join(parts)


def _getter(key: str):
    parts = [int(p) if p.isdigit() else p for p in key.split(".")]

    def get(model):
        for p in parts:
            model = model[p] if isinstance(p, int) else getattr(model, p)
        return model

    return get


def _walk(module, prefix: str):
    """(path, module) for every Equinox module in the tree, by attribute path (lists by index)."""
    import equinox as eqx

    yield prefix, module
    for f in dataclasses.fields(module):
        value = getattr(module, f.name, None)
        items = (
            [(f.name, value)]
            if not isinstance(value, (list, tuple))
            else [(f"{f.name}.{i}", v) for i, v in enumerate(value)]
        )
        for name, child in items:
            if isinstance(child, eqx.Module):
                yield from _walk(child, f"{prefix}.{name}" if prefix else name)


class _Host:
    """The host side of every read, one callable for JAX's cache: each batched array it is
    handed, kept under its read's number until that read takes it."""

    WAIT = 60.0  # seconds: a read whose callback never runs is the tool's failure, never a hang

    def __init__(self):
        self.seen: dict[int, np.ndarray] = {}
        self.arrived = threading.Condition()

    def __call__(self, value, read):
        with self.arrived:
            self.seen[int(np.ravel(read)[0])] = np.asarray(value)
            self.arrived.notify_all()
        return value

    def take(self, read: int) -> np.ndarray:
        with self.arrived:
            if not self.arrived.wait_for(lambda: read in self.seen, timeout=self.WAIT):
                raise RuntimeError(f"an eager read's pure_callback did not run within {self.WAIT:.0f} s")
            return self.seen.pop(read)


_HOST = _Host()
_READS = itertools.count()
