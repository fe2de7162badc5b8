"""One module per framework adapter, each written against ``base.Adapter``; ``ADAPTERS`` is the
registry capture looks a model's framework up in (``framework_of``). Adding a framework is one
module here and one entry below."""

from __future__ import annotations

from conformance.capture.adapters.base import Adapter, BaseAdapter, SwapAdapter
from conformance.capture.adapters.linen import LinenAdapter
from conformance.capture.adapters.mlx import MLXAdapter
from conformance.capture.adapters.nnx import NNXAdapter
from conformance.capture.adapters.torch import TorchAdapter


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


ADAPTERS = {"torch": TorchAdapter, "mlx": MLXAdapter, "nnx": NNXAdapter, "linen": LinenAdapter}


__all__ = ["ADAPTERS", "Adapter", "BaseAdapter", "LinenAdapter", "MLXAdapter", "NNXAdapter", "SwapAdapter",
           "TorchAdapter", "framework_of"]
