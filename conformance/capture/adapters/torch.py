"""PyTorch models: forward hooks, a TorchFunctionMode for the attention internals (a second pass
where it would switch off a native kernel), autocast, autograd with tap cotangents."""

from __future__ import annotations

import contextlib
import functools
import sys
import warnings

import numpy as np

from conformance.capture.adapters.base import BaseAdapter, Captured
from conformance.capture.quantized import torch_weight, torchao_weight
from conformance.capture.recorder import Recorder, callbacks, first_array, hooked, map_arrays, patched
from conformance.support import Unsupported

# PyTorch modules with a native fast path that a TorchFunctionMode switches off.
TORCH_FAST_PATHS = ("MultiheadAttention", "TransformerEncoderLayer")
COMPILED_PREFIX = "_orig_mod."  # torch.compile's wrapper's name for the module it wraps


def cast_as_loaded(model, dtype) -> None:
    """``model.to(dtype)`` but for the buffers no checkpoint holds (``persistent=False``: rotary
    frequencies, tables the model computes as it is built), which keep the dtype they were built
    in, as ``from_pretrained(dtype=...)`` leaves them. Cast too, Qwen2-VL's ``inv_freq`` turns its
    angles, position x frequency, into the dtype's: wrong by |angle| x 2^-9 in bfloat16, 6 % of a
    rotation at 32 patches (NVIDIA-NeMo/Automodel#3856), a bug of the cast, not of the model. A
    complex buffer keeps its dtype whatever holds it: cast to a real dtype it loses its imaginary
    part (Llama 4's vision tower's freqs_ci would turn each pair by cos alone)."""
    held = set(model.state_dict())
    built = {k: b for k, b in model.named_buffers() if (k not in held and b.is_floating_point()) or b.is_complex()}
    with warnings.catch_warnings():  # a complex buffer's cast, put back below
        warnings.filterwarnings("ignore", "Casting complex values to real discards the imaginary part")
        model.to(dtype)
    for key, buffer in built.items():
        owner, _, name = key.rpartition(".")
        setattr(model.get_submodule(owner), name, buffer)


