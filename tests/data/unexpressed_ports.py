"""timm's model built without parts the default config names (tests/test_capture.py): verify says
the config cannot express it (exit 2, one line per part), and the config that names the model's
parts makes it conformant."""

from conformance.capture import ModelPort
from conformance.examples.timm_vit import build
from impls import VIT_FAMILY

# q, k, v without bias, and no class token (the model pools the patch tokens' mean)
port = ModelPort(
    lambda config: build(config.replace(qkv_bias=False, class_token=False, global_pool="avg")),
    rename={},
    supports=VIT_FAMILY,
)

# timm's final_norm=False (InternViT, Pixtral): the last block's tokens pooled as they are
no_final_norm = ModelPort(lambda config: build(config.replace(final_norm=False)), rename={}, supports=VIT_FAMILY)

# timm's model pooling the patch tokens' mean after its final norm on every token (fc_norm=False: an
# Idefics3 or SigLIP tower's post_layernorm), where global_pool='avg' puts the norm after the pooling
norm_before_pooling = ModelPort(
    lambda config: build(config.replace(fc_norm=False)), rename={}, supports={**VIT_FAMILY, "fc_norm": (None, False)}
)

# timm's Eva with q, k and v projected apart (EVA02-B's, transformers' SigLIP's q_proj, k_proj, v_proj)
qkv_apart = ModelPort(lambda config: build(config.replace(qkv_fused=False)), rename={}, supports=VIT_FAMILY)

# timm's model with RMSNorm for its norms (AIMv2's): no mean subtracted, no bias
rms_norm = ModelPort(lambda config: build(config.replace(norm_layer="rmsnorm")), rename={}, supports=VIT_FAMILY)


def _without_patch_bias(model):
    model.patch_embed.proj.bias = None  # a bias-free patch convolution and no norm after it (Qwen2-VL)
    return model


no_patch_bias = ModelPort(
    lambda config: _without_patch_bias(build(config.replace(patch_bias=None))), rename={}, supports=VIT_FAMILY
)
