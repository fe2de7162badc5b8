"""Optimizer mutants: one AdamW step with another library's defaults or another algorithm, each
the port's ``adamw_step`` with its optimizer swapped; and ``forward_factory``, a gradient
factory's forward. The backward mutants (gradient factories whose forward is bitwise the correct
port's and whose gradients are wrong) are in each framework's module of mutants, so that a port's
process imports only its framework; the zoo's catalogue lists them with where they are located."""

from __future__ import annotations

import sys
from functools import partial

from impls import mlx_vit as M  # first: it loads OpenBLAS before mlx.core
from impls import jax_vit as J  # noqa: I001
from impls import torch_vit as T

import torch  # noqa: E402


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
