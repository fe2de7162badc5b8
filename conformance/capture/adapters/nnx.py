"""Flax NNX models: modules recorded by a class swap, gradients by a jitted jax.value_and_grad."""

from __future__ import annotations

import numpy as np

from conformance.capture.adapters.base import Captured, SwapAdapter
from conformance.capture.adapters.jax_arrays import JAXArrays, on_device
from conformance.capture.mapping import LoadError
from impls.protocol import Loss


class NNXAdapter(JAXArrays, SwapAdapter):
    name = "flax.nnx"
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

    def gradients(self, inputs, loss, forward: Captured):
        """By a jitted jax.value_and_grad over the model's nnx.Param state and the inputs, one
        program per loss kind (and batch shape): eager, every op would compile on its own. No
        tap cotangents: the model is located at its first wrong parameter gradient."""
        from flax import nnx

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
        grads = {
            ".".join(map(str, path)): self.numpy(v.get_value() if isinstance(v, nnx.Variable) else v)
            for path, v in nnx.to_flat_state(g_params)
        }
        return float(value), grads, self.numpy(g_x), None

    def load(self, arrays, dtype, cast=True):
        import jax.numpy as jnp

        params = self._params()
        for key, value in arrays.items():
            target = getattr(jnp, dtype) if cast else params[key].get_value().dtype
            params[key].set_value(on_device(value, target))
