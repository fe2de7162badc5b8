"""torchvision's VisionTransformer, unmodified: ``nn.MultiheadAttention`` with a fused
``in_proj_weight``, ``out_proj`` used by the module directly, and (in eval, with an even number
of heads) torch's native fused MHA kernel, ``torch._native_multi_head_attention``.

The rename is the table torchvision users write (13 entries). Capture runs the model on its own
path with hooks only, so the native kernel is the one judged; q, k and v are read in a second
pass under a TorchFunctionMode (which leaves the fast path for ``F.scaled_dot_product_attention``),
and both passes are judged. The attention weights stay unseen: inside the native kernel on the
model's path and inside the fused SDPA off it (torchvision calls MHA with ``need_weights=False``).
With an odd number of heads (ViT-Ti's 3) torch itself never takes the fast path.
"""

from conformance.capture import ModelPort

RENAME = {
    "cls_token": "class_token",
    "pos_embed": "encoder.pos_embedding",
    "patch_embed.proj": "conv_proj",
    "blocks.{i}": "encoder.layers.encoder_layer_{i}",
    "norm1": "ln_1",
    "norm2": "ln_2",
    "attn.qkv.weight": "self_attention.in_proj_weight",
    "attn.qkv.bias": "self_attention.in_proj_bias",
    "attn.proj": "self_attention.out_proj",
    "mlp.fc1": "mlp.0",
    "mlp.fc2": "mlp.3",
    "norm": "encoder.ln",
    "head": "heads.head",
}
# torchvision's ViT: class-token pooling, biases everywhere, square images and patches, GELU, eps 1e-6.
SUPPORTS = {
    "global_pool": "token",
    "in_chans": 3,  # conv_proj is built for RGB whatever the weights
    "qkv_bias": True,
    "norm_eps": 1e-6,
    "square_images": True,
    "square_patches": True,
    "num_classes": lambda n: n > 0,
}


def encoder_sizes(config) -> dict:
    """torchvision's names for the encoder's sizes (mlx-image's and keras-hub's ViTs take them too)."""
    return dict(
        num_layers=config.depth, num_heads=config.num_heads, hidden_dim=config.embed_dim, mlp_dim=config.mlp_hidden_dim
    )


def build(config):
    from torchvision.models.vision_transformer import VisionTransformer

    return VisionTransformer(
        image_size=config.img_size[0],
        patch_size=config.patch_size[0],
        num_classes=config.num_classes,
        **encoder_sizes(config),
    ).eval()


def build_shared_norm(config):
    """The same model with every block calling ``ln_1`` where it means ``ln_2`` (a copy-paste
    bug): ``ln_2``'s weights take no part in the forward, located at ``blocks.0.norm2``."""
    import types

    model = build(config)

    def forward(block, input):
        x = (
            block.dropout(
                block.self_attention(block.ln_1(input), block.ln_1(input), block.ln_1(input), need_weights=False)[0]
            )
            + input
        )
        return x + block.mlp(block.ln_1(x))

    for layer in model.encoder.layers:
        layer.forward = types.MethodType(forward, layer)
    return model


port = ModelPort(build, rename=RENAME, supports=SUPPORTS)
shared_norm_port = ModelPort(build_shared_norm, rename=RENAME, supports=SUPPORTS)
