"""Flax linen modules, unbound: shapes from an abstract init, calls recorded through
nn.intercept_methods; no gradients yet."""

from __future__ import annotations

from conformance.capture.adapters.base import BaseAdapter
from conformance.capture.adapters.jax_arrays import JAXArrays, flatten, on_device
from conformance.capture.mapping import LoadError
from conformance.capture.recorder import first_array, patched


class LinenAdapter(JAXArrays, BaseAdapter):
    """A Flax linen module (unbound) and its variables: shapes and module types from an
    abstract ``init`` (no initializer runs), calls recorded through ``nn.intercept_methods``."""

    name = "flax.linen"

    @classmethod
    def bind(cls, model, config, images: str = "NCHW"):
        """Unbound: shapes come from an abstract init on an image of ``config``."""
        import jax.numpy as jnp

        H, W = config.img_size
        shape = (1, H, W, config.in_chans) if images == "NHWC" else (1, config.in_chans, H, W)
        return cls(model, jnp.zeros(shape, jnp.float32))

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
        self._shapes = {".".join(path): tuple(leaf.shape) for path, leaf in flatten(variables["params"])}
        self._dtypes = {".".join(path): leaf.dtype for path, leaf in flatten(variables["params"])}
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
            node[leaf] = on_device(value, target)
        self.variables = {"params": tree}

    def run(self, inputs, recorder, watch, functions: bool = True):
        import flax.linen as nn

        def intercept(next_fun, args, kwargs, context):
            path = ".".join(context.module.path)
            want_in, want_out = watch.get(path, (False, False)) if context.method_name == "__call__" else (0, 0)
            if want_in:
                recorder.enter(path, first_array(args, kwargs, self))
            out = next_fun(*args, **kwargs)
            if want_out:
                recorder.leave(path, out)
            return out

        with patched(self.patches(recorder)), nn.intercept_methods(intercept):
            return self.model.apply(self.variables, inputs, **self.call_kwargs)
