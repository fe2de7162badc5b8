"""Independent oracles built by the libraries that define the behaviour, with random weights.

timm's ``VisionTransformer`` is the reference of this project's canonical layout; its stages
are read through forward hooks on timm's own modules, not recomputed here.
"""

from __future__ import annotations

from contextlib import contextmanager

import numpy as np

from impls.protocol import ViTConfig


def timm_vit(config: ViTConfig, state: dict[str, np.ndarray] | None = None, dtype=None, **rates):
    """timm's VisionTransformer for ``config`` in eval mode, with ``state`` loaded strictly.
    ``rates``: timm's dropout and drop-path rates (drop_rate, attn_drop_rate, drop_path_rate, ...)."""
    import torch
    from timm.layers import Mlp, SwiGLU, SwiGLUPacked
    from timm.models.vision_transformer import VisionTransformer

    mlp_layer = {"mlp": Mlp, "swiglu_packed": SwiGLUPacked, "swiglu": SwiGLU}[config.mlp_layer]
    model = VisionTransformer(
        img_size=config.img_size, patch_size=config.patch_size, in_chans=config.in_chans,
        num_classes=config.num_classes, global_pool=config.global_pool, class_token=config.class_token,
        embed_dim=config.embed_dim, depth=config.depth, num_heads=config.num_heads,
        mlp_ratio=config.mlp_ratio, qkv_bias=config.qkv_bias, reg_tokens=config.reg_tokens,
        no_embed_class=config.no_embed_class, pre_norm=config.pre_norm, fc_norm=config.fc_norm,
        init_values=config.init_values, qk_norm=config.qk_norm, act_layer=config.act_layer,
        proj_bias=config.proj_bias, mlp_layer=mlp_layer, dynamic_img_size=config.dynamic_img_size, **rates,
    )
    for module in model.modules():
        if isinstance(module, torch.nn.LayerNorm):
            module.eps = config.norm_eps
    if state is not None:
        model.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in state.items()}, strict=True)
    if dtype is not None:
        model = model.to(dtype)
    return model.eval()


def _numpy(t) -> np.ndarray:
    import torch

    return (t.float() if t.dtype == torch.bfloat16 else t).detach().numpy()  # NumPy has no bfloat16


def timm_state(model) -> dict[str, np.ndarray]:
    return {k: v.detach().float().numpy().copy() for k, v in model.state_dict().items()}


def timm_taps(model, images: np.ndarray) -> dict[str, np.ndarray]:
    """Run timm's model and collect every stage of the tap protocol from its modules."""
    import torch

    taps: dict = {}
    with torch.no_grad(), _hooked(model, taps):
        dtype = next(model.parameters()).dtype
        taps["logits"] = model(torch.tensor(np.asarray(images)).to(dtype))  # a copy: inputs may be read-only
    return {k: _numpy(v) for k, v in taps.items()}


