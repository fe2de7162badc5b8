"""Verify a model as its author wrote it: load the canonical weights through the user's own
weight mapping, run the model unmodified, and read the stages from outside it.

    port = ModelPort(MyViT, rename={"blocks": "layers", "norm1": "ln_attn", ...})
    verify(port, config)                      # or: python -m conformance verify pkg.mod:port

A ``ModelPort`` is a port factory (``port(config, state, dtype=) -> forward``), so ``verify``,
the ``--port`` plugin and the zoo take it as they take any other. What it adds:

* **Weights through the user's mapping.** A rename table (``{"blocks": "layers", ...}``, a
  segment or a dotted path, ``{i}`` for a block index), a key function, or a whole-state
  ``convert`` function (what ``sanitize`` and ``convert_*_checkpoint`` scripts are). With a
  rename the layouts are converted by the target module's type (MLX and Flax convolutions,
  Flax ``Linear`` kernels, size-1 axes); ``convert`` returns native layouts. Loading is strict:
  a key the model lacks, a shape that does not fit or a canonical key the mapping drops is a
  load error naming it; model parameters the mapping leaves unfilled keep the model's own
  values and are reported, so a port with an extra layer is still located.
* **Taps inferred from the mapping.** The module that receives ``blocks.3.norm1.weight`` is the
  tap ``blocks.3.norm1``; ``attn`` and ``mlp`` are the outputs of the modules holding
  ``attn.proj`` and ``mlp.fc2``, ``mlp.act`` and ``pooled`` the inputs of ``mlp.fc2`` and
  ``head``, ``embed`` the input of block 0, a block the smallest module holding all its
  weights. q, k, v and the attention weights are read where the model computes them: the
  arguments of the fused attention call, the output of the softmax over keys, the operands of
  the q kᵀ and weights·v products; failing that, the outputs of separate q/k/v projections or
  the fused qkv projection split as timm's (3, H, hd). What cannot be seen (the weights inside a
  fused kernel) is listed as unseen with the reason. ``taps=`` overrides or adds entries.
* **Capture from outside**: forward hooks and a ``TorchFunctionMode`` in PyTorch; in MLX and
  Flax NNX each module of interest gets a subclass whose ``__call__`` records (the instance's
  class is swapped for the call and restored), in Flax linen ``nn.intercept_methods``; the
  framework's softmax, fused attention, matmul and scalar multiply are wrapped for the
  duration of the call. Captured tensors are
  copied at once, so a model that updates them in place later (``x += res``) is read right.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Mapping
import contextlib
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from conformance.report import ToolError, describe_exception
from impls.config import ViTConfig, tap_names


class LoadError(ValueError):
    """The mapped weights do not fit the model: names the keys and shapes."""


class Taps(dict):
    """What a captured forward returns: stage -> array, plus what it could not see and the
    findings of the load (``unseen``: stage -> reason; ``findings``: (stage, reason))."""

    def __init__(self, *args, unseen=None, findings=(), sources=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.unseen: dict[str, str] = dict(unseen or {})
        self.findings: list[tuple[str, str]] = list(findings)
        self.sources: dict[str, str] = dict(sources or {})
        self.dtypes: dict[str, str] = {}  # stage -> the dtype the model emitted it in (before any cast to NumPy)
        # A second pass off the model's own path (a fused kernel's internals read where a function
        # mode moves it onto another path): judged too, its stages named in ``sources``.
        self.second: Taps | None = None
        self.from_second: set[str] = set()  # stages here that only the second pass showed

    def own_pass(self) -> "Taps":
        """The stages read on the model's own path alone (a stage's local check then never takes
        its inputs from another pass)."""
        if not self.from_second:
            return self
        own = Taps({k: v for k, v in self.items() if k not in self.from_second}, unseen=self.unseen,
                   findings=self.findings, sources=self.sources)
        own.dtypes = {k: v for k, v in self.dtypes.items() if k not in self.from_second}
        return own


# ----------------------------------------------------------------------------- mapping

def _pattern(canonical: str) -> re.Pattern:
    body = re.escape(canonical).replace(re.escape("{i}"), r"(?P<i>\d+)")
    return re.compile(rf"(^|\.){body}(?=\.|$)")


def rename_function(table: Mapping[str, str | None] | Callable[[str], str | None]) -> Callable[[str], str | None]:
    """A key function from a rename table: each entry renames a dotted segment run at segment
    boundaries, in order (``"norm1": "ln_attn"``, ``"blocks.{i}.mlp.fc1": "layers.{i}.ff.0"``);
    an entry that maps to None drops the key (the model has no place for it)."""
    if callable(table):
        return table
    rules = [(_pattern(k), v) for k, v in table.items()]

    def rename(key: str) -> str | None:
        for pattern, new in rules:
            m = pattern.search(key)
            if m is None:
                continue
            if new is None:
                return None
            repl = new.replace("{i}", m.group("i")) if "i" in pattern.groupindex else new
            key = key[:m.start()] + m.group(1) + repl + key[m.end():]
        return key

    return rename


def _module_of(key: str) -> str:
    return key.rpartition(".")[0]


def _common_module(paths) -> str | None:
    parts = [p.split(".") if p else [] for p in paths]
    if not parts:
        return None
    common = []
    for segs in zip(*parts):
        if len(set(segs)) != 1:
            break
        common.append(segs[0])
    return ".".join(common)


# ----------------------------------------------------------------------------- frameworks

def framework_of(model) -> str:
    """The framework of a model object, from its class hierarchy (no framework is imported)."""
    modules = [c.__module__ for c in type(model).__mro__]
    if any(m.startswith("torch.nn") for m in modules):
        return "torch"
    if any(m.startswith("mlx.nn") for m in modules):
        return "mlx"
    if any(m.startswith("flax.nnx") for m in modules):
        return "nnx"
    if any(m.startswith("flax.linen") for m in modules):
        return "linen"
    raise TypeError(f"a model port needs a PyTorch, MLX, Flax NNX or Flax linen module, got {type(model).__name__}")


class _Adapter:
    """One framework's access to a model: its parameters, loading, and calling it with hooks."""

    name = ""

    def __init__(self, model):
        self.model = model
        self.call_kwargs: dict = {}  # ModelPort(call_kwargs=...): e.g. train=False

    def modules(self) -> dict[str, Any]:
        raise NotImplementedError

    def native(self, key: str, value: np.ndarray, shape: tuple) -> np.ndarray:
        """The canonical ``value`` in the layout of the model's ``key``: by the receiving
        module's type, always (a square kernel fits either way, so shapes cannot decide), then
        size-1 axes by shape (``pos_embed`` (1, N, D) into a (N, D) parameter)."""
        value = self.by_type(self.kind(_module_of(key)), key.rpartition(".")[2], value)
        if value.shape != tuple(shape) and value.size == int(np.prod(shape)) and \
                [d for d in value.shape if d != 1] == [d for d in shape if d != 1]:
            value = value.reshape(shape)
        return value

    def kind(self, path: str) -> str:
        """The class name of the module at ``path``."""
        return type(self.modules().get(path)).__name__

    def by_type(self, kind: str, leaf: str, value: np.ndarray) -> np.ndarray:
        return value  # PyTorch: the canonical layouts are its own

    def resolve(self, key: str, params: Mapping) -> str:
        """The model's name for a renamed key (Flax calls a weight kernel or scale)."""
        return key

    def fast_paths(self) -> list[str]:
        """Modules whose native kernel capture's function wrappers would switch off (none)."""
        return []

    supports_gradients = False
    channels_first = False  # a convolution's output is (B, D, h, w), not (B, h, w, D)

    def gradients(self, inputs, loss, forward: "CapturedForward"):
        """(loss value, {model key: gradient}, d loss / d inputs, {stage: cotangent} or None) of
        the framework's own loss (impls.*_vit.loss_value) of the model's logits."""
        from conformance.support import Unsupported

        raise Unsupported(f"gradients of a {self.name} model are not supported yet (only of PyTorch, MLX and "
                          "Flax NNX models)")


