"""Backward mutants: ports whose forward is bitwise the correct port's and whose gradients are
wrong, each as it is written in a real port. Each name maps to (forward factory, gradient
factory); conformance/tests/test_gradients.py shows the forward passes and the gradient check
locates it. (They join the zoo's catalogue with `verify --grad`, the issue's next slice.)"""

from __future__ import annotations

from functools import partial

from impls import mlx_vit as M  # first: it loads OpenBLAS before mlx.core
from impls import jax_vit as J  # noqa: I001
from impls import torch_vit as T

import mlx.core as mx  # noqa: E402, I001
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402


# --- a frozen position embedding: `pos_embed.requires_grad = False` in a fine-tuning script, or
# a `.detach()` left from an interpolation helper; the forward is untouched.
class VisionTransformerFrozenPosEmbed(T.VisionTransformer):
    def _pos_embed(self, x, grid):
        B, _, D = x.shape
        c = self.config
        pos = T.resample_pos_embed(self.pos_embed.detach(), c.grid_size, grid,
                                   0 if c.no_embed_class else c.num_prefix_tokens)
        tokens = ([self.cls_token] if c.class_token else []) + ([self.reg_token] if c.reg_tokens else [])
        prefix = [t.expand(B, -1, -1) for t in tokens]
        if c.no_embed_class:
            return torch.cat(prefix + [x + pos], dim=1)
        return torch.cat(prefix + [x], dim=1) + pos


# --- a hand-written GELU whose backward keeps Phi(x) and drops x * phi(x) from
# d/dx [x Phi(x)]: the forward is F.gelu exactly, as in autograd.Functions written to save memory.
class _GeluHalfBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return F.gelu(x)

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return grad * 0.5 * (1.0 + torch.erf(x * 0.5 ** 0.5))


class GELUHalfBackward(torch.nn.Module):
    def forward(self, x):
        return _GeluHalfBackward.apply(x)


class MlpGeluHalfBackward(T.Mlp):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.act = GELUHalfBackward()


# --- a residual branch detached: `x = x + attn(...).detach()`, the attention branch trains
# nothing and passes no gradient back; the sum is the same.
class AttentionDetached(T.Attention):
    def forward(self, x, taps=None, name="attn"):
        return super().forward(x, taps, name).detach()


# --- MLX: the class token behind mx.stop_gradient (a frozen-token trick carried into fine-tuning).
class VisionTransformerClsStopGradient(M.VisionTransformer):
    def _pos_embed(self, x, grid):
        cls_token = self.cls_token
        self.cls_token = mx.stop_gradient(cls_token)
        try:
            return super()._pos_embed(x, grid)
        finally:
            self.cls_token = cls_token


def _pair(module, **layers):
    return partial(module.make, **layers), partial(module.make_grad, **layers)


BACKWARD_MUTANTS = {
    # name: ((forward factory, gradient factory), the first parameter found in backward order, source)
    "torch_pos_embed_frozen": (_pair(T, model_cls=VisionTransformerFrozenPosEmbed), "pos_embed",
                               "requires_grad=False / .detach() on the position embedding"),
    "torch_gelu_backward_missing_term": (_pair(T, mlp_layer=MlpGeluHalfBackward), "blocks.1.mlp.fc1.bias",
                                         "a hand-written GELU backward without the x * pdf(x) term"),
    "torch_attn_residual_detached": (_pair(T, attn_layer=AttentionDetached), "blocks.1.attn.proj.bias",
                                     "x + attn(...).detach(): a residual branch cut from the graph"),
    "mlx_cls_token_stop_gradient": (_pair(M, model_cls=VisionTransformerClsStopGradient), "cls_token",
                                    "mx.stop_gradient on the class token"),
}


# --- Optimizer mutants: one AdamW step written with another library's defaults or another
# algorithm; each is the port's adamw_step with its optimizer swapped.
def _mlx_adamw_defaults(hp):
    import mlx.optimizers as optim

    return optim.AdamW(learning_rate=hp.lr, betas=list(hp.betas), eps=hp.eps, weight_decay=hp.weight_decay)


def _torch_adam_l2(named_parameters, hp):
    return torch.optim.Adam(T.param_groups(named_parameters, hp), lr=hp.lr, betas=hp.betas, eps=hp.eps)


def _torch_adamw_decays_everything(named_parameters, hp):
    return torch.optim.AdamW([p for _, p in named_parameters], lr=hp.lr, betas=hp.betas, eps=hp.eps,
                             weight_decay=hp.weight_decay)


def _optax_adamw_defaults(hp):
    import optax

    return optax.adamw(hp.lr, b1=hp.betas[0], b2=hp.betas[1], eps=hp.eps)


OPTIMIZER_MUTANTS = {
    # name: (adamw_step, the difference, the decay rule it is run under)
    "mlx_adamw_without_bias_correction": (partial(M.adamw_step, optimizer=_mlx_adamw_defaults),
                                          "mlx.optimizers.AdamW's default bias_correction=False", "all"),
    "torch_adam_with_l2_decay": (partial(T.adamw_step, optimizer=_torch_adam_l2),
                                 "torch.optim.Adam(weight_decay=...): L2 added to the gradient, not decoupled", "all"),
    "jax_optax_default_weight_decay": (partial(J.adamw_step, optimizer=_optax_adamw_defaults),
                                       "optax.adamw's default weight_decay 1e-4 for torch's 1e-2", "all"),
    "torch_adamw_decays_norms_and_biases": (partial(T.adamw_step, optimizer=_torch_adamw_decays_everything),
                                            "AdamW(model.parameters()) where timm's rule exempts norms, biases and "
                                            "embeddings", "timm"),
}
