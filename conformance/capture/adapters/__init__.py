"""One module per framework adapter, each written against ``base.Adapter``; ``ADAPTERS`` is the
registry capture looks a model's module system up in (``framework_of``), keyed by each adapter's
``name``: the import path of the module system it reads. Adding a framework is one module here
and one entry below."""

from __future__ import annotations

from conformance.capture.adapters.base import Adapter, BaseAdapter, SwapAdapter
from conformance.capture.adapters.linen import LinenAdapter
from conformance.capture.adapters.mlx import MLXAdapter
from conformance.capture.adapters.nnx import NNXAdapter
from conformance.capture.adapters.torch import TorchAdapter


ADAPTERS = {cls.name: cls for cls in (TorchAdapter, MLXAdapter, NNXAdapter, LinenAdapter)}


def framework_of(model) -> str:
    """The module system of a model object (an ``ADAPTERS`` key), from its class hierarchy: the
    adapter whose name prefixes a class's module (no framework is imported)."""
    modules = [c.__module__ for c in type(model).__mro__]
    for name in ADAPTERS:
        if any(m == name or m.startswith(name + ".") for m in modules):
            return name
    raise TypeError(
        f"a model port needs a PyTorch, MLX, Flax NNX or Flax linen module (a class from one of "
        f"{', '.join(ADAPTERS)}), got {type(model).__name__}"
    )


__all__ = [
    "ADAPTERS",
    "Adapter",
    "BaseAdapter",
    "LinenAdapter",
    "MLXAdapter",
    "NNXAdapter",
    "SwapAdapter",
    "TorchAdapter",
    "framework_of",
]
