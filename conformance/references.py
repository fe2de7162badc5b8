"""Independent oracles built by the libraries that define the behaviour, with random weights.

timm's ``VisionTransformer`` is the reference of this project's canonical layout; its stages
are read through forward hooks on timm's own modules, not recomputed here.
"""

from __future__ import annotations

import contextlib
import math
import tempfile
from collections.abc import Mapping
from contextlib import contextmanager

import numpy as np

from impls.protocol import VIT_FAMILY, ViTConfig, check_images
from impls.stages import STAGES, tap_shapes
from conformance.capture.reading import to_tap_shape
from weights import hf
from conformance.timm_models import (  # noqa: F401 - timm's models, re-exported where they were
    TIMM_NAFLEX,
    NotInTimm,
    eva_key,
    not_in_timm,
    sam_state,
    timm_naflexvit,
    timm_vit,
)


def _numpy(t) -> np.ndarray:
    import torch

    return (t.float() if t.dtype == torch.bfloat16 else t).detach().numpy()  # NumPy has no bfloat16


def timm_state_keys(model) -> dict[str, tuple[int, ...]]:
    """Each canonical key of timm's model (VisionTransformer's, Eva's, NaFlexVit's) and its shape, in its order."""
    return {k: v.shape for k, v in timm_state(model, meta=True).items()}


