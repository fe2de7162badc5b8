"""lucidrains' vit-pytorch ViT (pool 'cls' and 'mean') and SimpleViT, unmodified, as ModelPorts.

Both normalise the raw patches flattened by einops as (p1 p2 c), project them with a Linear and
normalise again (``patch_norm``, ``embed_norm``, ``patch_order='p1 p2 c'``); their Transformer
keeps each block as an ``nn.ModuleList([Attention, FeedForward])`` whose residuals the parent
adds, with an explicit ``nn.Softmax`` module, LayerNorm's default eps (1e-5) and q, k, v without
bias. ViT learns its position table (with 'mean' it has no class token and averages the patches
after the final norm); SimpleViT adds a fixed 2-D sin-cos table computed at the grid, its
attention output has no bias while its MLP keeps its biases, and it averages every token."""

from vit_pytorch import SimpleViT, ViT

from conformance.capture import ModelPort

BLOCKS = {
    "blocks.{i}.norm1": "transformer.layers.{i}.0.norm",
    "blocks.{i}.attn.qkv": "transformer.layers.{i}.0.to_qkv",
    "blocks.{i}.norm2": "transformer.layers.{i}.1.net.0",
    "blocks.{i}.mlp.fc1": "transformer.layers.{i}.1.net.1",
}
PATCHES = {
    "patch_embed.patch_norm": "to_patch_embedding.1",
    "patch_embed.proj": "to_patch_embedding.2",
    "patch_embed.norm": "to_patch_embedding.3",
}
VIT_RENAME = {
    **PATCHES,
    "cls_token": "cls_token",
    "pos_embed": "pos_embedding",
    **BLOCKS,
    "blocks.{i}.attn.proj": "transformer.layers.{i}.0.to_out.0",
    "blocks.{i}.mlp.fc2": "transformer.layers.{i}.1.net.4",
    "norm": "transformer.norm",  # not the blocks' norms the entries above wrote
    "head": "mlp_head",
}
SIMPLE_RENAME = {
    **PATCHES,
    **BLOCKS,
    "blocks.{i}.attn.proj": "transformer.layers.{i}.0.to_out",
    "blocks.{i}.mlp.fc2": "transformer.layers.{i}.1.net.3",
    "norm": "transformer.norm",
    "head": "linear_head",
}
# what the models compute, as options (the rest is the drawn or preset config's)
COMMON = {"patch_norm": True, "embed_norm": True, "qkv_bias": False, "norm_eps": 1e-5}
VIT_CLS = {**COMMON, "global_pool": "token"}
VIT_MEAN = {**COMMON, "global_pool": "avg", "class_token": False, "fc_norm": False}
SIMPLE = {**VIT_MEAN, "pos_embed": "sincos", "proj_bias": False, "mlp_bias": True}


def _sizes(c) -> dict:
    return dict(
        image_size=c.img_size,
        patch_size=c.patch_size,
        num_classes=c.num_classes,
        dim=c.embed_dim,
        depth=c.depth,
        heads=c.num_heads,
        mlp_dim=c.mlp_hidden_dim,
        channels=c.in_chans,
        dim_head=c.head_dim,
    )


def vit(c):
    return ViT(**_sizes(c), pool="cls" if c.class_token else "mean")


def simple_vit(c):
    return SimpleViT(**_sizes(c))


def _scaled_twice(build):
    def scaled(c):
        model = build(c)
        model.transformer.layers[0][0].scale = c.head_dim**-0.5 * 2  # the classic scale bug, in block 0
        return model

    return scaled


def _norm_shared(build):
    def shared(c):
        model = build(c)
        for attention, feed_forward in model.transformer.layers:
            feed_forward.net[0] = attention.norm  # one LayerNorm module for both branches
        return model

    return shared


def _ports(build, rename, supports):
    def port(b):
        return ModelPort(b, rename=rename, supports=supports, patch_order="p1 p2 c")

    return port(build), port(_scaled_twice(build)), port(_norm_shared(build))


vit_cls, vit_cls_scale_bug, vit_cls_shared_norm = _ports(vit, VIT_RENAME, VIT_CLS)
vit_mean, vit_mean_scale_bug, vit_mean_shared_norm = _ports(vit, VIT_RENAME, VIT_MEAN)
simple, simple_scale_bug, simple_shared_norm = _ports(simple_vit, SIMPLE_RENAME, SIMPLE)
