"""timm's VisionTransformer, unmodified. The canonical names are timm's, so the rename is empty;
its stages are read by forward hooks and its fused attention's q, k, v by a TorchFunctionMode."""

from conformance.capture import ModelPort
from impls.config import VIT_FAMILY


def build(config, fused_attn=True):
    from conformance.references import timm_vit

    model = timm_vit(config)
    for block in model.blocks:
        block.attn.fused_attn = fused_attn
    return model


port = ModelPort(build, rename={}, supports=VIT_FAMILY)
# timm's explicit attention path: q·kᵀ, softmax and weights·v are seen, so nothing is unseen.
explicit = ModelPort(lambda config: build(config, fused_attn=False), rename={}, supports=VIT_FAMILY)