def timm_state(model, meta: bool = False) -> dict[str, np.ndarray]:
    state = {k: v.detach().float() for k, v in model.state_dict().items()}
    if meta:  # shapes only: a model on the meta device holds no values
        state = {k: np.broadcast_to(np.float32(0), v.shape) for k, v in state.items()}
    else:
        state = {k: v.numpy().copy() for k, v in state.items()}
    if hasattr(model, "embeds"):  # timm's NaFlexVit
        from weights.layouts.naflex import to_canonical

        proj = model.embeds.proj
        return to_canonical(state, model.embeds.patch_size, proj.in_features // math.prod(model.embeds.patch_size))
    if _is_sam(model):  # its position table on the grid: the canonical (1, N, D)
        return sam_state(state, None, back=True)
    return {eva_key(k, back=True): v for k, v in state.items()}


def _is_sam(model) -> bool:
    return type(model).__name__ == "VisionTransformerSAM"


def timm_taps(model, images: np.ndarray, shapes=None) -> dict[str, np.ndarray]:
    """Run timm's model and collect every stage of the tap protocol from its modules; ``shapes``
    (``tap_shapes``), each tap brought to its shape where timm holds it otherwise (its SAM's grids,
    windows and heads within the batch)."""
    import torch

    taps: dict = {}
    dtype = next(model.parameters()).dtype
    if isinstance(images, Mapping):  # a packed batch (NaFlexVit's dict): its patches in the model's dtype
        x = {k: torch.tensor(np.asarray(v)).to(dtype if k == "patches" else None) for k, v in images.items()}
        batch = len(images["patches"])
    else:
        x, batch = torch.tensor(np.asarray(images)).to(dtype), len(images)  # a copy: inputs may be read-only
    with torch.no_grad(), _hooked(model, taps):
        taps["logits"] = model(x)
    # a stage of the weights alone (BEiT's bias) is broadcast over the batch, as the ports emit it
    taps = {k: _numpy(v.expand(batch, *v.shape[1:]) if v.shape[0] == 1 else v) for k, v in taps.items()}
    return taps if shapes is None else {k: to_tap_shape(v, shapes.get(k)) for k, v in taps.items()}


# timm's VisionTransformerSAM: its final norm is the neck's place (channels first), the pooled
# features the head's fc's input, the decomposed bias the last sum (its offsets' and rel_h + rel_w before)
_SAM_RULES = {"norm": "out:neck@nchw", "pooled": "in:head.fc", "attn.rel_pos": "added:last"}


def _timm_scopes(model):
    """(the table's scope, the stage-name prefix, timm's module) for every scope timm's model has."""
    yield "", "", model
    for i, blk in enumerate(model.blocks):
        yield "block", f"blocks.{i}", blk
    if getattr(model, "attn_pool", None) is not None:  # (timm's Beit has none)
        yield "attn_pool", "attn_pool", model.attn_pool


@contextmanager
def _hooked(model, taps: dict):
    """While inside, timm's modules record each stage of the tap protocol into ``taps``, where
    the stage table's ``timm`` rules say (impls.stages). A stage exists where its module does:
    an ``out:`` rule on an ``nn.Identity`` (LayerScale, qk-norm, a final norm timm left out) is
    no stage."""
    import torch

    hooks, softmax, typed, values, added = [], [], [], [], []
    sam = _is_sam(model)

    def record(name, how, attention):
        def store(value):
            if how == "tokens" and value.ndim == 4:  # NHWC under dynamic_img_size: flattened as the tap
                value = value.flatten(1, 2)
            elif how == "nchw":  # channels first (timm's SAM's LayerNorm2d): the tokens' rows
                value = value.permute(0, 2, 3, 1).flatten(1, 2)
            elif how == "v":  # the last of a fused projection's parts, split into its attention's heads
                b, n, width = value.shape
                heads, head_dim = attention.num_heads, attention.head_dim
                value = value.reshape(b, n, width // (heads * head_dim), heads, head_dim)[:, :, -1].transpose(1, 2)
            taps[name] = value.clone()  # NaFlexVit adds its position table in place, after its embeds.norm

        return store

    for scope, prefix, root in _timm_scopes(model):
        for attention in (m for m in root.modules() if hasattr(m, "fused_attn")):
            attention.fused_attn = False  # the explicit path, whose weights pass through attn_drop
        for stage in (s for s in STAGES if s.scope == scope):
            name = f"{prefix}.{stage.name}".strip(".") if prefix else stage.name
            rule, _, how = (_SAM_RULES.get(stage.name, stage.timm_rule()) if sam else stage.timm_rule()).partition("@")
            where, _, path = rule.partition(":")
            if where == "return":
                continue  # timm_taps keeps the model's output
            if where == "softmax":
                softmax.append((root, name))
                continue
            if where == "typed":  # timm's Eva casts its rotated q, then k, with type_as
                typed.append((root.get_submodule("attn"), name, int(path)))
                continue
            if where == "values":  # P v's second operand: no module shows v in Eva's attention
                values.append((root.get_submodule("attn"), name))
                continue
            if where == "added":  # what Beit's attention adds to its logits, (1, H, N, N), where it has a table
                attention = root.get_submodule("attn")  # Beit's table, or SAM's decomposed one's rows
                table = "relative_position_bias_table" if stage.name == "attn.rel_pos_bias" else "rel_pos_h"
                if getattr(attention, table, None) is not None:
                    added.append((attention, name, None if path == "last" else int(path or 0)))
                continue
            if path.startswith("patch_embed") and hasattr(root, "embeds"):  # timm's NaFlexVit: its embeds
                path = "embeds" + path.removeprefix("patch_embed")
            try:
                module = root.get_submodule(path) if path else root
            except AttributeError:  # a stage timm has no module for (a patch norm): no stage
                continue
            store = record(name, how, root.get_submodule(path.rpartition(".")[0]))
            if where == "in":
                hooks.append(module.register_forward_pre_hook(lambda m, args, store=store: store(args[0])))
            elif not isinstance(module, torch.nn.Identity):
                hooks.append(module.register_forward_hook(lambda m, args, output, store=store: store(output)))
    try:
        with contextlib.ExitStack() as stack:
            for root, name in softmax:
                stack.enter_context(_CallRecorder(root, taps, name, _softmaxes()))
            for attention, name, index in typed:
                stack.enter_context(_CallRecorder(attention, taps, name, (torch.Tensor.type_as,), index))
            for attention, name in values:  # the explicit path's second product, P v
                products = (torch.matmul, torch.Tensor.__matmul__, torch.Tensor.matmul)
                stack.enter_context(_CallRecorder(attention, taps, name, products, 1, operand=1))
            for attention, name, index in added:  # the explicit path's index-th sum (None: last), its second operand
                sums = (torch.add, torch.Tensor.__add__, torch.Tensor.add)
                stack.enter_context(_CallRecorder(attention, taps, name, sums, index, operand=1))
            yield taps
    finally:
        for h in hooks:
            h.remove()


def timm_make_grad(config: ViTConfig, state: dict[str, np.ndarray], *, train: bool = True, **rates):
    """timm's VisionTransformer as a gradient factory, in training mode (``model.train()``, as
    fine-tuning runs it) with timm's dropout and drop-path ``rates`` (default 0: a train-mode
    switch at rate 0 must give eval's numerics). Tap cotangents are the gradients retained on
    the tensors its modules emit (v, a view taken beside the forward, has none)."""
    import torch

    from impls.torch_vit import loss_value

    model = timm_vit(config, state, **rates).requires_grad_(True).train(train)

    def grad(images, loss):
        images = np.asarray(images)
        check_images(images.shape, str(images.dtype), config)
        model.zero_grad(set_to_none=True)
        x = torch.tensor(images, requires_grad=True)
        taps: dict = {}
        with _hooked(model, taps):
            logits = model(x)
        for t in taps.values():
            if t.requires_grad:
                t.retain_grad()
        value = loss_value(logits, loss)
        value.backward()
        return {
            "loss": value.item(),
            "params": {k: _numpy(p.grad) for k, p in model.named_parameters()},
            "images": _numpy(x.grad),
            "taps": {k: _numpy(t.grad) for k, t in taps.items() if t.grad is not None},
        }

    return grad


def _softmaxes():
    import torch

    return (torch.softmax, torch.Tensor.softmax, torch.nn.functional.softmax)


class _CallRecorder:
    """The output (or the ``operand``-th argument) of a function called while ``module`` runs: the
    ``index``-th call of one of ``funcs``, or (None) the last (timm's AttentionPoolLatent passes
    its attention weights through no module, Eva its rotated q and k, and its v)."""

    def __init__(self, module, taps, name, funcs, index=None, operand=None):
        self.module, self.taps, self.name, self.funcs, self.index = module, taps, name, funcs, index
        self.operand = operand

    def __enter__(self):
        from torch.overrides import TorchFunctionMode

        taps, name, funcs, index, operand, calls = self.taps, self.name, self.funcs, self.index, self.operand, []

        class Mode(TorchFunctionMode):
            def __torch_function__(self, func, types, args=(), kwargs=None):
                result = func(*args, **(kwargs or {}))
                if func in funcs:
                    if index is None or len(calls) == index:
                        taps[name] = result if operand is None else args[operand]
                    calls.append(func)
                return result

        self.mode = Mode()

        def enter(module, args):
            calls.clear()  # the calls of this run of the module are counted
            self.mode.__enter__()

        self.pre = self.module.register_forward_pre_hook(enter)
        self.post = self.module.register_forward_hook(
            lambda m, a, o: None if self.mode.__exit__(None, None, None) else None
        )
        return self

    def __exit__(self, *exc):
        self.pre.remove()
        self.post.remove()


_TORCH_DTYPES = {"float32": "float32", "bfloat16": "bfloat16", "float16": "float16"}


def timm_port(config: ViTConfig, state: dict[str, np.ndarray], dtype: str = "float32"):
    """timm's VisionTransformer as a port factory: every stage read through hooks on its own
    modules, computed in ``dtype`` as timm runs it (``model.to(dtype)``)."""
    import torch

    model = timm_vit(config, state, dtype=getattr(torch, _TORCH_DTYPES[dtype]))

    return lambda images: timm_taps(model, np.asarray(images), tap_shapes(config, len(images)))


def timm_named_port(name: str):
    """``timm.create_model(name)`` as a port factory: built at the config's image size and depth (the
    rest is the named model's own), given the canonical state strictly (timm's Eva's LayerScale as
    its gamma_1 and gamma_2), every stage read through hooks, computed in ``dtype``."""

    def make(config: ViTConfig, state: dict[str, np.ndarray], dtype: str = "float32"):
        import timm
        import torch

        model = timm.create_model(name, pretrained=False, img_size=config.img_size, depth=config.depth)
        if hasattr(model, "embeds"):  # timm's NaFlexVit holds the embedding's weights as its own layout
            from weights.layouts.naflex import from_canonical

            state = from_canonical(dict(state), config)
        else:
            state = {eva_key(k): v for k, v in state.items()}
        model.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in state.items()}, strict=True)
        model = model.to(getattr(torch, _TORCH_DTYPES[dtype])).eval()
        return lambda images: timm_taps(model, np.asarray(images))

    make.supports = VIT_FAMILY  # the named model's own options: the config says them
    return make


def transformers_port(config: ViTConfig, state: dict[str, np.ndarray], dtype: str = "float32"):
    """transformers' ViTForImageClassification as a port factory (logits only): the canonical
    state written as a Hugging Face checkpoint by this project's exporter and read back by
    ``from_pretrained`` (which maps checkpoint names to transformers' current modules),
    computed in ``dtype``."""

    import torch
    from transformers import ViTForImageClassification
    from transformers.utils import logging

    logging.disable_progress_bar()
    torch_dtype = getattr(torch, _TORCH_DTYPES[dtype])
    with tempfile.TemporaryDirectory() as tmp:
        hf.write_hf(state, config, tmp)
        model = ViTForImageClassification.from_pretrained(tmp).eval().to(torch_dtype)

    @torch.no_grad()
    def forward(images):
        return _numpy(model(pixel_values=torch.tensor(np.asarray(images)).to(torch_dtype)).logits)

    return forward
