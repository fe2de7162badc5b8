"""The adapter contract: one framework's access to a model (its modules and parameters, loading,
a call with recording, gradients), as a written Protocol, and what the adapters share."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from conformance.capture.mapping import module_of, unit_axes
from conformance.capture.recorder import first_array, patched
from conformance.support import Unsupported

if TYPE_CHECKING:
    from conformance.capture.recorder import Recorder


class Captured(Protocol):
    """What an adapter's ``gradients`` reads of the captured forward (capture.port's
    CapturedForward): its plan and config, the logits in a run's output, and every stage read at a
    module boundary from a recorder of cotangents. The narrow interface: adapters never see the
    whole captured forward."""

    plan: Any
    config: Any

    def logits(self, out) -> Any: ...

    def boundary_taps(self, recorder: Recorder, logits_grad) -> dict[str, np.ndarray]: ...


class Adapter(Protocol):
    """What capture needs from a framework (``BaseAdapter`` implements the shared parts).

    name                      the module system it reads, as its import path ("torch.nn", "mlx.nn",
                              "flax.nnx", "flax.linen"): a model whose class comes from there is its
    bind(model, config, images)  the adapter for a model built for ``config`` (a classmethod)
    supports_autocast         whether the model can run under its framework's autocast
    call_kwargs               passed to every call of the model (ModelPort(call_kwargs=...))
    supports_gradients        whether ``gradients`` is implemented
    channels_first            a convolution's output is (B, D, h, w) (PyTorch) or (B, h, w, D)
    modules()                 module path -> module (or its type name)
    kind(path)                the class name of the module at ``path``
    params()                  parameter key -> shape
    native(key, value, shape) a canonical array in the layout of the model's ``key``
    resolve(key, params)      the model's name for a renamed key (Flax's kernel and scale)
    current(key)              a parameter's own value (one the mapping leaves unfilled)
    load(arrays, dtype, cast) the mapped arrays into the model, strictly
    to_input(images, dtype)   images as the framework's array
    numpy(x), is_array(x)     the framework's arrays as NumPy, and recognising them
    copy(x)                   a recorded array kept from later in-place updates
    fast_paths()              modules whose native kernel capture's function wrappers switch off
    quantized()               {model key: QuantizedWeight} of its quantized modules, decoded
    integer_weights()         {module path: 'path (Class: name dtype)'} of the modules holding a
                              weight of an integer dtype themselves (a quantized Linear, known or not)
    run(inputs, recorder, watch, functions)  one call, recording module inputs and outputs at
                              ``watch`` and, with ``functions``, the framework functions
    gradients(inputs, loss, forward)  (loss, {model key: gradient}, d loss / d inputs,
                              {stage: cotangent} or None) of the framework's own loss
    """

    name: str
    call_kwargs: dict
    supports_autocast: bool
    supports_gradients: bool
    channels_first: bool

    @classmethod
    def bind(cls, model, config, images: str = "NCHW") -> Adapter: ...
    def modules(self) -> Mapping[str, Any]: ...
    def kind(self, path: str) -> str: ...
    def kinds(self) -> dict[str, str]: ...
    def params(self) -> dict[str, tuple]: ...
    def native(self, key: str, value: np.ndarray, shape: tuple) -> np.ndarray: ...
    def resolve(self, key: str, params: Mapping) -> str: ...
    def current(self, key: str) -> np.ndarray: ...
    def load(self, arrays: dict, dtype: str, cast: bool = True) -> None: ...
    def to_input(self, images: np.ndarray, dtype: str) -> Any: ...
    def numpy(self, x) -> np.ndarray: ...
    def is_array(self, x) -> bool: ...
    def copy(self, x) -> Any: ...
    def fast_paths(self) -> list[str]: ...
    def quantized(self) -> dict: ...
    def run(self, inputs, recorder: Recorder, watch: dict[str, tuple[bool, bool]], functions: bool = True): ...
    def gradients(self, inputs, loss, forward: Captured) -> tuple: ...


class BaseAdapter:
    """One framework's access to a model: its parameters, loading, and calling it with hooks."""

    name = ""
    supports_autocast = False

    # why a stage recorded inside a compiled function cannot be read (``traced``)
    TRACED = "inside a compiled function: what was recorded there is a placeholder of its trace"

    def __init__(self, model):
        self.model = model
        self.call_kwargs: dict = {}  # ModelPort(call_kwargs=...): e.g. train=False

    def traced(self, error: Exception) -> bool:
        """Whether reading a recorded array failed because it was a compiled function's placeholder."""
        return False

    def uncompiled(self):
        """A context in which the model's compiled functions run as plain Python (a second pass)."""
        return contextlib.nullcontext()

    @classmethod
    def bind(cls, model, config, images: str = "NCHW"):
        """The adapter for ``model``, built for ``config`` (whose images are ``images``)."""
        return cls(model)

    def modules(self) -> dict[str, Any]:
        raise NotImplementedError

    def native(self, key: str, value: np.ndarray, shape: tuple) -> np.ndarray:
        """The canonical ``value`` in the layout of the model's ``key``: by the receiving
        module's type, always (a square kernel fits either way, so shapes cannot decide), then
        size-1 axes by shape (``pos_embed`` (1, N, D) into a (N, D) parameter)."""
        value = self.by_type(self.kind(module_of(key)), key.rpartition(".")[2], value)
        return unit_axes(value, shape)

    def kind(self, path: str) -> str:
        """The class name of the module at ``path``."""
        return type(self.modules().get(path)).__name__

    def kinds(self) -> dict[str, str]:
        """Every module's path and class name (what the config has no word for is read there)."""
        return {path: self.kind(path) for path in self.modules()}

    def by_type(self, kind: str, leaf: str, value: np.ndarray) -> np.ndarray:
        return value  # PyTorch: the canonical layouts are its own

    def resolve(self, key: str, params: Mapping) -> str:
        """The model's name for a renamed key (Flax calls a weight kernel or scale)."""
        return key

    def fast_paths(self) -> list[str]:
        """Modules whose native kernel capture's function wrappers would switch off (none)."""
        return []

    supports_gradients = False
    # a compiled model's: how its last call ran ("compiled", "compiled again", "eager: ..."), and why
    # it compiled again for an input it had compiled for (torch's adapter sets them; None elsewhere)
    path: str | None = None
    recompiled: str | None = None
    channels_first = False  # a convolution's output is (B, D, h, w), not (B, h, w, D)

    def quantized(self) -> dict:
        """The model's quantized weights: model key -> ``conformance.capture.quantized.QuantizedWeight``."""

        raise Unsupported(f"quantized {self.name} models are not read yet (MLX's nn.quantize is; docs/quantization.md)")

    def integer_weights(self) -> dict[str, str]:
        """The modules that hold, themselves, a tensor named ``*weight*`` of an integer dtype: the
        stored form of a quantized Linear, whatever its class is called (PyTorch's and MLX's
        adapters look; the others' models are judged by their class names alone)."""
        return {}

    def gradients(self, inputs, loss, forward: Captured):
        """(loss value, {model key: gradient}, d loss / d inputs, {stage: cotangent} or None) of
        the framework's own loss (impls.*_vit.loss_value) of the model's logits."""

        raise Unsupported(
            f"gradients of a {self.name} model are not supported yet (only of PyTorch, MLX and Flax NNX models)"
        )


