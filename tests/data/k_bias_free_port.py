"""transformers' ViTForImageClassification with k projections that have no bias, as BEiT's and
Whisper's attention have: q kᵀ + q b_kᵀ differs from q kᵀ by a per-query constant, which the
softmax removes, so the model computes the same function as timm's with any k bias. The convert
sends q's and v's thirds of qkv.bias and drops k's."""

from torch import nn

from conformance.capture import ModelPort
from conformance.examples.hf_vit import SUPPORTS, build, convert


def build_k_bias_free(config):
    model = build(config)
    for layer in model.vit.layers:
        layer.attention.k_proj = nn.Linear(config.embed_dim, config.embed_dim, bias=False)
    return model


def convert_k_bias_free(state):
    return {k: v for k, v in convert(state).items() if not k.endswith("k_proj.bias")}


port = ModelPort(build_k_bias_free, convert=convert_k_bias_free, output=lambda out: out.logits, supports=SUPPORTS)
