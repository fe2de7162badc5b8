"""Quantized ports as they are shipped (docs/quantization.md): the float model built, loaded with
the canonical weights, then quantized by its framework's own step (``ModelPort(quantize=)``).

    python -m conformance verify conformance.examples.quantized:mlx_image_4bit --preset vit_test_quantized

mlx_image_4bit      mlx-image's ViT after mlx.nn.quantize, 4 bits in groups of 64 (MLX's default)
mlx_image_8bit      the same, 8 bits in groups of 32
timm_int8           timm's VisionTransformer after torch.ao's quantize_dynamic (int8 weights per tensor,
                    inputs quantized at run time to 7 bits)
timm_torchao_int8   timm's VisionTransformer after torchao's quantize_(model, Int8WeightOnlyConfig())
                    (int8 weights per row, float inputs)
"""

from conformance.capture import ModelPort
from conformance.examples import mlx_image_vit, timm_vit
from conformance.support import multiple_of


def mlx_image(bits: int, group_size: int, mode: str = "affine") -> ModelPort:
    """mlx-image's ViT after ``nn.quantize(model, group_size, bits, mode=mode)``: its Linears' input
    widths (embed_dim, and the MLP's, a whole multiple of it) in whole groups."""

    def quantize(model):
        import mlx.nn as nn

        nn.quantize(model, group_size=group_size, bits=bits, mode=mode)

    supports = {**mlx_image_vit.SUPPORTS, "embed_dim": multiple_of(group_size)}  # every Linear's input width
    return ModelPort(
        mlx_image_vit.build, convert=mlx_image_vit.convert, images="NHWC", supports=supports, quantize=quantize
    )


def quantize_dynamic(model):
    """torch.ao's dynamic int8 quantization of every Linear, as its tutorial does."""
    import torch

    return torch.ao.quantization.quantize_dynamic(model, {torch.nn.Linear}, dtype=torch.qint8)


def int8_weight_only(model):
    """torchao's int8 weight-only quantization of every Linear, in place."""
    from torchao.quantization import Int8WeightOnlyConfig, quantize_

    quantize_(model, Int8WeightOnlyConfig())


mlx_image_4bit = mlx_image(4, 64)
mlx_image_8bit = mlx_image(8, 32)
timm_int8 = ModelPort(timm_vit.build, rename={}, supports=timm_vit.VIT_FAMILY, quantize=quantize_dynamic)
timm_torchao_int8 = ModelPort(timm_vit.build, rename={}, supports=timm_vit.VIT_FAMILY, quantize=int8_weight_only)