# PyTorch modules with a native fast path that a TorchFunctionMode switches off.
_TORCH_FAST_PATH = ("MultiheadAttention", "TransformerEncoderLayer")


class _TorchAdapter(_Adapter):
    name = "torch"
    supports_gradients = True
    channels_first = True

    def __init__(self, model):
        super().__init__(model)
        self._modules = dict(model.named_modules())
        self.retain = False  # record the graph's own tensors (a gradient pass), not copies
        self.autocast: str | None = None  # ModelPort(autocast=True): run under torch.autocast in this dtype

    def gradients(self, images, loss, forward: "CapturedForward"):
        """(value, {model key: gradient}, d value / d images, {stage: cotangent}) of the
        framework's loss of the model's logits by autograd, with the cotangent at every stage read at a
        module boundary (a module's input or output, the return value): the model runs once with
        the recorder keeping its own tensors with retain_grad, and each stage is read from their
        gradients as the forward reads it from their values (the same reshapes). Attention
        internals are not tapped."""
        import torch

        from impls.torch_vit import loss_value

        self.model.requires_grad_(True).zero_grad(set_to_none=True)
        x = images.detach().clone().requires_grad_(True)
        plan = forward.plan
        recorder = _Recorder(self, forward.config, x.shape[0], plan.blocks)
        self.retain = True
        try:
            out = self.run(x, recorder, plan.watch())
            logits = forward.logits(out)
            logits.retain_grad()
            value = loss_value(logits, loss)
            value.backward()
        finally:
            self.retain = False

        def grad_of(t):
            return t.grad if t.grad is not None else torch.zeros_like(t)

        recorder.inputs = {k: _map_arrays(v, grad_of, self.is_array) for k, v in recorder.inputs.items()}
        recorder.outputs = {k: _map_arrays(v, grad_of, self.is_array) for k, v in recorder.outputs.items()}
        taps = _boundary_taps(forward, recorder, self.numpy(grad_of(logits)))
        params = {k: self.numpy(p.grad) if p.grad is not None else np.zeros(tuple(p.shape), np.float32)
                  for k, p in self.model.named_parameters()}
        return value.item(), params, self.numpy(grad_of(x)), taps

    def modules(self):
        return self._modules

    def params(self) -> dict[str, tuple]:
        return {k: tuple(v.shape) for k, v in self.model.state_dict().items()}

    def current(self, key):
        return self.model.state_dict()[key].detach().float().numpy()

    def load(self, arrays: dict, dtype: str, cast: bool = True) -> None:
        """Strictly; ``cast``: every parameter to ``dtype`` (else each keeps the dtype the model
        built it in: load_state_dict copies into the existing tensors)."""
        import torch

        tensors = {k: torch.from_numpy(np.array(v, np.float32)) for k, v in arrays.items()}
        self.model.load_state_dict(tensors, strict=True)
        self.model.eval()
        if cast:
            self.model.to(getattr(torch, dtype))

    def to_input(self, images: np.ndarray, dtype: str):
        import torch

        return torch.tensor(images).to(getattr(torch, dtype))

    def numpy(self, x) -> np.ndarray:
        import torch

        return x.detach().float().numpy() if x.dtype == torch.bfloat16 else x.detach().numpy()  # NumPy: no bf16

    def is_array(self, x) -> bool:
        import torch

        return isinstance(x, torch.Tensor)

    def copy(self, x):
        if self.retain:  # a gradient pass: the tensor itself, whose gradient is the cotangent there
            if x.requires_grad:
                x.retain_grad()
            return x
        return x.detach().clone()

    def fast_paths(self) -> list[str]:
        """Modules whose native kernel a TorchFunctionMode would switch off (nn.MultiheadAttention
        and nn.TransformerEncoderLayer leave their fast path when any argument has a torch function):
        their model runs once on its own path with hooks only, and again for the internals."""
        return [p for p, m in self._modules.items() if type(m).__name__ in _TORCH_FAST_PATH
                and type(m).__module__.startswith("torch.nn")]

    def run(self, inputs, recorder: "_Recorder", watch: dict[str, tuple[bool, bool]], functions: bool = True):
        """The model on ``inputs`` with forward hooks at ``watch``; with ``functions`` also a
        TorchFunctionMode that records softmax, fused attention and the attention products
        (without it the model runs exactly its own path, native kernels included)."""
        import torch
        import torch.nn.functional as F
        from torch.overrides import TorchFunctionMode

        handles = []
        for path, (want_in, want_out) in watch.items():
            module = self._modules[path]
            if want_in:
                handles.append(module.register_forward_pre_hook(
                    lambda m, args, kwargs, path=path: recorder.enter(path, _first_array(args, kwargs, self)),
                    with_kwargs=True))
            if want_out:
                handles.append(module.register_forward_hook(
                    lambda m, args, output, path=path: recorder.leave(path, output)))

        sdpa = F.scaled_dot_product_attention
        on = _callbacks(recorder)
        on_sdpa = on.fused("F.scaled_dot_product_attention", True, ("query", "key", "value"))
        hooks = {"softmax": on.softmax, "matmul": on.product, "__matmul__": on.product, "bmm": on.product,
                 "einsum": on.einsum, **dict.fromkeys(("mul", "__mul__", "__rmul__", "div", "__truediv__"), on.scale)}

        # F.multi_head_attention_forward runs whole under the mode (a mode is off inside its own
        # handler): its internals are recorded by wrapping the functions it calls for that call.
        mha = F.multi_head_attention_forward
        inside_mha = [(F, "scaled_dot_product_attention", _wrapped(sdpa, on_sdpa)),
                      (F, "softmax", _wrapped(F.softmax, on.softmax)),
                      (torch, "bmm", _wrapped(torch.bmm, on.product)),
                      (torch, "baddbmm", _wrapped(torch.baddbmm, lambda a, k, out: on.product(a[1:], k, out)))]

        class Intercept(TorchFunctionMode):
            def __torch_function__(self, func, types, args=(), kwargs=None):
                kwargs = kwargs or {}
                if func is mha:
                    with _patched(inside_mha):
                        out = func(*args, **kwargs)
                    recorder.scaled_inside("F.multi_head_attention_forward")
                    return out
                out = func(*args, **kwargs)
                hook = on_sdpa if func is sdpa else hooks.get(getattr(func, "__name__", ""))
                if hook is not None:
                    hook(args, kwargs, out)
                return out

        native = torch._native_multi_head_attention

        def native_mha(*args, **kwargs):  # the fast path ran: noted, not changed
            recorder.native(args[0] if args else None)
            return native(*args, **kwargs)

        autocast = (torch.autocast(inputs.device.type, dtype=getattr(torch, self.autocast)) if self.autocast
                    else contextlib.nullcontext())
        try:
            torch._native_multi_head_attention = native_mha
            with (torch.enable_grad() if self.retain else torch.no_grad()), autocast, \
                    (Intercept() if functions else contextlib.nullcontext()):
                return self.model(inputs, **self.call_kwargs)
        finally:
            torch._native_multi_head_attention = native
            for h in handles:
                h.remove()