class TorchAdapter(BaseAdapter):
    name = "torch.nn"
    supports_autocast = True
    supports_gradients = True
    channels_first = True

    def __init__(self, model):
        # torch.compile's wrapper (an OptimizedModule) is called, its _orig_mod named and loaded:
        # the weights are the module's own, the forward the compiled one
        self.compiled = model if type(model).__name__ == "OptimizedModule" and hasattr(model, "_orig_mod") else None
        super().__init__(model if self.compiled is None else model._orig_mod)
        self._modules = dict(self.model.named_modules())
        self.retain = False  # record the graph's own tensors (a gradient pass), not copies
        self.autocast: str | None = None  # ModelPort(autocast=True): run under torch.autocast in this dtype
        self._compiled_for: set = set()  # the inputs (shape, dtype, pass) the compiled model has compiled for
        self.recompiled: str | None = None  # why it compiled again for one of them (dynamo's failing guard)
        self.path: str | None = None  # how the compiled model's last call ran (``_compiled_call``)

    def resolve(self, key, params):
        # a compiled model's own state_dict names its weights under "_orig_mod." (what the docs once
        # said to map to): taken as the wrapped module's names, as the bare ones are
        if self.compiled is not None and key not in params and key.startswith(COMPILED_PREFIX):
            return key[len(COMPILED_PREFIX) :]
        return key

    def gradients(self, images, loss, forward: Captured):
        """(value, {model key: gradient}, d value / d images, {stage: cotangent}) of the
        framework's loss of the model's logits by autograd, with the cotangent at every stage read at a
        module boundary (a module's input or output, the return value): the model runs once with
        the recorder keeping its own tensors with retain_grad, and each stage is read from their
        gradients as the forward reads it from their values (the same reshapes). Attention
        internals are not tapped."""
        import torch

        from impls.torch_vit import loss_value

        self.model.requires_grad_(True).zero_grad(set_to_none=True)
        x = images.detach().clone().requires_grad_(True)
        plan = forward.plan
        recorder = Recorder(self, forward.config, x.shape[0], plan.blocks)
        self.retain = True
        try:
            out = self.run(x, recorder, plan.watch())
            logits = forward.logits(out)
            logits.retain_grad()
            value = loss_value(logits, loss)
            value.backward()
        finally:
            self.retain = False

        def grad_of(t):
            return t.grad if t.grad is not None else torch.zeros_like(t)

        recorder.inputs = {k: map_arrays(v, grad_of, self.is_array) for k, v in recorder.inputs.items()}
        recorder.outputs = {k: map_arrays(v, grad_of, self.is_array) for k, v in recorder.outputs.items()}
        taps = forward.boundary_taps(recorder, self.numpy(grad_of(logits)))
        params = {
            k: self.numpy(p.grad) if p.grad is not None else np.zeros(tuple(p.shape), np.float32)
            for k, p in self.model.named_parameters()
        }
        return value.item(), params, self.numpy(grad_of(x)), taps

    def modules(self):
        return self._modules

    def quantized(self):
        """Each dynamically quantized Linear's int8 weight (torch.ao's quantize_dynamic), decoded
        from its integer codes, scales and zero points; its input is quantized at run time to 7
        bits (reduce_range, torch.ao's dynamic Linear since version 4) or 8."""

        read = {}
        for path, m in self._modules.items():
            weight = getattr(m, "weight", None)  # (torch.ao's dynamic Linear: a method)
            if hasattr(weight, "qdata") and hasattr(weight, "scale"):  # torchao's quantize_: a tensor subclass
                read[f"{path}.weight".lstrip(".")] = torchao_weight(weight, path)
                continue
            packed = getattr(m, "_packed_params", None)  # a quantized Linear's LinearPackedParams module
            if ".quantized" not in type(m).__module__ or not hasattr(packed, "dtype") or not callable(m.weight):
                continue
            if ".dynamic" not in type(m).__module__ or str(packed.dtype) != "torch.qint8":
                raise Unsupported(
                    f"{path} ({type(m).__module__}.{type(m).__name__}, {packed.dtype}) is not read yet: "
                    "torch.ao's dynamic int8 Linear is (docs/quantization.md)"
                )
            weight = torch_weight(m.weight())
            weight.input_levels = 127 if (getattr(m, "version", None) or 0) >= 4 else 255
            read[f"{path}.weight".lstrip(".")] = weight
        return read

    def integer_weights(self) -> dict[str, str]:
        found = {}
        for path, m in self._modules.items():
            own = [*m.named_parameters(recurse=False), *m.named_buffers(recurse=False)]
            for name, t in own:
                if "weight" in name and not (t.is_floating_point() or t.is_complex()):
                    found[path] = f"{path or 'the model'} ({type(m).__name__}: {name} {str(t.dtype).split('.')[-1]})"
        return found

    def params(self) -> dict[str, tuple]:
        return {k: tuple(v.shape) for k, v in self.model.state_dict().items()}

    def current(self, key):
        return self.model.state_dict()[key].detach().float().numpy()

    def load(self, arrays: dict, dtype: str, cast: bool = True) -> None:
        """Strictly; ``cast``: what a checkpoint holds (parameters, persistent buffers) to ``dtype``,
        as ``from_pretrained(dtype=...)`` loads it (else each keeps the dtype the model built it in:
        load_state_dict copies into the existing tensors)."""
        import torch

        tensors = {k: torch.from_numpy(np.array(v, np.float32)) for k, v in arrays.items()}
        self.model.load_state_dict(tensors, strict=True)
        self.model.eval()
        if cast:
            cast_as_loaded(self.model, getattr(torch, dtype))

    def to_input(self, images: np.ndarray, dtype: str):
        import torch

        return torch.tensor(images).to(getattr(torch, dtype))

    def numpy(self, x) -> np.ndarray:
        import torch

        return x.detach().float().numpy() if x.dtype == torch.bfloat16 else x.detach().numpy()  # NumPy: no bf16

    def is_array(self, x) -> bool:
        import torch

        return isinstance(x, torch.Tensor)

    def copy(self, x):
        if self.retain:  # a gradient pass: the tensor itself, whose gradient is the cotangent there
            if x.requires_grad:
                x.retain_grad()
            return x
        return x.detach().clone()

    def fast_paths(self) -> list[str]:
        """Modules whose native kernel a TorchFunctionMode would switch off (nn.MultiheadAttention
        and nn.TransformerEncoderLayer leave their fast path when any argument has a torch function):
        their model runs once on its own path with hooks only, and again for the internals."""
        return [
            p
            for p, m in self._modules.items()
            if type(m).__name__ in TORCH_FAST_PATHS and type(m).__module__.startswith("torch.nn")
        ]

    def _hooks(self, recorder: "Recorder", watch: dict[str, tuple[bool, bool]]) -> list:
        """Forward (pre-)hooks recording the input and output of each watched module; their handles."""
        handles = []
        for path, (want_in, want_out) in watch.items():
            module = self._modules[path]
            if want_in:
                handles.append(
                    module.register_forward_pre_hook(
                        lambda m, args, kwargs, path=path: recorder.enter(path, first_array(args, kwargs, self)),
                        with_kwargs=True,
                    )
                )
            if want_out:
                handles.append(
                    module.register_forward_hook(lambda m, args, output, path=path: recorder.leave(path, output))
                )
        return handles

    def run(self, inputs, recorder: "Recorder", watch: dict[str, tuple[bool, bool]], functions: bool = True):
        """The model on ``inputs`` with forward hooks at ``watch``; with ``functions`` also a
        TorchFunctionMode that records softmax, fused attention and the attention products
        (without it the model runs exactly its own path, native kernels included)."""
        import torch
        import torch.nn.functional as F

        handles = self._hooks(recorder, watch)
        sdpa = F.scaled_dot_product_attention
        on = callbacks(recorder)
        on_sdpa = on.fused("F.scaled_dot_product_attention", True, ("query", "key", "value", "attn_mask"))
        hooks = {
            "softmax": on.softmax,
            "matmul": on.product,
            "__matmul__": on.product,
            "bmm": on.product,
            "einsum": on.einsum,
            **dict.fromkeys(("mul", "__mul__", "__rmul__", "div", "__truediv__"), on.scale),
        }

        # F.multi_head_attention_forward runs whole under the mode (a mode is off inside its own
        # handler): its internals are recorded by wrapping the functions it calls for that call.
        mha = F.multi_head_attention_forward
        inside_mha = [
            hooked(F, "scaled_dot_product_attention", on_sdpa),
            hooked(F, "softmax", on.softmax),
            hooked(torch, "bmm", on.product),
            hooked(torch, "baddbmm", lambda a, k, out: on.product(a[1:], k, out)),
        ]

        def intercept(func, args, kwargs):
            if func is mha:
                with patched(inside_mha):
                    out = func(*args, **kwargs)
                recorder.scaled_inside("F.multi_head_attention_forward")
                return out
            out = func(*args, **kwargs)
            hook = on_sdpa if func is sdpa else hooks.get(getattr(func, "__name__", ""))
            if hook is not None:
                hook(args, kwargs, out)
            return out

        native = torch._native_multi_head_attention

        def native_mha(*args, **kwargs):  # the fast path ran: noted, not changed
            recorder.native(args[0] if args else None)
            return native(*args, **kwargs)

        autocast = (
            torch.autocast(inputs.device.type, dtype=getattr(torch, self.autocast))
            if self.autocast
            else contextlib.nullcontext()
        )
        try:
            torch._native_multi_head_attention = native_mha
            with (
                torch.enable_grad() if self.retain else torch.no_grad(),
                autocast,
                _intercept_mode()(intercept) if functions else contextlib.nullcontext(),
            ):
                if self.compiled is None:
                    return self.model(inputs, **self.call_kwargs)
                return self._compiled_call(
                    inputs, (tuple(inputs.shape), str(inputs.dtype), functions, self.retain, bool(watch))
                )
        finally:
            torch._native_multi_head_attention = native
            for h in handles:
                h.remove()

    def _compiled_call(self, inputs, key):
        """The compiled model's forward; on an input it has compiled for, under dynamo's
        ``fail_on_recompile`` stance: a recompilation there (a guard failing at every call, which
        dynamo ends by running eagerly past its recompile limit) is noted in ``recompiled``, and
        the call made again as dynamo would make it."""
        import torch

        if key not in self._compiled_for:
            self._compiled_for.add(key)
            return self._told(lambda: self.compiled(inputs, **self.call_kwargs), "compiled")
        try:
            with torch.compiler.set_stance("fail_on_recompile"):
                return self._told(lambda: self.compiled(inputs, **self.call_kwargs), "compiled")
        except RuntimeError as e:
            if "recompile" not in str(e):
                raise
            guards = [
                line.strip(" -") for line in str(e).splitlines() if line.strip().startswith("- ") and "==" in line
            ]
            self.recompiled = guards[0].split("#")[0].strip() if guards else str(e).splitlines()[0]
            return self._told(lambda: self.compiled(inputs, **self.call_kwargs), "compiled again")

    def _told(self, call, compiled: str):
        """``call()``, noting in ``path`` whether the wrapped module's own Python ``forward`` ran:
        past dynamo's recompile limit (or where it skips a frame) the model runs eagerly, silently,
        under any stance; compiled code never enters that code object (its trace is run instead)."""
        code, ran = type(self.model).forward.__code__, []
        before = sys.getprofile()

        def profile(frame, event, arg):
            if event == "call" and frame.f_code is code:
                ran.append(True)
            if before is not None:
                before(frame, event, arg)

        sys.setprofile(profile)
        try:
            out = call()
        finally:
            sys.setprofile(before)
        self.path = (
            "eager: the model's own forward ran (dynamo's recompile limit, or a skipped frame)" if ran else compiled
        )
        return out


@functools.lru_cache(maxsize=1)
def _intercept_mode():
    """One TorchFunctionMode class for every call (torch.compile guards on the mode stack's types:
    a class made per call would recompile a compiled model at each), each instance handing every
    torch function to its ``handler``."""
    from torch.overrides import TorchFunctionMode

    class Intercept(TorchFunctionMode):
        def __init__(self, handler):
            super().__init__()
            self.handler = handler

        def __torch_function__(self, func, types, args=(), kwargs=None):
            return self.handler(func, args, kwargs or {})

    return Intercept
