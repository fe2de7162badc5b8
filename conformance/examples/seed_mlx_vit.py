"""The MLX ViT of the Korean blog post (shared/seeds), as published: its MLP carries an extra
LayerNorm between GELU and fc2 (so the checkpoint leaves that norm unfilled and the port
diverges at ``mlp.act``), its qkv has no bias and its LayerNorms keep MLX's eps 1e-5. The post
also describes a bug it fixed: a block that used ``norm1`` before both MHSA and MLP;
``shared_norm_port`` is the model with that bug, located at ``blocks.0.norm2``. Comments are
translated; the code is the post's."""

import mlx.core as mx
import mlx.nn as nn
from einops import rearrange

from conformance.capture import ModelPort


class PatchEmbedding(nn.Module):
    def __init__(self, is_rgb=True, patch_size=16, embed_dim=768):
        super().__init__()
        self.patch_size = patch_size
        self.embed_dim = embed_dim
        self.in_channels = 3 if is_rgb else 1
        self.proj = nn.Conv2d(
                in_channels=self.in_channels,
                out_channels=embed_dim,
                kernel_size=patch_size,
                stride=patch_size
            )

    def __call__(self, x):
        x = self.proj(x).flatten(1, 2)  # merge H/patch_size and W/patch_size into one axis
        return x


class MHSA(nn.Module):
    def __init__(self, embed_dim=768, num_heads=12):
        super().__init__()
        self.embed_dim = embed_dim
        self.num_heads = num_heads

        assert embed_dim % num_heads == 0, "embed_dim % num_heads != 0 !!!!"

        self.head_dim = embed_dim // num_heads
        self.scale = self.head_dim ** -0.5

        self.qkv = nn.Linear(embed_dim, embed_dim * 3, bias=False)

        self.proj = nn.Linear(embed_dim, embed_dim)

    def __call__(self, x):
        # BND -> BN(3*D)
        x = self.qkv(x)
        # chunk into Q, K, V -> [BND, BND, BND]
        qkv = mx.split(x, axis=2, indices_or_sections=3)
        # 1. reshape each of Q, K, V to BHND (convention)
        q, k, v = map(lambda t: rearrange(t, 'b n (h d) -> b h n d', h=self.num_heads), qkv)
        # 2. Mat. Mul. -> BHN(Q)N(K)
        attn = q @ k.transpose(0, 1, 3, 2)
        # 3. Scale: sqrt(dk)
        attn_score = attn * self.scale
        # 4. attn_w: axis=-1 for a softmax over K
        attn_weight = mx.softmax(attn_score, axis=-1)
        # 5. Mat. Mul. -> BHND
        out = attn_weight @ v
        # 6. concat the heads
        out = rearrange(out, 'b h n d -> b n (h d)', h = self.num_heads)  # MHSA concat
        # 7. project to the same width after the concat, to mix the heads
        out = self.proj(out)
        return out, attn_weight  # the output and attn_weight together


class MLP(nn.Module):
    def __init__(self, embed_dim=768, mlp_ratio=4, dropout_rate=0.1):
        super().__init__()
        # after timm's Mlp
        self.net = nn.Sequential(
                nn.Linear(embed_dim, embed_dim * mlp_ratio),
                nn.GELU(),
                nn.Dropout(dropout_rate),
                nn.LayerNorm(embed_dim * mlp_ratio),
                nn.Linear(embed_dim * mlp_ratio, embed_dim ),
                nn.Dropout(dropout_rate),
            )

    def __call__(self, x):
        return self.net(x)


class Block(nn.Module):
    def __init__(self, embed_dim=768, num_heads=12, mlp_ratio=4, dropout_rate=0.1):
        super().__init__()
        self.norm1 = nn.LayerNorm(dims=embed_dim)  # norm1 of its own
        self.norm2 = nn.LayerNorm(dims=embed_dim)  # norm1 of its own
        self.mhsa = MHSA(embed_dim=embed_dim, num_heads=num_heads)
        self.mlp = MLP(embed_dim=embed_dim, mlp_ratio=mlp_ratio, dropout_rate=dropout_rate)

    def __call__(self, x):
        # step 1 - attention
        x_norm = self.norm1(x)  # Layer normalization 1
        x_attn, _ = self.mhsa(x_norm)  # MHSA
        x = x_attn + x  # Residual connection

        # step 2 - MLP
        x_norm = self.norm2(x)  # Layer normalization 2
        x_mlp = self.mlp(x_norm)  # MLP, for more non-linearity
        x = x_mlp + x

        return x