def _boundary_taps(forward: "CapturedForward", recorder: "_Recorder", logits_grad) -> dict[str, np.ndarray]:
    """Every stage the forward reads at a module boundary (a module's input or output, the
    return value), read from a recorder holding cotangents instead of values: the same reshapes."""
    taps = {}
    for stage in tap_names(forward.config):
        source = forward.plan.sources.get(stage)
        if source is None or source.kind not in ("in", "out", "return"):
            continue
        try:
            taps[stage] = logits_grad if source.kind == "return" else forward._read(source, stage, recorder, None)[0]
        except (_Unseen, _Never):
            continue
    return taps


def _first_array(args, kwargs, adapter):
    for a in list(args) + list(kwargs.values()):
        if adapter.is_array(a):
            return a
    return None


class _SwapAdapter(_Adapter):
    """MLX and Flax NNX: modules are recorded by swapping the instance's class for a subclass
    whose ``__call__`` records, for the duration of one call."""

    def _wrap_modules(self, recorder, watch):
        swapped = []
        for path, (want_in, want_out) in watch.items():
            module = self.modules()[path]
            cls = type(module)

            def call(obj, *args, __cls=cls, __path=path, __in=want_in, __out=want_out, **kwargs):
                if __in:
                    recorder.enter(__path, _first_array(args, kwargs, self))
                out = __cls.__call__(obj, *args, **kwargs)
                if __out:
                    recorder.leave(__path, out)
                return out

            module.__class__ = type(cls.__name__, (cls,), {"__call__": call, "__module__": cls.__module__})
            swapped.append((module, cls))
        return swapped

    def run(self, inputs, recorder, watch, functions: bool = True):
        swapped = self._wrap_modules(recorder, watch)
        try:
            with _patched(self.patches(recorder)):
                return self.call(inputs)
        finally:
            for module, cls in reversed(swapped):  # a module shared by two paths was swapped twice
                module.__class__ = cls

    def call(self, inputs):
        return self.model(inputs, **self.call_kwargs)

    def patches(self, recorder) -> list:
        return []


@contextmanager
def _patched(patches):
    """Framework functions replaced by their recording wrappers, restored however the call ends."""
    saved = [(owner, attr, getattr(owner, attr)) for owner, attr, _ in patches]
    try:
        for owner, attr, new in patches:
            setattr(owner, attr, new)
        yield
    finally:
        for owner, attr, old in saved:
            setattr(owner, attr, old)


def _wrapped(fn, on_call):
    def wrapper(*args, **kwargs):
        out = fn(*args, **kwargs)
        on_call(args, kwargs, out)
        return out
    return wrapper


def _callbacks(recorder):
    """The recorder's hooks for wrapped framework functions, each acting inside a block only."""
    from types import SimpleNamespace

    def inside(fn):
        def hook(args, kwargs, out):
            if recorder.block is not None:
                fn(args, kwargs, out)
        return hook

    def fused(where, heads_first, names):
        return inside(lambda a, k, out: recorder.fused(*(list(a) + [k.get(n) for n in names])[:3], where,
                                                       heads_first=heads_first))

    return SimpleNamespace(
        softmax=inside(lambda a, k, out: recorder.softmax(out)),
        product=inside(lambda a, k, out: recorder.product(a[0], a[1], out, None)),
        einsum=inside(lambda a, k, out: recorder.product(a[1], a[2], out, a[0]) if len(a) == 3 else None),
        scale=inside(lambda a, k, out: recorder.scalar_op(a, out)),
        fused=fused)


