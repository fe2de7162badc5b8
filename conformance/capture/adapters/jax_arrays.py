"""What Flax NNX and linen share: JAX arrays, Flax's layouts and names, jax.nn and jnp wrapped."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from conformance.capture.recorder import callbacks, hooked, wrapped


def on_device(value, dtype):
    """``value`` as a JAX array of ``dtype``: cast in NumPy (ml_dtypes rounds to nearest even, as
    XLA does) and device_put, which, unlike jnp.asarray or astype, compiles no program per shape
    (as impls/jax_vit.py loads its weights)."""
    import jax

    return jax.device_put(np.asarray(value, np.float32).astype(dtype))


class JAXArrays:
    """What Flax NNX and linen share: JAX arrays, Flax's layouts and names, and the wrapped JAX
    functions (jax.nn's softmax and fused attention, jnp's matmul and einsum)."""

    # what the wrapped functions' hooks are handed in place of (args, kwargs, out), where a model's
    # arrays are not what it passes them (Equinox's: tracers under its vmaps); None: as passed
    seen = None

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
            if key[: -len("weight")] + leaf in params:
                return key[: -len("weight")] + leaf
        return key

    def to_input(self, images, dtype):
        import jax.numpy as jnp

        return on_device(images, getattr(jnp, dtype))

    def numpy(self, x):
        return np.asarray(x, np.float32) if str(x.dtype) == "bfloat16" else np.asarray(x)

    def is_array(self, x):
        import jax

        return isinstance(x, jax.Array)

    def copy(self, x):
        return x

    def traced(self, error):
        """A tracer of jax.jit or nnx.jit read as an array (the hooks ran while it traced)."""
        import jax

        return isinstance(error, (jax.errors.TracerArrayConversionError, jax.errors.ConcretizationTypeError))

    def uncompiled(self):
        import jax

        return jax.disable_jit()

    def patches(self, recorder):
        import jax
        import jax.numpy as jnp
        from flax import nnx

        on = callbacks(recorder, self.seen)
        softmax = wrapped(jax.nn.softmax, on.softmax)
        fused = on.fused("jax.nn.dot_product_attention", False, ("query", "key", "value", "bias"))
        return [
            hooked(jax.nn, "dot_product_attention", fused),
            (jax.nn, "softmax", softmax),
            (nnx, "softmax", softmax),
            hooked(jnp, "matmul", on.product),
            hooked(jnp, "einsum", on.einsum),
        ]


def flatten(tree, prefix=()):
    for k, v in tree.items():
        if isinstance(v, Mapping):
            yield from flatten(v, prefix + (str(k),))
        else:
            yield prefix + (str(k),), v
