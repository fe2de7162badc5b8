"""timm's VisionTransformer, unmodified. The canonical names are timm's, so the rename is empty;
its stages are read by forward hooks and its fused attention's q, k, v by a TorchFunctionMode."""

from conformance.capture import ModelPort
from conformance.references import NotInTimm, timm_vit
from conformance.support import Unsupported
from impls.protocol import VIT_FAMILY


def build(config, fused_attn=True):
    """timm's model for ``config``; a config timm has no keyword for is one the port does not
    support (the family's options combine in ways no timm class takes: the plugin draws them)."""

    try:
        model = timm_vit(config)
    except NotInTimm as e:
        raise Unsupported(f"config not supported by timm: {e}") from None
    for block in model.blocks:
        block.attn.fused_attn = fused_attn
    return model


port = ModelPort(build, rename={}, supports=VIT_FAMILY)
# timm's explicit attention path: q·kᵀ, softmax and weights·v are seen, so nothing is unseen.
explicit = ModelPort(lambda config: build(config, fused_attn=False), rename={}, supports=VIT_FAMILY)
# Mixed precision as PyTorch users run it: float32 weights, the forward under
# torch.autocast(bfloat16 or float16) (verify --dtype bfloat16). Linear layers and the patch
# convolution then compute in bfloat16; LayerNorm and the residual stream stay in float32, and
# each stage is judged in the precision it was stored in.
autocast_port = ModelPort(build, rename={}, supports=VIT_FAMILY, autocast=True)
# The same with every LayerNorm's eps at 1e-5 (timm's ViTs use 1e-6): a float32 LayerNorm under
# autocast is judged at float32's rounding, so the eps is located at blocks.0.norm1.
autocast_eps_1e5_port = ModelPort(
    lambda config: build(config.replace(norm_eps=1e-5)), rename={}, supports=VIT_FAMILY, autocast=True
)