class _MLXAdapter(_SwapAdapter):
    name = "mlx"
    supports_gradients = True

    def by_type(self, kind, leaf, value):
        return np.ascontiguousarray(value.transpose(0, 2, 3, 1)) if kind.startswith("Conv") and value.ndim == 4 \
            else value  # OIHW -> OHWI

    def __init__(self, model):
        super().__init__(model)
        self._modules = dict(model.named_modules())

    def modules(self):
        return self._modules

    def params(self):
        from mlx.utils import tree_flatten

        return {k: tuple(v.shape) for k, v in tree_flatten(self.model.parameters())}

    def current(self, key):
        from mlx.utils import tree_flatten

        import mlx.core as mx

        return np.array(dict(tree_flatten(self.model.parameters()))[key].astype(mx.float32))

    def load(self, arrays, dtype, cast=True):
        import mlx.core as mx
        from mlx.utils import tree_flatten

        own = {k: v.dtype for k, v in tree_flatten(self.model.parameters())}
        self.model.load_weights([(k, mx.array(np.asarray(v, np.float32)) if cast else
                                  mx.array(np.asarray(v, np.float32)).astype(own.get(k, mx.float32)))
                                 for k, v in arrays.items()], strict=True)
        self.model.eval()
        if cast and dtype != "float32":
            self.model.set_dtype(getattr(mx, dtype))

    def to_input(self, images, dtype):
        import mlx.core as mx

        return mx.array(images).astype(getattr(mx, dtype))

    def gradients(self, images, loss, forward: "CapturedForward"):
        """As the PyTorch adapter's: the cotangent at every stage read at a module boundary,
        here as the gradient of a zero added to each watched module's first call's input or
        output (MLX keeps no gradients on intermediate arrays), inside mx.value_and_grad over
        the parameters, the images and those zeros. A first recording run gives their shapes."""
        import mlx.core as mx
        from mlx.utils import tree_flatten

        from impls.mlx_vit import loss_value

        plan, watch = forward.plan, forward.plan.watch()
        shapes = _Recorder(self, forward.config, images.shape[0], plan.blocks)
        out = self.run(images, shapes, watch)
        logits = forward.logits(out)
        zeros = {("in", k): mx.zeros(v.shape, v.dtype) for k, v in shapes.inputs.items() if self.is_array(v)}
        zeros |= {("out", k): mx.zeros(v.shape, v.dtype) for k, v in shapes.outputs.items() if self.is_array(v)}
        zeros[("return", "")] = mx.zeros(logits.shape, logits.dtype)

        def f(params, x, added):
            self.model.update(params)
            swapped, seen = [], set()
            for path in {p for _, p in added if p}:
                module = self.modules()[path]
                cls = type(module)

                def call(obj, *args, __cls=cls, __path=path, **kwargs):
                    first = __path not in seen
                    seen.add(__path)
                    if first and ("in", __path) in added:
                        i = next(i for i, a in enumerate(args) if self.is_array(a))
                        args = (*args[:i], args[i] + added[("in", __path)], *args[i + 1:])
                    out = __cls.__call__(obj, *args, **kwargs)
                    return out + added[("out", __path)] if first and ("out", __path) in added else out

                module.__class__ = type(cls.__name__, (cls,), {"__call__": call, "__module__": cls.__module__})
                swapped.append((module, cls))
            try:
                out = self.model(x, **self.call_kwargs)
            finally:
                for module, cls in reversed(swapped):
                    module.__class__ = cls
            return loss_value(forward.logits(out) + added[("return", "")], loss)

        keys = list(zeros)
        value, (g_params, g_x, g_zeros) = mx.value_and_grad(
            lambda params, x, z: f(params, x, dict(zip(keys, z))), argnums=(0, 1, 2))(
            self.model.trainable_parameters(), images, [zeros[k] for k in keys])
        mx.eval(value, g_params, g_x, g_zeros)
        grads = dict(zip(keys, g_zeros))
        recorder = _Recorder(self, forward.config, images.shape[0], plan.blocks)
        recorder.inputs = {p: grads[("in", p)] for kind, p in keys if kind == "in"}
        recorder.outputs = {p: grads[("out", p)] for kind, p in keys if kind == "out"}
        taps = _boundary_taps(forward, recorder, self.numpy(grads[("return", "")]))
        return float(value), {k: self.numpy(v) for k, v in tree_flatten(g_params)}, self.numpy(g_x), taps

    def numpy(self, x):
        import mlx.core as mx

        return np.array(x.astype(mx.float32) if x.dtype == mx.bfloat16 else x)

    def is_array(self, x):
        import mlx.core as mx

        return isinstance(x, mx.array)

    def copy(self, x):
        return x

    def patches(self, recorder):
        import mlx.core as mx
        import mlx.nn as nn

        on = _callbacks(recorder)
        softmax = _wrapped(mx.softmax, on.softmax)
        return [(mx.fast, "scaled_dot_product_attention",
                 _wrapped(mx.fast.scaled_dot_product_attention,
                          on.fused("mx.fast.scaled_dot_product_attention", True, ("q", "k", "v")))),
                (mx, "softmax", softmax),
                # nn.softmax is mx.softmax under mx.compile, whose tracing would hand the wrapper a
                # placeholder: called directly for the capture (the same single kernel).
                (nn, "softmax", lambda x, axis=-1: softmax(x, axis=axis)),
                (mx, "matmul", _wrapped(mx.matmul, on.product)),
                (mx, "einsum", _wrapped(mx.einsum, on.einsum)),
                (mx.array, "__matmul__", _wrapped(mx.array.__matmul__, on.product)),
                (mx.array, "__mul__", _wrapped(mx.array.__mul__, on.scale)),
                (mx.array, "__truediv__", _wrapped(mx.array.__truediv__, on.scale))]


class _JAXArrays:
    """What Flax NNX and linen share: JAX arrays, Flax's layouts and names, and the wrapped JAX
    functions (jax.nn's softmax and fused attention, jnp's matmul and einsum)."""

    def by_type(self, kind, leaf, value):
        if kind == "Conv" and leaf == "kernel" and value.ndim == 4:
            return np.ascontiguousarray(value.transpose(2, 3, 1, 0))  # OIHW -> HWIO
        if kind in ("Linear", "Dense") and leaf == "kernel" and value.ndim == 2:
            return np.ascontiguousarray(value.T)  # (out, in) -> (in, out)
        return value

    def resolve(self, key, params):
        if key in params or not key.endswith(".weight"):
            return key
        for leaf in ("kernel", "scale"):
            if key[:-len("weight")] + leaf in params:
                return key[:-len("weight")] + leaf
        return key

    def to_input(self, images, dtype):
        import jax.numpy as jnp

        return jnp.asarray(images).astype(getattr(jnp, dtype))

    def numpy(self, x):
        return np.asarray(x, np.float32) if str(x.dtype) == "bfloat16" else np.asarray(x)

    def is_array(self, x):
        import jax

        return isinstance(x, jax.Array)

    def copy(self, x):
        return x

    def patches(self, recorder):
        import jax
        import jax.numpy as jnp
        from flax import nnx

        on = _callbacks(recorder)
        softmax = _wrapped(jax.nn.softmax, on.softmax)
        return [(jax.nn, "dot_product_attention", _wrapped(jax.nn.dot_product_attention, on.fused(
                    "jax.nn.dot_product_attention", False, ("query", "key", "value")))),
                (jax.nn, "softmax", softmax), (nnx, "softmax", softmax),
                (jnp, "matmul", _wrapped(jnp.matmul, on.product)),
                (jnp, "einsum", _wrapped(jnp.einsum, on.einsum))]