@contextmanager
def _hooked(model, taps: dict):
    """While inside, timm's modules record each stage of the tap protocol into ``taps``."""
    import torch

    hooks = []

    def out(name):
        return lambda module, args, output: taps.__setitem__(name, output)

    def arg(name):
        return lambda module, args: taps.__setitem__(name, args[0])

    def v_of(name, num_heads, head_dim, parts):
        def hook(module, args, o):
            taps[name] = o.reshape(o.shape[0], o.shape[1], parts, num_heads, head_dim)[:, :, parts - 1].transpose(1, 2)
        return hook

    hooks.append(model.patch_embed.register_forward_hook(  # NHWC under dynamic_img_size: flattened as the tap
        lambda m, a, o: taps.__setitem__("patch_embed", o.flatten(1, 2) if o.ndim == 4 else o)))
    hooks.append(model.pos_drop.register_forward_hook(out("embed")))
    if not isinstance(model.norm_pre, torch.nn.Identity):
        hooks.append(model.norm_pre.register_forward_hook(out("norm_pre")))
    for i, blk in enumerate(model.blocks):
        p = f"blocks.{i}"
        blk.attn.fused_attn = False  # the explicit path, whose weights pass through attn_drop
        hooks.append(blk.norm1.register_forward_hook(out(f"{p}.norm1")))
        hooks.append(blk.attn.q_norm.register_forward_pre_hook(arg(f"{p}.attn.q")))
        hooks.append(blk.attn.k_norm.register_forward_pre_hook(arg(f"{p}.attn.k")))
        hooks.append(blk.attn.qkv.register_forward_hook(v_of(f"{p}.attn.v", blk.attn.num_heads, blk.attn.head_dim, 3)))
        if not isinstance(blk.attn.q_norm, torch.nn.Identity):
            hooks.append(blk.attn.q_norm.register_forward_hook(out(f"{p}.attn.q_norm")))
            hooks.append(blk.attn.k_norm.register_forward_hook(out(f"{p}.attn.k_norm")))
        hooks.append(blk.attn.attn_drop.register_forward_hook(out(f"{p}.attn.weights")))
        hooks.append(blk.attn.register_forward_hook(out(f"{p}.attn")))
        for ls in ("ls1", "ls2"):
            if not isinstance(getattr(blk, ls), torch.nn.Identity):
                hooks.append(getattr(blk, ls).register_forward_hook(out(f"{p}.{ls}")))
        hooks.append(blk.norm2.register_forward_hook(out(f"{p}.norm2")))
        hooks.append(blk.mlp.fc2.register_forward_pre_hook(arg(f"{p}.mlp.act")))  # act, or act(gate) * value
        hooks.append(blk.mlp.register_forward_hook(out(f"{p}.mlp")))
        hooks.append(blk.register_forward_hook(out(p)))
    if not isinstance(model.norm, torch.nn.Identity):
        hooks.append(model.norm.register_forward_hook(out("norm")))
    pool = model.attn_pool
    if pool is not None:
        pool.fused_attn = False
        hooks.append(pool.q_norm.register_forward_pre_hook(arg("attn_pool.q")))
        hooks.append(pool.k_norm.register_forward_pre_hook(arg("attn_pool.k")))
        hooks.append(pool.kv.register_forward_hook(v_of("attn_pool.v", pool.num_heads, pool.head_dim, 2)))
        hooks.append(pool.proj.register_forward_hook(out("attn_pool.proj")))
        hooks.append(pool.norm.register_forward_hook(out("attn_pool.norm")))
        hooks.append(pool.mlp.fc2.register_forward_pre_hook(arg("attn_pool.mlp.act")))
        hooks.append(pool.mlp.register_forward_hook(out("attn_pool.mlp")))
        hooks.append(pool.register_forward_hook(out("attn_pool")))
    hooks.append(model.head.register_forward_pre_hook(lambda m, args: taps.__setitem__("pooled", args[0])))
    try:
        with _softmax_outputs(pool, taps, "attn_pool.weights"):
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

    from impls.protocol import check_images
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
        return {"loss": value.item(), "params": {k: _numpy(p.grad) for k, p in model.named_parameters()},
                "images": _numpy(x.grad), "taps": {k: _numpy(t.grad) for k, t in taps.items() if t.grad is not None}}

    return grad


class _SoftmaxRecorder:
    """The attention weights of timm's AttentionPoolLatent, which passes them through no module:
    the output of the softmax called while ``module`` runs."""

    def __init__(self, module, taps, name):
        self.module, self.taps, self.name = module, taps, name

    def __enter__(self):
        import torch
        from torch.overrides import TorchFunctionMode

        taps, name = self.taps, self.name

        class Mode(TorchFunctionMode):
            def __torch_function__(self, func, types, args=(), kwargs=None):
                result = func(*args, **(kwargs or {}))
                if func in (torch.softmax, torch.Tensor.softmax, torch.nn.functional.softmax):
                    taps[name] = result
                return result

        self.mode = Mode()
        self.pre = self.module.register_forward_pre_hook(lambda m, a: None if self.mode.__enter__() else None)
        self.post = self.module.register_forward_hook(lambda m, a, o: None if self.mode.__exit__(None, None, None)
                                                      else None)
        return self

    def __exit__(self, *exc):
        self.pre.remove()
        self.post.remove()


def _softmax_outputs(module, taps, name):
    import contextlib

    return contextlib.nullcontext() if module is None else _SoftmaxRecorder(module, taps, name)


_TORCH_DTYPES = {"float32": "float32", "bfloat16": "bfloat16", "float16": "float16"}


def timm_port(config: ViTConfig, state: dict[str, np.ndarray], dtype: str = "float32"):
    """timm's VisionTransformer as a port factory: every stage read through hooks on its own
    modules, computed in ``dtype`` as timm runs it (``model.to(dtype)``)."""
    import torch

    model = timm_vit(config, state, dtype=getattr(torch, _TORCH_DTYPES[dtype]))

    return lambda images: timm_taps(model, np.asarray(images))


def transformers_port(config: ViTConfig, state: dict[str, np.ndarray], dtype: str = "float32"):
    """transformers' ViTForImageClassification as a port factory (logits only): the canonical
    state written as a Hugging Face checkpoint by this project's exporter and read back by
    ``from_pretrained`` (which maps checkpoint names to transformers' current modules),
    computed in ``dtype``."""
    import tempfile

    import torch
    from transformers import ViTForImageClassification
    from transformers.utils import logging

    from weights import hf

    logging.disable_progress_bar()
    torch_dtype = getattr(torch, _TORCH_DTYPES[dtype])
    with tempfile.TemporaryDirectory() as tmp:
        hf.write_hf(state, config, tmp)
        model = ViTForImageClassification.from_pretrained(tmp).eval().to(torch_dtype)

    @torch.no_grad()
    def forward(images):
        return _numpy(model(pixel_values=torch.tensor(np.asarray(images)).to(torch_dtype)).logits)

    return forward
