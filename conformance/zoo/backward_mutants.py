"""Backward mutants: ports whose forward is bitwise the correct port's and whose gradients are
wrong, each as it is written in a real port: a gradient factory (``make_grad``, what `verify
--grad` and `--grad-port` take), listed in the zoo's catalogue with where it is located.
conformance/tests/test_gradients.py shows each one's forward (``forward_factory``) passes every
forward check. Then optimizer mutants: one AdamW step with another library's defaults."""

from __future__ import annotations

import sys
from functools import partial

from impls import mlx_vit as M  # first: it loads OpenBLAS before mlx.core
from impls import jax_vit as J  # noqa: I001
from impls import torch_vit as T

import jax  # noqa: E402, I001
import mlx.core as mx  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402


# --- a frozen position embedding: `pos_embed.requires_grad = False` in a fine-tuning script, or
# a `.detach()` left from an interpolation helper; the forward is untouched.
class VisionTransformerFrozenPosEmbed(T.VisionTransformer):
    def _pos_embed(self, x, grid):
        B, _, D = x.shape
        c = self.config
        pos = T.resample_pos_embed(
            self.pos_embed.detach(), c.grid_size, grid, 0 if c.no_embed_class else c.num_prefix_tokens
        )
        tokens = ([self.cls_token] if c.class_token else []) + ([self.reg_token] if c.reg_tokens else [])
        prefix = [t.expand(B, -1, -1) for t in tokens]
        if c.no_embed_class:
            return torch.cat(prefix + [x + pos], dim=1)
        return torch.cat(prefix + [x], dim=1) + pos