class _NNXAdapter(_JAXArrays, _SwapAdapter):
    name = "nnx"
    supports_gradients = True

    def __init__(self, model):
        from flax import nnx

        super().__init__(model)
        self._modules = {".".join(map(str, p)): n for p, n in nnx.iter_graph(model) if isinstance(n, nnx.Module)}

    def modules(self):
        return self._modules

    def _params(self):
        from flax import nnx

        return {".".join(map(str, p)): n for p, n in nnx.iter_graph(self.model) if isinstance(n, nnx.Param)}

    def params(self):
        return {k: tuple(v.get_value().shape) for k, v in self._params().items()}

    def current(self, key):
        value = self._params()[key].get_value()
        if not hasattr(value, "__array__"):  # built with nnx.eval_shape: nothing to keep
            raise LoadError(f"the model was built abstractly (nnx.eval_shape) and the mapping leaves {key!r} unfilled")
        return np.asarray(value, np.float32)

    def gradients(self, inputs, loss, forward: "CapturedForward"):
        """By a jitted jax.value_and_grad over the model's nnx.Param state and the inputs, one
        program per loss kind (and batch shape): eager, every op would compile on its own. No
        tap cotangents: the model is located at its first wrong parameter gradient."""
        from flax import nnx

        from impls.config import Loss
        from impls.jax_vit import loss_value

        def objective(out, loss):
            return loss_value(forward.logits(out), loss)

        graphdef, params, rest = nnx.split(self.model, nnx.Param, ...)
        compiled = self.__dict__.setdefault("_compiled_grad", {})
        if loss.kind not in compiled:
            import jax

            def f(params, x, labels, weights):
                model = nnx.merge(graphdef, params, rest)
                return objective(model(x, **self.call_kwargs), Loss(loss.kind, labels=labels, weights=weights))

            compiled[loss.kind] = jax.jit(jax.value_and_grad(f, argnums=(0, 1)))
        value, (g_params, g_x) = compiled[loss.kind](params, inputs, loss.labels, loss.weights)
        grads = {".".join(map(str, path)): self.numpy(v.get_value() if isinstance(v, nnx.Variable) else v)
                 for path, v in nnx.to_flat_state(g_params)}
        return float(value), grads, self.numpy(g_x), None

    def load(self, arrays, dtype, cast=True):
        import jax.numpy as jnp

        params = self._params()
        for key, value in arrays.items():
            target = getattr(jnp, dtype) if cast else params[key].get_value().dtype
            params[key].set_value(jnp.asarray(np.asarray(value, np.float32)).astype(target))


class _LinenAdapter(_JAXArrays, _Adapter):
    """A Flax linen module (unbound) and its variables: shapes and module types from an
    abstract ``init`` (no initializer runs), calls recorded through ``nn.intercept_methods``."""

    name = "linen"

    def __init__(self, model, example):
        import flax.linen as nn
        import jax

        super().__init__(model)
        self._types: dict[str, str] = {}

        def note(next_fun, args, kwargs, context):
            self._types.setdefault(".".join(context.module.path), type(context.module).__name__)
            return next_fun(*args, **kwargs)

        with nn.intercept_methods(note):
            variables = jax.eval_shape(lambda: model.init(jax.random.key(0), example))
        extra = sorted(set(variables) - {"params"})
        if extra:
            raise LoadError(f"the linen model has variable collections besides params: {extra}")
        self._shapes = {".".join(path): tuple(leaf.shape) for path, leaf in _flatten(variables["params"])}
        self._dtypes = {".".join(path): leaf.dtype for path, leaf in _flatten(variables["params"])}
        self.variables = None

    def modules(self):
        return self._types

    def params(self):
        return self._shapes

    def kind(self, path):
        return self._types.get(path, "")

    def current(self, key):
        raise LoadError(f"a linen model's parameters come from the mapping alone; it leaves {key!r} unfilled")

    def load(self, arrays, dtype, cast=True):
        import jax.numpy as jnp

        tree: dict = {}
        for key, value in arrays.items():
            *parents, leaf = key.split(".")
            node = tree
            for p in parents:
                node = node.setdefault(p, {})
            target = getattr(jnp, dtype) if cast else self._dtypes.get(key, jnp.float32)
            node[leaf] = jnp.asarray(np.asarray(value, np.float32)).astype(target)
        self.variables = {"params": tree}

    def run(self, inputs, recorder, watch, functions: bool = True):
        import flax.linen as nn

        def intercept(next_fun, args, kwargs, context):
            path = ".".join(context.module.path)
            want_in, want_out = watch.get(path, (False, False)) if context.method_name == "__call__" else (0, 0)
            if want_in:
                recorder.enter(path, _first_array(args, kwargs, self))
            out = next_fun(*args, **kwargs)
            if want_out:
                recorder.leave(path, out)
            return out

        with _patched(self.patches(recorder)), nn.intercept_methods(intercept):
            return self.model.apply(self.variables, inputs, **self.call_kwargs)


def _flatten(tree, prefix=()):
    for k, v in tree.items():
        if isinstance(v, Mapping):
            yield from _flatten(v, prefix + (str(k),))
        else:
            yield prefix + (str(k),), v


ADAPTERS = {"torch": _TorchAdapter, "mlx": _MLXAdapter, "nnx": _NNXAdapter, "linen": _LinenAdapter}


# ----------------------------------------------------------------------------- recording

def _guarded(method):
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


