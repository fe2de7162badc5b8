"""``ModelPort(quantize=)``'s step: the user's quantization of the loaded float model, and its
weights read back through the quantized model's adapter (``conformance.capture.quantized``)."""

from __future__ import annotations

from conformance.capture.adapters import ADAPTERS, ModuleSystemNotTaken, framework_of
from conformance.capture.mapping import LoadError
from conformance.capture.quantized import canonical
from conformance.report import CannotJudge, ToolError, describe_exception
from conformance.support import Unsupported


def quantized_port(port, model, adapter, state, config, arrays, dtype: str):
    """``ModelPort(quantize=)``'s step on the loaded float ``model`` (``adapter`` its), and its weights
    read back: (the quantized model's adapter, ``Quantized`` in canonical keys and layouts)."""
    where = port.entry_map(state, adapter, config)  # the float model's names and layouts
    out = port.quantize(model)  # the port's own step: what it raises is the port's
    framework = framework_of(model)
    if out is not None and framework_of_or_none(out) != framework:  # the declaration's misuse: exit 2, not a finding
        raise CannotJudge(
            f"ModelPort(quantize=...) returned a {type(out).__name__}: the step must quantize the model it is "
            f"given in place and return None, or return the quantized model (a {framework} module)"
        )
    model = model if out is None else out
    quantized = ADAPTERS[framework_of(model)].bind(model, config, port.images)
    quantized.call_kwargs = adapter.call_kwargs
    try:
        read = quantized.quantized()
    except Unsupported:
        raise
    except Exception as e:  # noqa: BLE001 - reading the packed tensors is the tool's job
        raise ToolError(f"capture could not read the quantized weights: {describe_exception(e)}") from e
    unread = [d for p, d in quantized.integer_weights().items() if f"{p}.weight".lstrip(".") not in read]
    if unread:
        shown = ", ".join(unread[:3]) + (f" and {len(unread) - 3} more" if len(unread) > 3 else "")
        raise Unsupported(
            f"{len(unread)} module(s) of the quantized model hold integer weights the reader does not know "
            f"({shown}): read are MLX's QuantizedLinear, torch.ao's dynamic int8 Linear and torchao's int8 "
            "weight-only (docs/quantization.md); another format cannot be judged against its own grid"
        )
    if not read:
        raise LoadError(
            "ModelPort(quantize=...) left no module quantized (no module holds packed weights beside "
            "scales): the step must quantize the model it is given, in place or returned"
        )
    return quantized, canonical(read, where, state, arrays, dtype)


def framework_of_or_none(obj) -> str | None:
    """``framework_of``, or None for an object of no module system (a tuple, a string)."""
    try:
        return framework_of(obj)
    except ModuleSystemNotTaken:
        return None
