"""One module per framework adapter, each written against ``base.Adapter``; ``ADAPTERS`` is the
registry capture looks a model's module system up in (``framework_of``), keyed by each adapter's
``name``: the import path of the module system it reads. Adding a framework is one module here
and one entry below."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from conformance.capture.adapters.base import Adapter, BaseAdapter, SwapAdapter
from conformance.report import CannotJudge
from conformance.capture.adapters.equinox import EquinoxAdapter
from conformance.capture.adapters.keras import KerasAdapter
from conformance.capture.adapters.linen import LinenAdapter
from conformance.capture.adapters.mlx import MLXAdapter
from conformance.capture.adapters.nnx import NNXAdapter
from conformance.capture.adapters.torch import TorchAdapter


# Keras first: its layers on the torch backend are torch.nn.Modules too, with Keras's own names
ADAPTERS = {cls.name: cls for cls in (KerasAdapter, TorchAdapter, MLXAdapter, NNXAdapter, LinenAdapter, EquinoxAdapter)}
# Module systems no adapter reads yet, by the package their classes come from, looked up before the
# adapters
NOT_TAKEN = {
    "tf_keras": "Keras 2",
    "haiku": "Haiku",
    "tensorflow": "TensorFlow",
}


class ModuleSystemNotTaken(CannotJudge):
    """A model port's model is of a module system no capture adapter reads (exit 2): what verify
    cannot do, not what the port did; the message names the system and the factory route."""

    label = "the tool does not take this model's module system"


class QuantizedNotTaken(CannotJudge):
    """A model port whose ``build`` returns a model already quantized (exit 2): verify loads the
    canonical float weights into the model it builds, which packed tensors cannot take; the
    message names the modules and the route (``ModelPort(quantize=...)``)."""

    label = "the tool cannot load float weights into a quantized model"


# Modules that store their weights quantized, by class name (MLX's QuantizedLinear and QQLinear,
# bitsandbytes' Linear4bit and Linear8bitLt) or by package (torch.ao.nn.quantized's dynamic Linear,
# named Linear; mlx.nn.layers.quantized)
_QUANTIZED = re.compile(r"Quantized|QQLinear|Linear4bit|Linear8bitLt")


def quantized_modules(modules: Mapping[str, Any]) -> dict[str, str]:
    """The modules of a model (path -> module) of a quantized class: path -> 'path (Class)'."""
    found: dict[str, str] = {}
    for path, m in modules.items():
        inside = any(path.startswith(p + ".") for p in found)  # (a quantized module's own parts)
        if not inside and (".quantized" in type(m).__module__ or _QUANTIZED.search(type(m).__name__)):
            found[path] = f"{path or 'the model'} ({type(m).__name__})"
    return found


def check_not_quantized(adapter, quantize: bool = False) -> None:
    """``build``'s model holds no quantized module (``quantize``: the port has a quantize step): none
    of a quantized class, none holding an integer weight itself (a hand-written int8 Linear)."""
    found = quantized_modules(adapter.modules())
    found = list({**adapter.integer_weights(), **found}.values())
    if found:
        shown = ", ".join(found[:3]) + (f" and {len(found) - 3} more" if len(found) > 3 else "")
        raise QuantizedNotTaken(
            f"{len(found)} of the model's modules hold quantized weights ({shown}) as build returns it: "
            "verify loads the canonical float weights into the model build returns, then quantizes it; "
            + (
                "build the float model and leave the quantization to quantize="
                if quantize
                else "give build the float model and the quantization step as ModelPort(quantize=...), "
                "e.g. quantize=lambda model: mlx.nn.quantize(model, group_size=64, bits=4) (docs/quantization.md)"
            )
        )


def framework_of(model) -> str:
    """The module system of a model object (an ``ADAPTERS`` key), from its class hierarchy: the
    adapter whose name prefixes a class's module (no framework is imported); ModuleSystemNotTaken
    for any other."""
    modules = [c.__module__ for c in type(model).__mro__]

    def of(name: str) -> bool:
        return any(m == name or m.startswith(name + ".") for m in modules)

    known = next((label for name, label in NOT_TAKEN.items() if of(name)), None)
    name = next((name for name in ADAPTERS if of(name)), None)
    if known is None and name is not None:
        return name
    package = type(model).__module__.split(".")[0]
    what = f"{'an' if known[0] in 'AEIOU' else 'a'} {known} model" if known else f"a {package} object"
    raise ModuleSystemNotTaken(
        f"{type(model).__name__} is {what}: a model port takes a PyTorch, MLX, Keras 3, Equinox, "
        f"Flax NNX or Flax linen module (a class from one of {', '.join(ADAPTERS)}); give verify a port factory "
        "instead, make(config, state, dtype=...) returning the forward (docs/verify.md, 'A port factory')"
    )


__all__ = [
    "ADAPTERS",
    "Adapter",
    "BaseAdapter",
    "EquinoxAdapter",
    "KerasAdapter",
    "LinenAdapter",
    "MLXAdapter",
    "ModuleSystemNotTaken",
    "QuantizedNotTaken",
    "check_not_quantized",
    "quantized_modules",
    "NNXAdapter",
    "SwapAdapter",
    "TorchAdapter",
    "framework_of",
]