class _Recorder:
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
            raise ToolError(f"capture failed while recording the forward: {describe_exception(self.error)}") \
                from self.error

    @_guarded
    def native(self, query):
        """torch._native_multi_head_attention ran in this block (nn.MultiheadAttention's fast path)."""
        self._slot().setdefault("native", "torch._native_multi_head_attention (nn.MultiheadAttention's native "
                                          "fast path)")

    @_guarded
    def scaled_inside(self, where):
        """q was scaled inside ``where`` before q kᵀ, where no scalar multiply is seen: the left
        operand of q kᵀ is not q."""
        slot = self._slot()
        if "logits_q" in slot and "q" not in slot:
            slot.setdefault("q_scaled", where)

    @_guarded
    def enter(self, path, value):
        self.calls[path] = self.calls.get(path, 0) + 1
        if path in self.blocks:
            self.block = self.blocks[path]
        if path not in self.inputs and value is not None:
            self.inputs[path] = self.adapter.copy(value)

    @_guarded
    def leave(self, path, output):
        if path in self.blocks:
            self.block = None
        if path not in self.inputs:  # a module watched for its output only
            self.calls[path] = self.calls.get(path, 0) + 1
        if path not in self.outputs:
            self.outputs[path] = _map_arrays(output, self.adapter.copy, self.adapter.is_array)

    def _slot(self):
        return self.attn.setdefault(self.block, {})

    def _is(self, x, *tail) -> bool:
        return self.adapter.is_array(x) and tuple(x.shape[-len(tail):]) == tail and len(x.shape) >= 3

    @_guarded
    def fused(self, q, k, v, where, heads_first):
        slot = self._slot()
        if "q" not in slot and all(self.adapter.is_array(t) for t in (q, k, v)):
            copy = self.adapter.copy
            slot.update(q=copy(q), k=copy(k), v=copy(v), heads_first=heads_first, where=f"the q, k, v arguments of "
                        f"{where}", fused=where)

    @_guarded
    def softmax(self, out):
        slot = self._slot()
        if "weights" not in slot and self._is(out, self.N, self.N):
            slot["weights"] = self.adapter.copy(out)

    @_guarded
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

    @_guarded
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
            slot["logits_k"] = self.adapter.copy(_swap_last(b) if k_transposed else b)
        elif "logits_q" in slot and "product_v" not in slot and self._is(a, N, N) and self._is(b, N, hd):
            slot["product_v"] = self.adapter.copy(b)


def _swap_last(x):
    axes = list(range(len(x.shape)))
    axes[-1], axes[-2] = axes[-2], axes[-1]
    return x.permute(*axes) if hasattr(x, "permute") else x.transpose(axes)


def _map_arrays(x, fn, is_array):
    if is_array(x):
        return fn(x)
    if isinstance(x, (tuple, list)):
        return type(x)(_map_arrays(v, fn, is_array) for v in x) if not hasattr(x, "_fields") else x
    return x


def _arrays_in(x, is_array):
    """The arrays an output holds: itself, a tuple's elements, a mapping's or ModelOutput's values."""
    if is_array(x):
        return [x]
    if isinstance(x, Mapping) or hasattr(x, "to_tuple"):
        return [v for v in (x.values() if isinstance(x, Mapping) else x.to_tuple()) if is_array(v)]
    if isinstance(x, (tuple, list)):
        return [a for v in x for a in _arrays_in(v, is_array)]
    return []


# ----------------------------------------------------------------------------- the plan

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


def _kind_name(module) -> str:
    return module if isinstance(module, str) else type(module).__name__


def _caller(path: str, modules: Mapping[str, Any]) -> str:
    """The module that uses ``path``'s parameters: itself, or its parent where the parent reads
    them directly (torch's MultiheadAttention and its out_proj)."""
    parent, _, leaf = path.rpartition(".")
    if parent in modules and leaf in _USED_BY_PARENT.get(_kind_name(modules[parent]), ()):
        return parent
    return path


def _config_argument(fn, positional: int | None, keyword: str = "config") -> str | None:
    """How ``fn`` takes its second argument: "keyword" (it names ``keyword`` or takes **kwargs),
    "positional" (it requires ``positional`` arguments, or takes *args), or None."""
    import inspect

    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # a builtin or C callable: called with its one argument
        return None
    kinds = inspect.Parameter
    if any(p.name == keyword and p.kind != kinds.POSITIONAL_ONLY for p in params) or \
            (keyword != "config" and any(p.kind == kinds.VAR_KEYWORD for p in params)):
        return "keyword"
    if positional is None:
        return None
    required = [p for p in params if p.kind in (kinds.POSITIONAL_ONLY, kinds.POSITIONAL_OR_KEYWORD)
                and p.default is p.empty]
    if len(required) >= positional or any(p.kind == kinds.VAR_POSITIONAL for p in params):
        return "positional"
    return None


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
        keys = [k for k in key_map if _module_of(k) == canonical_module]
        return list(dict.fromkeys(_module_of(m) for k in sorted(keys, reverse=True) for m in key_map[k]))

    def one(canonical_module: str, stage: str) -> str | None:
        found = [_caller(m, modules) for m in owners(canonical_module)]
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
        path = _common_module({_module_of(mk) for k in keys for mk in key_map[k]})
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
            elif len(qkv) == 1 and _kind_name(modules.get(qkv[0])) in ATTENTION_MODULES:
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
        pool = _common_module({_module_of(mk) for k in keys for mk in key_map[k]})
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


