"""timm's ViT with its Linears replaced by a hand-written weight-only int8 Linear (codes and a
float scale per row, dequantized in forward), as a user writes one without a quantization library:
in the quantize step (``quantize_step``) and already in build (``quantized_in_build``). The reader
knows neither the class nor its format: exit 2 naming the modules (tests/test_quantized.py)."""

import torch

from conformance.capture import ModelPort
from conformance.examples import timm_vit


class Int8Linear(torch.nn.Module):
    """A Linear's weight as int8 codes per row, scaled by the row's max / 127; bias kept in float."""

    def __init__(self, linear: torch.nn.Linear):
        super().__init__()
        w = linear.weight.detach()
        scale = w.abs().amax(1, keepdim=True).clamp_min(1e-12) / 127
        self.register_buffer("weight", torch.round(w / scale).to(torch.int8))
        self.register_buffer("scale", scale)
        self.bias = linear.bias

    def forward(self, x):
        return torch.nn.functional.linear(x, self.weight.to(x.dtype) * self.scale.to(x.dtype), self.bias)


def int8_linears(model):
    """Every nn.Linear of the model replaced by Int8Linear, in place."""
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, torch.nn.Linear):
                setattr(parent, name, Int8Linear(child))


def _built_quantized(config):
    model = timm_vit.build(config)
    int8_linears(model)
    return model


quantize_step = ModelPort(timm_vit.build, rename={}, supports=timm_vit.VIT_FAMILY, quantize=int8_linears)
quantized_in_build = ModelPort(_built_quantized, rename={}, supports=timm_vit.VIT_FAMILY)
