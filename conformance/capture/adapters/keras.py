"""Keras 3 models, on the JAX or the PyTorch backend: layers recorded by a class swap (a Keras
layer's ``__call__``, which a functional model's graph calls too), keras.ops' fused attention,
softmax and einsum wrapped. Layers are named by their ``name`` chain, as their weights' ``path``
is (``vit_encoder/transformer_block_1/mha/query/kernel`` is ``vit_encoder.transformer_block_1.mha.query.kernel``)."""

from __future__ import annotations

import numpy as np

from conformance.capture.adapters.base import SwapAdapter
from conformance.capture.recorder import callbacks, hooked
from conformance.support import Unsupported


class KerasAdapter(SwapAdapter):
    name = "keras"

    def __init__(self, model):
        super().__init__(model)
        self._modules = dict(_walk(model, ""))

    def modules(self):
        return self._modules

    def _weights(self) -> dict:
        """Each weight named by its layer's name chain, as ``modules`` names the layers, and its own
        name: a tower nested in a wrapper model (whose weights' ``path`` starts at the tower) is
        named through the wrapper, as its layers are."""
        owner = {}
        for path, layer in self._modules.items():  # parents first: the innermost layer holding it wins
            owner.update(dict.fromkeys((id(v) for v in layer.weights), path))
        return {".".join(filter(None, (owner.get(id(v)), v.path.rsplit("/", 1)[-1]))): v for v in self.model.weights}

    def params(self):
        return {k: tuple(v.shape) for k, v in self._weights().items()}

    def by_type(self, kind, leaf, value):
        """Keras keeps a kernel input axes first: a Dense's (in, out), a Conv2D's (kh, kw, in, out),
        an EinsumDense's inputs then outputs ((D, heads, head_dim) for q, (heads, head_dim, D) for
        the output projection): the canonical (out, in) transposed, then shaped (``native``)."""
        if leaf == "kernel" and kind.startswith("Conv") and value.ndim == 4:
            return np.ascontiguousarray(value.transpose(2, 3, 1, 0))  # OIHW -> HWIO
        if leaf == "kernel" and kind in ("Dense", "EinsumDense") and value.ndim == 2:
            return np.ascontiguousarray(value.T)
        return value

    def native(self, key, value, shape):
        value = super().native(key, value, shape)
        if (
            value.shape != tuple(shape)
            and value.size == int(np.prod(shape))
            and self.kind(key.rpartition(".")[0]) == "EinsumDense"
        ):
            return value.reshape(shape)  # (in, out) as the einsum's axes: heads and head_dim apart
        return value

    def resolve(self, key, params):
        if key in params:
            return key
        for ours, theirs in ((".weight", ".kernel"), (".weight", ".gamma"), (".bias", ".beta")):
            if key.endswith(ours) and key[: -len(ours)] + theirs in params:
                return key[: -len(ours)] + theirs
        return key

    def current(self, key):
        return np.asarray(self.numpy(self._weights()[key].value), np.float32)

    def load(self, arrays, dtype, cast=True):

        weights = self._weights()
        if cast and dtype != "float32":
            raise Unsupported(
                f"a Keras model computes in the dtype policy it was built with: give build a dtype= argument "
                f"(keras.layers' dtype={dtype!r}) to verify it in {dtype}"
            )
        for key, value in arrays.items():
            weights[key].assign(np.asarray(value, np.float32).astype(weights[key].dtype))

    def to_input(self, images, dtype):
        import keras

        return keras.ops.convert_to_tensor(images, dtype=dtype)

    def numpy(self, x):
        import keras

        if str(x.dtype).endswith("bfloat16"):
            x = keras.ops.cast(x, "float32")
        return np.asarray(keras.ops.convert_to_numpy(x))

    def is_array(self, x):
        import keras

        return keras.ops.is_tensor(x)

    def copy(self, x):
        return x.detach().clone() if hasattr(x, "detach") else x  # a torch backend's tensors may be updated in place

    def call(self, inputs):
        return self.model(inputs, training=False, **self.call_kwargs)

    def patches(self, recorder):
        # keras.src.ops is the module Keras's own layers call (MultiHeadAttention's ops.einsum and
        # ops.dot_product_attention); keras.ops re-exports its functions, and wrapping a re-export
        # would miss every call from inside Keras
        from keras.src import ops

        on = callbacks(recorder)
        fused = on.fused("keras.ops.dot_product_attention", False, ("query", "key", "value", "bias"))
        return [
            hooked(ops, "dot_product_attention", fused),
            hooked(ops, "softmax", on.softmax),
            hooked(ops, "einsum", on.einsum),
            hooked(ops, "matmul", on.product),
        ]


def _walk(layer, prefix: str):
    """(path, layer) for every sublayer, by its name chain (the model itself at ""). Keras has no
    public accessor of a layer's sublayers: its own ``summary(expand_nested=True)`` walks them so."""
    yield prefix, layer
    for child in layer._flatten_layers(include_self=False, recursive=False):
        if type(child).__name__ == "InputLayer":
            continue
        yield from _walk(child, f"{prefix}.{child.name}" if prefix else child.name)