class _ExactGelu(torch.autograd.Function):
    """F.gelu exactly in the forward; each mutant below writes its own backward."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return F.gelu(x)


class _Applied(torch.nn.Module):
    def __init__(self, function):
        super().__init__()
        self.function = function

    def forward(self, *args):
        return self.function.apply(*args)


# --- a hand-written GELU whose backward keeps Phi(x) and drops x * phi(x) from
# d/dx [x Phi(x)], as in autograd.Functions written to save memory.
class _GeluHalfBackward(_ExactGelu):
    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return grad * 0.5 * (1.0 + torch.erf(x * 0.5**0.5))


class MlpGeluHalfBackward(T.Mlp):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.act = _Applied(_GeluHalfBackward)


# --- the same GELU with the tanh approximation's derivative in its backward (a fused
# kernel's backward written for the other GELU): the two slopes differ by up to 2e-3 where
# |x| is about 2, and agree near 0, so only the stage-wise bound sees it on ordinary weights.
class _GeluTanhBackward(_ExactGelu):
    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        with torch.enable_grad():
            x = x.detach().requires_grad_(True)
            (slope,) = torch.autograd.grad(F.gelu(x, approximate="tanh").sum(), x)
        return grad * slope


class MlpGeluTanhBackward(T.Mlp):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.act = _Applied(_GeluTanhBackward)


# --- a LayerNorm whose backward treats the mean and variance as constants (statistics taken
# through `.detach()`): dx = g w / sigma, without the mean's and the variance's terms; the
# forward is F.layer_norm exactly, and the weight's and bias's gradients are right.
class _LayerNormDetachedStatistics(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, eps):
        ctx.save_for_backward(x, weight)
        ctx.eps = eps
        return F.layer_norm(x, x.shape[-1:], weight, bias, eps)

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        rstd = torch.rsqrt(x.var(-1, unbiased=False, keepdim=True) + ctx.eps)
        x_hat = (x - x.mean(-1, keepdim=True)) * rstd
        dims = tuple(range(grad.dim() - 1))
        return grad * weight * rstd, (grad * x_hat).sum(dims), grad.sum(dims), None


class LayerNormDetachedStatistics(torch.nn.LayerNorm):
    def forward(self, x):
        return _LayerNormDetachedStatistics.apply(x, self.weight, self.bias, self.eps)


class BlockNorm2DetachedStatistics(T.Block):
    def __init__(self, config, *args, **kwargs):
        super().__init__(config, *args, **kwargs)
        self.norm2 = LayerNormDetachedStatistics(config.embed_dim, eps=config.norm_eps)


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


# --- JAX: attention whose softmax is a custom_vjp kernel with the backward P * g, without the
# row normaliser's term - P * sum(P * g); the forward is jax.nn.softmax, so the weights are exact.
@jax.custom_vjp
def _softmax_kernel(logits):
    return jax.nn.softmax(logits, axis=-1)


def _softmax_kernel_forward(logits):
    weights = jax.nn.softmax(logits, axis=-1)
    return weights, weights


def _softmax_kernel_backward(weights, grad):
    return (weights * grad,)


_softmax_kernel.defvjp(_softmax_kernel_forward, _softmax_kernel_backward)


class AttentionSoftmaxKernel(J.Attention):
    def __call__(self, x, taps=None, name="attn"):  # J.Attention's explicit path, the kernel's softmax
        B, N, C = x.shape
        qkv = self.qkv(x).reshape(B, N, 3, self.num_heads, self.head_dim).transpose(2, 0, 3, 1, 4)
        q, k, v = (J.record_tap(taps, f"{name}.{n}", t) for n, t in zip("qkv", qkv))
        attn = _softmax_kernel(J._matmul(q * self.scale, k.swapaxes(-2, -1)).astype(jax.numpy.float32))
        attn = J.record_tap(taps, f"{name}.weights", attn.astype(v.dtype))
        x = J.record_tap(taps, name, self.proj(J.merge_heads(J._matmul(attn, v))))
        return x


# The gradient factories, as a user passes them: --grad / --grad-port
# conformance.zoo.backward_mutants:torch_pos_embed_frozen
torch_pos_embed_frozen = partial(T.make_grad, model_cls=VisionTransformerFrozenPosEmbed)
torch_gelu_backward_missing_term = partial(T.make_grad, mlp_layer=MlpGeluHalfBackward)
torch_gelu_tanh_backward = partial(T.make_grad, mlp_layer=MlpGeluTanhBackward)
torch_layernorm_detached_statistics = partial(T.make_grad, block_fn=BlockNorm2DetachedStatistics)
torch_attn_residual_detached = partial(T.make_grad, attn_layer=AttentionDetached)
mlx_cls_token_stop_gradient = partial(M.make_grad, model_cls=VisionTransformerClsStopGradient)
jax_softmax_kernel_backward = partial(J.make_grad, attn_layer=AttentionSoftmaxKernel)


def forward_factory(make_grad: partial) -> partial:
    """The same port's forward factory: its module's ``make`` with the same layers."""
    return partial(sys.modules[make_grad.func.__module__].make, **make_grad.keywords)


# --- Optimizer mutants: one AdamW step written with another library's defaults or another
# algorithm; each is the port's adamw_step with its optimizer swapped.
def _mlx_adamw_defaults(hp):
    import mlx.optimizers as optim

    return optim.AdamW(learning_rate=hp.lr, betas=list(hp.betas), eps=hp.eps, weight_decay=hp.weight_decay)


def _torch_adam_l2(named_parameters, hp):
    return torch.optim.Adam(T.param_groups(named_parameters, hp), lr=hp.lr, betas=hp.betas, eps=hp.eps)


def _torch_adamw_decays_everything(named_parameters, hp):
    return torch.optim.AdamW(
        [p for _, p in named_parameters], lr=hp.lr, betas=hp.betas, eps=hp.eps, weight_decay=hp.weight_decay
    )


def _optax_adamw_defaults(hp):
    import optax

    return optax.adamw(hp.lr, b1=hp.betas[0], b2=hp.betas[1], eps=hp.eps)


def _optax_eps_inside_sqrt(hp):
    import optax

    return optax.adamw(hp.lr, b1=hp.betas[0], b2=hp.betas[1], eps=0.0, eps_root=hp.eps, weight_decay=hp.weight_decay)


OPTIMIZER_MUTANTS = {
    # name: (adamw_step, the difference, the decay rule it is run under)
    "mlx_adamw_without_bias_correction": (
        partial(M.adamw_step, optimizer=_mlx_adamw_defaults),
        "mlx.optimizers.AdamW's default bias_correction=False",
        "all",
    ),
    "torch_adam_with_l2_decay": (
        partial(T.adamw_step, optimizer=_torch_adam_l2),
        "torch.optim.Adam(weight_decay=...): L2 added to the gradient, not decoupled",
        "all",
    ),
    "jax_optax_default_weight_decay": (
        partial(J.adamw_step, optimizer=_optax_adamw_defaults),
        "optax.adamw's default weight_decay 1e-4 for torch's 1e-2",
        "all",
    ),
    "jax_optax_eps_inside_sqrt": (
        partial(J.adamw_step, optimizer=_optax_eps_inside_sqrt),
        "optax.adamw(eps=0, eps_root=eps): eps under the square root",
        "all",
    ),
    "torch_adamw_decays_norms_and_biases": (
        partial(T.adamw_step, optimizer=_torch_adamw_decays_everything),
        "AdamW(model.parameters()) where timm's rule exempts norms, biases and embeddings",
        "timm",
    ),
}