class ViT(nn.Module):
    """
        cls token based ViT
    """
    def __init__(self, img_size=224, patch_size=16, embed_dim=768, num_heads=12, mlp_ratio=4, dropout_rate=0.1, depth=12, num_classes=1000):
        super().__init__()
        self.patch_size = patch_size
        self.embed_dim = embed_dim
        self.num_heads = num_heads
        self.mlp_ratio = mlp_ratio
        self.dropout_rate = dropout_rate
        self.depth = depth
        self.num_patches = int((img_size // patch_size) ** 2)

        self.norm = nn.LayerNorm(dims=embed_dim)  # final norm

        self.pos_embed = mx.random.normal((1, self.num_patches + 1, embed_dim), scale=0.02)  # learned position embedding
        self.cls_token = mx.random.normal((1, 1, embed_dim), scale=0.02)  # learned cls token

        self.patch_embed = PatchEmbedding(
            patch_size=patch_size,
            embed_dim=embed_dim
            )

        self.blocks = [
            Block(
                embed_dim=embed_dim,
                num_heads=num_heads,
                mlp_ratio=mlp_ratio,
                dropout_rate=dropout_rate
                )  for _ in range(depth)
            ]

        self.head = nn.Linear(embed_dim, num_classes)

    def __call__(self, x):
        x = self.patch_embed(x)
        x = self._pos_embed(x)
        for i, block in enumerate(self.blocks):
            x = block(x)
        x = self.norm(x)
        cls = x[:, 0]  # the CLS token only
        return self.head(cls)

    def _pos_embed(self, x):
        B, N, C = x.shape
        # broadcast_to copies the cls token B times
        cls = mx.broadcast_to(self.cls_token, (B, 1, C))
        x = mx.concatenate((cls, x), axis=1)  # [cls] first along N, axis=1 gives N+1 (BNC)
        x += self.pos_embed  # add the position information position-wise
        return x


class SharedNormBlock(Block):
    """The bug the post's closing notes describe: the same norm before MHSA and before MLP."""

    def __call__(self, x):
        x_norm = self.norm1(x)
        x_attn, _ = self.mhsa(x_norm)
        x = x_attn + x
        x_norm = self.norm1(x)  # the bug: norm1 again
        x_mlp = self.mlp(x_norm)
        return x_mlp + x


def build(config, block=Block):
    model = ViT(img_size=config.img_size[0], patch_size=config.patch_size[0], embed_dim=config.embed_dim,
                num_heads=config.num_heads, mlp_ratio=int(config.mlp_ratio), depth=config.depth,
                num_classes=config.num_classes)
    if block is not Block:
        model.blocks = [block(config.embed_dim, config.num_heads, int(config.mlp_ratio)) for _ in model.blocks]
    return model


RENAME = {"attn.qkv": "mhsa.qkv", "attn.proj": "mhsa.proj", "mlp.fc1": "mlp.net.layers.0",
          "mlp.fc2": "mlp.net.layers.4"}
# What the post's model can be: square 3-channel images, class-token pooling, no qkv bias, MLX's
# LayerNorm eps and an integer mlp_ratio.
SUPPORTS = {"global_pool": "token", "in_chans": 3, "qkv_bias": False, "norm_eps": 1e-5, "square_images": True,
            "square_patches": True, "mlp_ratio": (1.0, 2.0, 4.0)}
port = ModelPort(build, rename=RENAME, images="NHWC", supports=SUPPORTS)
shared_norm_port = ModelPort(lambda config: build(config, SharedNormBlock), rename=RENAME, images="NHWC",
                             supports=SUPPORTS)
