"""MLX models: modules recorded by a class swap, mx's softmax, fused attention and products
wrapped, tap cotangents as gradients of added zeros."""

from __future__ import annotations

import contextlib
import os

import numpy as np

from conformance.capture.adapters.base import Captured, SwapAdapter
from conformance.capture.quantized import mlx_weight
from conformance.capture.recorder import Recorder, callbacks, hooked, wrapped


class MLXAdapter(SwapAdapter):
    name = "mlx.nn"
    supports_gradients = True

    def by_type(self, kind, leaf, value):
        return (
            np.ascontiguousarray(value.transpose(0, 2, 3, 1)) if kind.startswith("Conv") and value.ndim == 4 else value
        )  # OIHW -> OHWI

    def __init__(self, model):
        super().__init__(model)
        self._modules = dict(model.named_modules())

    def modules(self):
        return self._modules

    def params(self):
        from mlx.utils import tree_flatten

        return {k: tuple(v.shape) for k, v in tree_flatten(self.model.parameters())}

    def current(self, key):
        import mlx.core as mx
        from mlx.utils import tree_flatten

        return np.array(dict(tree_flatten(self.model.parameters()))[key].astype(mx.float32))

    def load(self, arrays, dtype, cast=True):
        import mlx.core as mx
        from mlx.utils import tree_flatten

        own = {k: v.dtype for k, v in tree_flatten(self.model.parameters())}
        self.model.load_weights(
            [
                (
                    k,
                    mx.array(np.asarray(v, np.float32))
                    if cast
                    else mx.array(np.asarray(v, np.float32)).astype(own.get(k, mx.float32)),
                )
                for k, v in arrays.items()
            ],
            strict=True,
        )
        self.model.eval()
        if cast and dtype != "float32":
            self.model.set_dtype(getattr(mx, dtype))

    def quantized(self):
        """Each quantized module's weight (nn.QuantizedLinear and its kin: a packed ``weight``
        beside ``scales``), decoded from mx.quantize's format, never through the float cast."""
        import mlx.core as mx

        def numpy(a):
            return None if a is None else np.array(a.astype(mx.float32) if a.dtype == mx.bfloat16 else a)

        read = {}
        for path, m in self._modules.items():
            if "scales" not in m or "weight" not in m or not hasattr(m, "bits"):
                continue
            read[f"{path}.weight".lstrip(".")] = mlx_weight(
                numpy(m["weight"]), numpy(m["scales"]), numpy(m.get("biases")), m.group_size, m.bits,
                getattr(m, "mode", "affine"), numpy(m.get("global_scale")),
            )  # fmt: skip
        return read

    def integer_weights(self) -> dict[str, str]:
        import mlx.core as mx

        found = {}
        for path, m in self._modules.items():
            for name, a in m.items():
                if "weight" in name and isinstance(a, mx.array) and not mx.issubdtype(a.dtype, mx.inexact):
                    found[path] = f"{path or 'the model'} ({type(m).__name__}: {name} {str(a.dtype).split('.')[-1]})"
        return found

    def to_input(self, images, dtype):
        import mlx.core as mx

        return mx.array(images).astype(getattr(mx, dtype))

    def gradients(self, images, loss, forward: Captured):
        """As the PyTorch adapter's: the cotangent at every stage read at a module boundary,
        here as the gradient of a zero added to each watched module's first call's input or
        output (MLX keeps no gradients on intermediate arrays), inside mx.value_and_grad over
        the parameters, the images and those zeros. A first recording run gives their shapes."""
        import mlx.core as mx
        from mlx.utils import tree_flatten

        from impls.mlx_vit import loss_value

        plan, watch = forward.plan, forward.plan.watch()
        shapes = Recorder(self, forward.config, images.shape[0], plan.blocks)
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
                        args = (*args[:i], args[i] + added[("in", __path)], *args[i + 1 :])
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
            lambda params, x, z: f(params, x, dict(zip(keys, z))), argnums=(0, 1, 2)
        )(self.model.trainable_parameters(), images, [zeros[k] for k in keys])
        mx.eval(value, g_params, g_x, g_zeros)
        grads = dict(zip(keys, g_zeros))
        recorder = Recorder(self, forward.config, images.shape[0], plan.blocks)
        recorder.inputs = {p: grads[("in", p)] for kind, p in keys if kind == "in"}
        recorder.outputs = {p: grads[("out", p)] for kind, p in keys if kind == "out"}
        taps = forward.boundary_taps(recorder, self.numpy(grads[("return", "")]))
        return float(value), {k: self.numpy(v) for k, v in tree_flatten(g_params)}, self.numpy(g_x), taps

    def numpy(self, x):
        import mlx.core as mx

        return np.array(x.astype(mx.float32) if x.dtype == mx.bfloat16 else x)

    def is_array(self, x):
        import mlx.core as mx

        return isinstance(x, mx.array)

    def copy(self, x):
        return x

    def traced(self, error):
        return isinstance(error, RuntimeError) and "without a primitive" in str(error)

    @contextlib.contextmanager
    def uncompiled(self):
        """mx.compile off for the pass (left off where MLX_DISABLE_COMPILE asked it)."""
        import mlx.core as mx

        mx.disable_compile()
        try:
            yield
        finally:
            if not os.environ.get("MLX_DISABLE_COMPILE"):
                mx.enable_compile()

    def patches(self, recorder):
        import mlx.core as mx
        import mlx.nn as nn

        on = callbacks(recorder)
        softmax = wrapped(mx.softmax, on.softmax)
        fused = on.fused("mx.fast.scaled_dot_product_attention", True, ("q", "k", "v", "mask"))
        return [
            hooked(mx.fast, "scaled_dot_product_attention", fused),
            (mx, "softmax", softmax),
            # nn.softmax is mx.softmax under mx.compile, whose tracing would hand the wrapper a
            # placeholder: called directly for the capture (the same single kernel).
            (nn, "softmax", lambda x, axis=-1: softmax(x, axis=axis)),
            hooked(mx, "matmul", on.product),
            hooked(mx, "einsum", on.einsum),
            hooked(mx.array, "__matmul__", on.product),
            hooked(mx.array, "__mul__", on.scale),
            hooked(mx.array, "__truediv__", on.scale),
        ]
