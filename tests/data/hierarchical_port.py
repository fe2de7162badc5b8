"""A hierarchical tower as Hiera, Swin and MViT are: its width doubles between stages (timm's Block at
24 features, a projection, then at 48), its weights named as timm's ViT's. The config has one width:
verify cannot judge it (exit 2), never NOT CONFORMANT at load."""

from conformance.capture import ModelPort


def build(config):
    import torch
    import torch.nn as nn
    from timm.models.vision_transformer import Block

    D = config.embed_dim

    class Hierarchical(nn.Module):
        def __init__(self):
            super().__init__()
            self.patch_embed = nn.Module()
            self.patch_embed.proj = nn.Conv2d(config.in_chans, D, config.patch_size, config.patch_size)
            self.cls_token = nn.Parameter(torch.zeros(1, 1, D))
            self.pos_embed = nn.Parameter(torch.zeros(1, config.num_tokens, D))
            self.blocks = nn.ModuleList(Block(D * 2**i, config.num_heads, qkv_bias=True) for i in range(config.depth))
            self.downsample = nn.ModuleList(nn.Linear(D * 2**i, D * 2 ** (i + 1)) for i in range(config.depth - 1))
            self.norm = nn.LayerNorm(D * 2 ** (config.depth - 1), eps=1e-6)
            self.head = nn.Linear(D * 2 ** (config.depth - 1), config.num_classes)

        def forward(self, x):
            x = self.patch_embed.proj(x).flatten(2).transpose(1, 2)
            x = torch.cat([self.cls_token.expand(len(x), -1, -1), x], 1) + self.pos_embed
            for i, block in enumerate(self.blocks):
                x = block(x)
                if i < len(self.downsample):
                    x = self.downsample[i](x)
            return self.head(self.norm(x).mean(1))

    return Hierarchical().eval()


port = ModelPort(build, rename={})