# ----------------------------------------------------------------------------- the port

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

    def __post_init__(self):
        if (self.rename is None) == (self.convert is None):
            raise TypeError("ModelPort needs exactly one of rename= (names) or convert= (a state -> state function)")
        if self.images not in ("NCHW", "NHWC"):
            raise ValueError(f"images must be 'NCHW' or 'NHWC', got {self.images!r}")

    def with_taps(self, taps: Mapping[str, str]) -> "ModelPort":
        from dataclasses import replace

        return replace(self, taps={**self.taps, **taps})

    # -- weights

    def _convert(self, state, config):
        how = _config_argument(self.convert, positional=2)
        return (self.convert(state, config=config) if how == "keyword" else
                self.convert(state, config) if how == "positional" else self.convert(state))

    def _build(self, config: ViTConfig, dtype: str):
        """(model, whether the model chose its own parameter dtypes)."""
        if _config_argument(self.build, positional=None, keyword="dtype") == "keyword":
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

    def mapped(self, state: Mapping[str, np.ndarray], adapter: _Adapter, config: ViTConfig) -> tuple[dict, list[str]]:
        """The model's arrays from the canonical state, strictly: (arrays, unfilled model keys)."""
        params = adapter.params()
        if self.rename is not None:
            rename = rename_function(self.rename)
            arrays = {}
            for k, v in state.items():
                mk = rename(k)
                if mk is None:
                    continue
                mk = adapter.resolve(mk, params)
                if mk in arrays:
                    raise LoadError(f"the rename sends two canonical keys to {mk!r} (the second is {k!r})")
                arrays[mk] = adapter.native(mk, np.asarray(v), params.get(mk, np.shape(v)))
        else:
            arrays = {k: np.asarray(v) for k, v in self._convert(dict(state), config).items()}
        unknown = sorted(set(arrays) - set(params))
        if unknown:
            import difflib

            near = difflib.get_close_matches(unknown[0], sorted(set(params) - set(arrays)), n=3, cutoff=0.5)
            raise LoadError(f"the mapping gives {len(unknown)} key(s) the model does not have: "
                            f"{', '.join(repr(k) for k in unknown[:8])}{' ...' if len(unknown) > 8 else ''}; "
                            f"closest model keys to {unknown[0]!r}: {', '.join(repr(k) for k in near) or 'none'}")
        wrong = [f"{k!r}: mapped {tuple(arrays[k].shape)}, the model has {params[k]}" for k in sorted(arrays)
                 if tuple(arrays[k].shape) != tuple(params[k])]
        if wrong:
            raise LoadError(f"{len(wrong)} shape mismatch(es): " + "; ".join(wrong[:6]))
        unfilled = sorted(set(params) - set(arrays))
        for k in unfilled:
            arrays[k] = adapter.current(k)
        return arrays, unfilled

    # -- the factory

    def __call__(self, config: ViTConfig, state: Mapping[str, np.ndarray], dtype: str = "float32"):
        from conformance.support import check_supported, supports_of

        check_supported(supports_of(self), config)
        model, chosen = self._build(config, dtype)
        framework = framework_of(model)
        if self.autocast and framework != "torch":
            raise TypeError(f"ModelPort(autocast=True) runs a PyTorch model under torch.autocast; this is a "
                            f"{framework} model (give build a dtype= argument instead)")
        if framework == "linen":  # unbound: shapes come from an abstract init on an image of this config
            import jax.numpy as jnp

            H, W = config.img_size
            shape = (1, H, W, config.in_chans) if self.images == "NHWC" else (1, config.in_chans, H, W)
            adapter = _LinenAdapter(model, jnp.zeros(shape, jnp.float32))
        else:
            adapter = ADAPTERS[framework](model)
        adapter.call_kwargs = dict(self.call_kwargs)
        key_map = self.key_map(state, config)
        dropped = sorted(k for k, targets in key_map.items() if not targets and not k.startswith("head."))
        if dropped:
            raise LoadError(f"the mapping drops canonical keys the model needs: {', '.join(dropped[:8])}")
        arrays, unfilled = self.mapped(state, adapter, config)
        mixed = self.autocast and dtype != "float32"
        adapter.load(arrays, dtype, cast=not (chosen or self.autocast))
        if mixed:
            adapter.autocast = dtype
        has_head = any(key_map.get(k) for k in ("head.weight", "head.bias"))
        try:
            plan = infer_plan(config, key_map, adapter.modules(), self.taps, has_head)
        except TapOverrideError:
            raise
        except Exception as e:  # noqa: BLE001 - the plan is the tool's
            raise ToolError(f"capture could not plan the taps: {describe_exception(e)}") from e
        findings = []
        if unfilled:
            findings.append(("load", f"the model has {len(unfilled)} parameter(s) the canonical weights do not fill, "
                                     f"left at the model's initial values: {', '.join(unfilled[:6])}"
                                     + (" ..." if len(unfilled) > 6 else "")))
        forward = CapturedForward(self, adapter, plan, config, dtype, findings)
        forward.input_dtype = "float32" if mixed else dtype  # autocast casts the model's inputs itself
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
        adapter = forward.adapter
        if not adapter.supports_gradients:
            adapter.gradients(None, None, forward)  # raises Unsupported, naming the framework
        where = self.entry_map(state, adapter, config)

        def grad(images, loss):
            images = np.asarray(images)
            x = images.transpose(0, 2, 3, 1) if self.images == "NHWC" else images
            value, native, g_x, taps = adapter.gradients(adapter.to_input(np.ascontiguousarray(x), dtype), loss,
                                                         forward)
            params = {}
            for key, targets in where.items():
                g = np.zeros(state[key].size, np.float64)
                for mk, index in targets:
                    taken = index >= 0
                    np.add.at(g, index[taken], np.asarray(native[mk], np.float64).ravel()[taken])
                params[key] = g.reshape(state[key].shape)
            out = {"loss": value, "params": params, "images": g_x.transpose(0, 3, 1, 2) if self.images == "NHWC" else g_x}
            return out if taps is None else out | {"taps": taps}

        return grad

    def entry_map(self, state, adapter: _Adapter, config: ViTConfig) -> dict[str, list[tuple[str, np.ndarray]]]:
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
            converted = self._convert({n: probe[n] if n == k else np.zeros(np.shape(w), np.float32)
                                       for n, w in state.items()}, config)
            for mk, value in converted.items():
                index = np.asarray(value, np.float64).ravel()
                if not np.any(index):
                    continue
                whole = index == np.round(index)
                if not np.all(whole[index != 0]) or index.max() > np.size(v):
                    raise LoadError(f"the convert function does more than re-lay out {k!r} (into {mk!r}: it scales or "
                                    "mixes entries), so its gradient cannot be brought back")
                # -1 where the model's entry does not come from k; an entry sent to two places (tied
                # weights) gets both gradients summed by np.add.at, the adjoint of a copy
                out[k].append((mk, index.astype(np.int64) - 1))
        return out


