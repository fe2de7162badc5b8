"""MLX mutants of a quantized port (issue 44): mlx-image's ViT (conformance.examples) after
``nn.quantize``, its quantize step with one thing changed, as a converter from another
checkpoint's packing writes it (GPTQ and AWQ order their codes otherwise; a group index off by
one; a symmetric format's reader dropping the zero point). MLX's kernels then compute correctly
on wrong weights: verify's weight check locates each at the first stage that reads them and
names it from the packed tensors (``conformance.capture.quantized.QuantizedWeight.explain``)."""

from __future__ import annotations

import numpy as np

from dataclasses import replace

from conformance.capture import ModelPort
from conformance.capture.quantized import pack, unpack
from conformance.examples.quantized import mlx_image


def _port(bits: int, group_size: int, change) -> ModelPort:
    """conformance.examples.quantized's mlx-image port with ``change`` applied to each quantized Linear."""

    def quantize(model):
        import mlx.nn as nn

        nn.quantize(model, group_size=group_size, bits=bits)
        for _, m in model.named_modules():
            if isinstance(m, nn.QuantizedLinear):
                change(m, bits)

    return replace(mlx_image(bits, group_size), quantize=quantize)


def _reversed(m, bits):
    import mlx.core as mx

    words = np.array(m.weight)
    codes = unpack(words, bits, words.shape[-1] * 32 // bits)
    per = 32 // bits  # each word's codes, most significant first
    m.weight = mx.array(pack(codes.reshape(*codes.shape[:-1], -1, per)[..., ::-1].reshape(codes.shape), bits))


def _shifted(m, bits):
    import mlx.core as mx

    m.scales, m.biases = mx.roll(m.scales, -1, axis=-1), mx.roll(m.biases, -1, axis=-1)


def _dropped(m, bits):
    import mlx.core as mx

    m.biases = mx.zeros_like(m.biases)


bits_order_reversed = _port(4, 64, _reversed)
group_scales_shifted = _port(8, 32, _shifted)
zero_point_dropped = _port(8, 32, _dropped)
