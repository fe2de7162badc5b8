"""open_clip's VisionTransformer (the CLIP image tower), unmodified: ``ln_pre``, resblocks on
``nn.MultiheadAttention`` (fused ``in_proj_weight``, ``out_proj`` used by the module directly, the
native fast path in eval with an even number of heads), and its two poolings.

* ``pooled_norm_port``: ``final_ln_after_pool=True``, so ``ln_post`` normalises the pooled class
  token alone, a (B, D) where timm's ``norm`` is (B, N, D). The same computation as timm's
  norm-then-pool for class-token pooling, so ``norm`` is compared on the class token.
* ``port``: open_clip's default (``ln_post`` on every token, then the class token).
* ``avg_pool_norm_port``: average pooling with ``final_ln_after_pool=True`` against a config that
  norms every token and then averages (``global_pool="avg", fc_norm=False``): normalising the mean
  is another computation, located at ``norm``. (With ``fc_norm`` it is timm's ``fc_norm``.)

The towers are headless (``num_classes=0``: open_clip's output projection ``proj`` is dropped), so
the model's output is judged as the ``pooled`` stage. Configs are CLIP's: ``pre_norm``, eps 1e-5,
no patch-embedding bias, QuickGELU (OpenAI's weights) or GELU.
"""

from conformance.capture import ModelPort

RENAME = {
    "cls_token": "class_embedding",
    "pos_embed": "positional_embedding",
    "patch_embed.proj": "conv1",
    "norm_pre": "ln_pre",
    "blocks": "transformer.resblocks",
    "norm1": "ln_1",
    "norm2": "ln_2",
    "attn.qkv.weight": "attn.in_proj_weight",
    "attn.qkv.bias": "attn.in_proj_bias",
    "attn.proj": "attn.out_proj",
    "mlp.fc1": "mlp.c_fc",
    "mlp.fc2": "mlp.c_proj",
    "norm": "ln_post",
}
SUPPORTS = {
    "pre_norm": True,
    "in_chans": 3,  # conv1 is built for RGB whatever the weights
    "norm_eps": 1e-5,
    "num_classes": 0,
    "global_pool": "token",
    "qkv_bias": True,
    "act_layer": ("quick_gelu", "gelu"),
    "square_images": True,
    "square_patches": True,
}


def build(config, pool_type="tok", final_ln_after_pool=False):
    import torch.nn as nn
    from open_clip.transformer import QuickGELU, VisionTransformer

    model = VisionTransformer(
        image_size=config.img_size[0],
        patch_size=config.patch_size[0],
        width=config.embed_dim,
        layers=config.depth,
        heads=config.num_heads,
        mlp_ratio=config.mlp_ratio,
        output_dim=config.embed_dim,
        pool_type=pool_type,
        final_ln_after_pool=final_ln_after_pool,
        act_layer=QuickGELU if config.act_layer == "quick_gelu" else nn.GELU,
    )
    model.proj = None  # headless: the pooled features are the output
    return model.eval()


port = ModelPort(build, rename=RENAME, supports=SUPPORTS)
pooled_norm_port = ModelPort(lambda config: build(config, final_ln_after_pool=True), rename=RENAME, supports=SUPPORTS)
avg_pool_norm_port = ModelPort(
    lambda config: build(config, pool_type="avg", final_ln_after_pool=True),
    rename=RENAME,
    supports={**SUPPORTS, "global_pool": "avg", "fc_norm": False, "class_token": True},
)
