"""Bug classes: what real ports compute instead, each as the oracle computes it from a stage's inputs.

A class is a named variant of one operation, computed in float64 (or, for a precision bug, in the
dtype it rounds in) from the same inputs the oracle's stage reads: a stage of the port is then
compared with both, and the class is named only when the port's error is the variant's difference
(``conformance.diagnosis.fit``). It is one of:

| form | what changes | e.g. |
|---|---|---|
| ``config`` | options the oracle runs with (``ViTConfig`` fields) | ``norm_eps=1e-5``, ``act_layer="gelu_tanh"`` |
| ``state`` | weights it reads: a function of the canonical state returning replaced keys | LayerScale's gamma at 1, qkv rows re-read |
| ``stage`` | the stage computed another way: ``stage(name, t, images, s, config)``, its value or None where it does not apply (``stage.bounded``: it takes ``precision`` and returns (value, bound)) | softmax over queries, heads merged (d, h) |
| ``family`` | a family the fit searches (``fit.FAMILIES``): ``"token_statistics"``, ``"eps"`` | Flax's fast variance, an eps of the port's own |
| ``attention`` | a standalone attention's weights, ``attention(q, k, mask, options)`` (``ATTENTION_CLASSES``) | the mask ignored |
| ``gradient`` | a gradient under the class, ``gradient(model, kind, name)`` on a ``GradModel`` (``GRADIENT_CLASSES``) | a detached branch, a GELU backward of Φ alone |

``kinds`` are the stage kinds where the class shows first (where a fit looks for it); ``when``
the configs it can exist in (``torch_scale_by_embed_dim`` needs more than one head to differ).
``says`` reads after "the port computes", ``hint`` what the reference does. The table of every
class is docs/diagnosis.md (generated).

This module is the registry: the whole model's classes are in ``model_classes``, a standalone
attention's in ``attention_classes``, the gradients' in ``gradient_classes``, the class itself
in ``bugclass``.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from conformance.diagnosis.attention_classes import ATTENTION_CLASSES
from conformance.diagnosis.bugclass import QUIET, BugClass
from conformance.diagnosis.gradient_classes import GRADIENT_CLASSES
from conformance.diagnosis.model_classes import CLASSES, NORM_KINDS  # noqa: F401 - the registry's
from conformance.numerics.error_model import Precision, evaluate
from impls.protocol import ViTConfig

# Named from what verify sees, not fitted: its determinism re-run.
ACTIVE_DROPOUT = "active_dropout"
PADDING_ATTENDED = "padding_attended"
OBSERVED: tuple[BugClass, ...] = (
    BugClass(
        PADDING_ATTENDED,
        (),
        "attention over a packed batch's padding: the weights over an image's own tokens sum to less than 1",
        "keep the padding out of every attention (and pool): an additive -inf mask from timm's patch_valid or "
        "transformers' pixel_attention_mask, for keys and for the pool's queries alike",
    ),
    # a quantized port's stored weights (conformance.capture.quantized.QuantizedWeight.explain)
    BugClass(
        "quant_bits_order_reversed",
        (),
        "its packed weights with each word's codes in reverse order (most significant first)",
        "pack codes least significant first, as mx.quantize does (GPTQ's and AWQ's orders differ: unpack "
        "them with their own order before packing for MLX)",
    ),
    BugClass(
        "quant_group_scales_shifted",
        (),
        "each group's weights with the scale and bias of its neighbouring group",
        "index scales and biases by group, w[i] with scales[i // group_size]",
    ),
    BugClass(
        "quant_zero_point_dropped",
        (),
        "each quantization group off by one constant: its zero point (bias) dropped",
        "keep each group's bias (affine: w = scale * code + bias; a zero point z: scale * (code - z))",
    ),
    BugClass(
        ACTIVE_DROPOUT,
        (),
        "a random result: two calls on the same input differ (dropout left active?)",
        "put the model in eval mode: model.eval(); nnx.Dropout(deterministic=True); dropout_p=0.0 in "
        "F.scaled_dot_product_attention, which ignores eval()",
    ),
)

BY_NAME: dict[str, BugClass] = {c.name: c for c in CLASSES + ATTENTION_CLASSES + GRADIENT_CLASSES + OBSERVED}


def classes_for(kind: str, config: ViTConfig) -> list[BugClass]:
    return [c for c in CLASSES if kind in c.kinds and c.applies(config)]


def variant_state(bug: BugClass, s: Mapping, config: ViTConfig) -> Mapping:
    if bug.state is None:
        return s
    return {**s, **bug.state(s, config)}


def variant_config(bug: BugClass, config: ViTConfig) -> ViTConfig:
    return config.replace(**bug.config) if bug.config else config


def evaluate_variant(bug: BugClass, name: str, t, images, s, config: ViTConfig, precision: Precision = QUIET):
    """(value, unit bound or None) of stage ``name`` computed by ``bug`` from inputs ``t``: a
    ``stage`` variant's bound is not known (None), a ``config`` or ``state`` variant's is the error
    model's in ``precision``."""
    s, config = variant_state(bug, s, config), variant_config(bug, config)
    if bug.stage is not None:
        if getattr(bug.stage, "bounded", False):
            found = bug.stage(name, t, images, s, config, precision)
            if found is not None:
                return np.asarray(found[0], np.float64), found[1]
        else:
            value = bug.stage(name, t, images, s, config)
            if value is not None:
                return np.asarray(value, np.float64), None
    value, bound = evaluate(name, t, images, s, config, precision)
    return np.asarray(value, np.float64), (bound if precision.bounds else None)
