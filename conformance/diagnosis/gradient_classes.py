"""The gradients' bug classes (``GRADIENT_CLASSES``): ``gradient(model, kind, name)`` -> the
gradient the class gives on a ``GradModel``, fitted at the first divergent cotangent or
parameter gradient in backward order (``fit.diagnose_gradient``)."""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache

import numpy as np

from conformance.diagnosis.bugclass import BugClass
from impls import numpy_vit

# ----------------------------------------------------------------------------- gradients
# ``gradient(model, kind, name)`` -> the gradient the class gives at a tensor on a case (``GradModel``): fitted at the first
# divergent cotangent or parameter gradient in backward order (``fit.diagnose_gradient``).


def _zero(model, kind, name):
    return np.zeros_like(model.reference[kind][name])


def _traced_variant(name: str, patch: Callable):
    """A copy of the oracle traced for autograd (``numpy_vit._traced``) with ``patch(module)``
    applied: a backward of another function, for a reference of the class."""

    @lru_cache(maxsize=1)
    def module():
        m = numpy_vit._traced(f"conformance.diagnosis._{name}")
        patch(m)
        return m

    return module


def _gelu_backward(slope: Callable):
    """The exact GELU forward with ``slope(x)`` as its derivative."""

    def patch(m):
        from autograd.extend import defvjp, primitive

        clean = m.ACTIVATIONS["gelu"]

        @primitive
        def gelu(x):
            return clean(x)

        defvjp(gelu, lambda ans, x: lambda g: g * slope(x))
        m.gelu, m.ACTIVATIONS["gelu"] = gelu, gelu

    return patch


def _phi_only(x):
    from scipy.special import erf

    return 0.5 * (1.0 + erf(x / np.sqrt(2.0)))


def _tanh_slope(x):
    c = np.sqrt(2.0 / np.pi)
    t = np.tanh(c * (x + 0.044715 * x**3))
    return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * c * (1.0 + 3 * 0.044715 * x * x)


def _detached_statistics(which: tuple[str, ...] | None):
    """LayerNorms whose mean and spread are constants to the backward: every one (None), or a
    block's ``which`` ("norm1", "norm2")."""

    def patch(m):
        from autograd.extend import defvjp, primitive

        @primitive
        def constant(a):
            return a

        defvjp(constant, lambda ans, a: lambda g: 0.0 * g)

        def layer_norm(x, weight, bias, eps):
            mean = constant(m.np.mean(x, -1, keepdims=True))
            sigma = constant(m.np.sqrt(m.np.mean((x - mean) ** 2, -1, keepdims=True) + eps))
            return (x - mean) / sigma * weight + bias

        if which is None:
            m.layer_norm = layer_norm
            return

        class Detached(m.LayerNorm):
            def __call__(self, x):
                return layer_norm(x, self.weight, self.bias, self.eps)

        init = m.Block.__init__

        def block_init(self, config, *args, **kwargs):
            init(self, config, *args, **kwargs)
            for n in which:
                norm = Detached(config.embed_dim, config.norm_eps)
                setattr(self, n, norm)

        m.Block.__init__ = block_init

    return patch


def _softmax_without_correction(m):
    from autograd.extend import defvjp, primitive

    clean = m.softmax

    @primitive
    def softmax(x, axis=-1):
        return clean(x, axis)

    defvjp(softmax, lambda P, x, axis=-1: lambda g: P * g)
    m.softmax = softmax


def _reference(module: Callable):
    """The gradient under the class: the float64 reference with ``module()``'s backward, on the
    case (``GradModel``), at the tensor being fitted."""

    def gradient(model, kind, name):
        cache = model.__dict__.setdefault("_class_references", {})
        if module not in cache:
            m = module()
            cache[module] = numpy_vit.make_grad(model.config, model.state, model_cls=m.VisionTransformer)(
                model.images, model.loss
            )
        return cache[module][kind][name]

    return gradient


# fmt: off
GRADIENT_CLASSES: tuple[BugClass, ...] = (
    BugClass("detached_branch", ("taps",), "a zero cotangent here: the branch is cut from the graph",
             "remove the .detach() / torch.no_grad() / mx.stop_gradient / jax.lax.stop_gradient on this branch",
             gradient=_zero),
    BugClass("frozen_parameter", ("params",), "a zero gradient for this parameter: it is frozen",
             "requires_grad=True (no .detach() or stop_gradient on it; nnx.Param, not a constant)", gradient=_zero),
    BugClass("gelu_backward_without_x_pdf", ("taps", "params"), "a GELU backward of Φ(x) alone (x φ(x) dropped)",
             "GELU's derivative is Φ(x) + x φ(x): use the framework's autograd, or keep both terms",
             gradient=_reference(_traced_variant("gelu_phi", _gelu_backward(_phi_only)))),
    BugClass("gelu_backward_of_tanh", ("taps", "params"), "an exact GELU whose backward is the tanh approximation's",
             "differentiate the function the forward computes (a fused kernel for one used for the other?)",
             gradient=_reference(_traced_variant("gelu_tanh_slope", _gelu_backward(_tanh_slope)))),
    BugClass("layernorm_backward_detached_statistics", ("taps", "params"),
             "every LayerNorm's backward with its mean and variance held constant (.detach())",
             "let the gradient flow through the mean and the variance", gradient=_reference(
                 _traced_variant("ln_detached", _detached_statistics(None)))),
    BugClass("norm1_backward_detached_statistics", ("taps", "params"),
             "norm1's backward with its mean and variance held constant (.detach())",
             "let the gradient flow through the mean and the variance", gradient=_reference(
                 _traced_variant("norm1_detached", _detached_statistics(("norm1",))))),
    BugClass("norm2_backward_detached_statistics", ("taps", "params"),
             "norm2's backward with its mean and variance held constant (.detach())",
             "let the gradient flow through the mean and the variance", gradient=_reference(
                 _traced_variant("norm2_detached", _detached_statistics(("norm2",))))),
    BugClass("softmax_backward_without_correction", ("taps", "params"), "a softmax backward P g, without - P sum(P g)",
             "the softmax's vector-Jacobian product is P (g - sum(P g))", gradient=_reference(
                 _traced_variant("softmax_pg", _softmax_without_correction))),
)
# fmt: on