class SwapAdapter(BaseAdapter):
    """MLX and Flax NNX: modules are recorded by swapping the instance's class for a subclass
    whose ``__call__`` records, for the duration of one call."""

    def _wrap_modules(self, recorder, watch):
        swapped = []
        for path, (want_in, want_out) in watch.items():
            module = self.modules()[path]
            cls = type(module)

            def call(obj, *args, __cls=cls, __path=path, __in=want_in, __out=want_out, **kwargs):
                if __in:
                    recorder.enter(__path, first_array(args, kwargs, self))
                out = __cls.__call__(obj, *args, **kwargs)
                if __out:
                    recorder.leave(__path, out)
                return out

            self.set_class(module, type(cls.__name__, (cls,), {"__call__": call, "__module__": cls.__module__}))
            swapped.append((module, cls))
        return swapped

    def set_class(self, module, cls) -> None:
        module.__class__ = cls

    def run(self, inputs, recorder, watch, functions: bool = True):
        swapped = self._wrap_modules(recorder, watch)
        try:
            with patched(self.patches(recorder)):
                return self.call(inputs)
        finally:
            for module, cls in reversed(swapped):  # a module shared by two paths was swapped twice
                self.set_class(module, cls)

    def call(self, inputs):
        return self.model(inputs, **self.call_kwargs)

    def patches(self, recorder) -> list:
        return []