class CapturedForward:
    """forward(images) -> Taps: runs the unmodified model once and reads every planned tap."""

    def __init__(self, port: ModelPort, adapter: _Adapter, plan: Plan, config: ViTConfig, dtype: str, findings):
        self.port, self.adapter, self.plan, self.config, self.dtype = port, adapter, plan, config, dtype
        self.findings = findings
        self.input_dtype = dtype
        self._emitted: str | None = None

    def __call__(self, images) -> Taps:
        images = np.asarray(images)
        x = images.transpose(0, 2, 3, 1) if self.port.images == "NHWC" else images
        inputs = self.adapter.to_input(np.ascontiguousarray(x), self.input_dtype)
        fast = self.adapter.fast_paths()
        if not fast:
            return self._pass(inputs, images.shape[0], functions=True)
        # The model's own path first (hooks only: its native kernels run as for its user), then
        # the internals those kernels hide, read in a second pass that leaves them; both are judged.
        taps = self._pass(inputs, images.shape[0], functions=False)
        second = self._pass(inputs, images.shape[0], functions=True)
        for stage, why in second.unseen.items():
            if stage in taps.unseen and taps.unseen[stage] != why:
                taps.unseen[stage] = f"{taps.unseen[stage]} on the model's own path, and {why} off it"
        for stage in second:
            if stage in taps:
                continue
            own = taps.unseen.pop(stage, "not read")
            second.sources[stage] = (f"{second.sources[stage]}, in a second pass under a TorchFunctionMode (on the "
                                     f"model's own path: {own})")
            taps.sources[stage] = second.sources[stage]
            taps[stage] = second[stage]
            if stage in second.dtypes:
                taps.dtypes[stage] = second.dtypes[stage]
            taps.from_second.add(stage)
        taps.second = second
        return taps

    def _pass(self, inputs, batch: int, functions: bool) -> Taps:
        recorder = _Recorder(self.adapter, self.config, batch, self.plan.blocks)
        out = self.adapter.run(inputs, recorder, self.plan.watch(), functions=functions)
        recorder.raise_error()
        taps = Taps(unseen=self.plan.unseen, findings=list(self.findings))
        for stage in tap_names(self.config):
            source = self.plan.sources.get(stage)
            if source is None:
                continue
            try:
                self._emitted = None
                value, where = self._read(source, stage, recorder, out)
            except _Unseen as e:
                taps.unseen[stage] = str(e)
                continue
            except _Never as e:
                taps.findings.append((stage, str(e)))
                continue
            except Exception as e:  # noqa: BLE001 - reading a recorded tensor is the tool's job
                raise ToolError(f"capture failed reading stage {stage} ({source.kind} {source.path or ''}".rstrip()
                                + f"): {describe_exception(e)}") from e
            taps[stage] = value
            taps.sources[stage] = where
            if self._emitted:
                taps.dtypes[stage] = self._emitted
        return taps

    def logits(self, out):
        """The logits in the model's output: ``output=``, else its first array."""
        return self.port.output(out) if self.port.output else _arrays_in(out, self.adapter.is_array)[0]

    def _np(self, x) -> np.ndarray:
        """A recorded array as NumPy, noting the dtype the model emitted it in."""
        self._emitted = str(getattr(x, "dtype", "")).rsplit(".", 1)[-1]
        return self.adapter.numpy(x)

    def _array(self, x, stage):
        arrays = _arrays_in(x, self.adapter.is_array)
        if not arrays:
            raise _Unseen(f"its module returned {type(x).__name__}, not an array")
        return arrays[0]

    def _read(self, source: Source, stage: str, rec: _Recorder, out):
        c = self.config
        B = rec.B
        if source.kind == "return":
            logits = self.port.output(out) if self.port.output else self._array(out, stage)  # names an empty output
            if source.part == "pooled" and len(getattr(logits, "shape", ())) == 3:
                raise _Never(f"a headless model's output is its pooled features (B, D); it returned "
                             f"{tuple(logits.shape)} tokens: give ModelPort(output=...) its pooled output")
            what = "the model's return value" + (" (a headless model's pooled features)" if source.part else "")
            return self._np(logits), what
        if source.kind in ("in", "out"):
            store = rec.inputs if source.kind == "in" else rec.outputs
            if source.path not in store:
                raise _Never(f"the module {source.path!r} that holds its weights was never called: its weights "
                             "take no part in the forward")
            x = self._np(self._array(store[source.path], stage))
            where = f"{'input' if source.kind == 'in' else 'output'} of {source.path}"
            if source.shape == "patches" and x.ndim == 4:
                if self.adapter.channels_first:  # a convolution's (B, D, gh, gw)
                    x = x.reshape(B, c.embed_dim, -1).transpose(0, 2, 1)
                else:
                    x = x.reshape(B, -1, c.embed_dim)
            if source.shape == "heads":
                x = _heads(x, c)
            return x, where
        # attention records
        slot = rec.attn.get(source.block, {})
        part = source.part
        if part == "weights":
            if "weights" in slot:
                return self._heads4(self._np(slot["weights"]), c.num_tokens), "the softmax over keys"
            raise _Unseen(f"computed inside {slot['fused']} (a fused kernel)" if "fused" in slot else
                          f"computed inside {slot['native']}" if "native" in slot else
                          "no softmax over (N, N) logits was seen in this block")
        if part in slot:
            x = self._np(slot[part])
            if not slot.get("heads_first", True):
                x = x.transpose(0, 2, 1, 3)  # (B, N, H, hd) -> (B, H, N, hd)
            return self._heads4(x, c.head_dim), slot["where"]
        product = {"q": "logits_q", "k": "logits_k", "v": "product_v"}[part]
        if part == "q" and "q_scaled" in slot:
            raise _Unseen(f"scaled inside {slot['q_scaled']} before q kᵀ, where capture sees no multiply "
                          "(need_weights=True; with need_weights=False q is an argument of the fused attention)")
        if product in slot:
            what = {"q": "the left operand of q kᵀ (before any scalar scale)", "k": "the right operand of q kᵀ",
                    "v": "the right operand of weights · v"}[part]
            return self._heads4(self._np(slot[product]), c.head_dim), what
        kind, path = source.fallback or ("", "")
        if kind == "heads" and path in rec.outputs:
            return _heads(self._np(self._array(rec.outputs[path], stage)), c), f"output of {path}, heads split"
        if kind == "qkv" and path in rec.outputs:
            x = self._np(self._array(rec.outputs[path], stage))
            x = x.reshape(B, c.num_tokens, 3, c.num_heads, c.head_dim)[:, :, "qkv".index(part)].transpose(0, 2, 1, 3)
            return x, f"output of {path} split as timm's (3, H, hd): the port's own split is checked at attn.weights"
        if "native" in slot:
            raise _Unseen(f"computed inside {slot['native']}")
        raise _Unseen("no fused attention call, q kᵀ product or q/k/v projection was seen in this block")

    def _heads4(self, x, last):
        c = self.config
        if x.ndim == 3 and x.shape[0] % c.num_heads == 0:  # (B*H, N, last)
            x = x.reshape(-1, c.num_heads, *x.shape[1:])
        return x


def _heads(x, c):
    if x.ndim == 3 and x.shape[-1] == c.embed_dim:  # (B, N, D) -> (B, H, N, hd)
        return x.reshape(x.shape[0], x.shape[1], c.num_heads, c.head_dim).transpose(0, 2, 1, 3)
    if x.ndim == 4 and x.shape[1:] == (c.num_tokens, c.num_heads, c.head_dim):  # (B, N, H, hd)
        return x.transpose(0, 2, 1, 3)
    return x


class _Unseen(Exception):
    pass


class _Never(Exception):
    pass
