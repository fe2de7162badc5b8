"""Towers whose positions are not one learned table added once, unmodified, as a user gives them
to verify: timm's Eva (rotary embeddings: its rope ViTs, DINOv3, EVA02) and Beit (a relative
position bias), transformers' DINOv3ViTModel and BeitModel. Each is built at the config's width
and depth; the renames are the ones their LayerScale naming needs (``gamma_1``), no more."""

from dataclasses import replace

from conformance.capture import ModelPort
from tests.data import x_transformers_port
from weights.hf.common import sizes_to_hf

SQUARE = {"square_images": True, "square_patches": True}
GAMMAS = {"blocks.{i}.ls1.gamma": "blocks.{i}.gamma_1", "blocks.{i}.ls2.gamma": "blocks.{i}.gamma_2"}


def _timm(name, **kw):
    def build(config):
        import timm

        return timm.create_model(
            name,
            pretrained=False,
            img_size=config.img_size[0],
            patch_size=config.patch_size[0],
            num_classes=config.num_classes,
            depth=config.depth,
            embed_dim=config.embed_dim,
            num_heads=config.num_heads,
            **kw,
        ).eval()

    return build


# timm's axial rope ViT: every canonical key has its place (no position table, LayerScale as
# gamma_1): only the rotation is left for the config to name
ROPE_OPTIONS = {**SQUARE, "pos_embed": "none", "init_values": 1e-5}
rope_vit = ModelPort(_timm("vit_base_patch16_rope_224"), rename=GAMMAS, supports=ROPE_OPTIONS)
# the same, declared with its rotation (timm's vit_base_patch16_rope_224: the axial 'cat' kind, x first)
ROPE_ON = {"rope_type": "cat", "rope_grid_indexing": "xy", "rope_temperature": 100.0}
rope_vit_declared = ModelPort(_timm("vit_base_patch16_rope_224"), rename=GAMMAS, supports={**ROPE_OPTIONS, **ROPE_ON})
# the same model built without its rotation (Eva's use_rot_pos_emb=False): a plain ViT
rope_vit_without_rope = ModelPort(
    _timm("vit_base_patch16_rope_224", use_rot_pos_emb=False), rename=GAMMAS, supports=ROPE_OPTIONS
)
rope_mixed_vit = ModelPort(_timm("vit_base_patch16_rope_mixed_224"), rename=GAMMAS, supports=ROPE_OPTIONS)
# the same declared: RoPE-Mixed's learned frequencies (rope.freqs, by name), x first
rope_mixed_declared = ModelPort(
    _timm("vit_base_patch16_rope_mixed_224"),
    rename=GAMMAS,
    supports={**ROPE_OPTIONS, "rope_type": "mixed", "rope_grid_indexing": "xy"},
)
dinov3 = ModelPort(_timm("vit_small_patch16_dinov3"), rename={}, supports=SQUARE)
beit = ModelPort(_timm("beit_base_patch16_224"), rename={}, supports=SQUARE)
# the same declared: its relative position bias, q's and v's biases, LayerScale, the patches' mean
BEIT_ON = {"rel_pos_bias": True, "pos_embed": "none", "k_bias": False, "init_values": 0.1, "global_pool": "avg"}
beit_declared = ModelPort(_timm("beit_base_patch16_224"), rename=GAMMAS, supports={**SQUARE, **BEIT_ON})


def _hf_dinov3(config):
    from transformers import DINOv3ViTConfig, DINOv3ViTModel

    return DINOv3ViTModel(DINOv3ViTConfig(**sizes_to_hf(config), num_register_tokens=2)).eval()


def _hf_beit(config):
    from transformers import BeitConfig, BeitModel

    settings = dict(use_relative_position_bias=True, use_absolute_position_embeddings=False)
    return BeitModel(BeitConfig(**sizes_to_hf(config), **settings)).eval()


hf_dinov3 = ModelPort(_hf_dinov3, rename={}, output=lambda out: out.pooler_output, supports=SQUARE)
hf_beit = ModelPort(_hf_beit, rename={}, output=lambda out: out.pooler_output, supports=SQUARE)


# x-transformers' ViT with its Encoder's rotary embedding on: the options that express the rest
# of it (tests/data/x_transformers_port.py), the rotation left for the config to name
def _x_rotary(config):
    from tests.data.x_transformers_port import build

    return build(config, rotary_pos_emb=True)


x_transformers_rotary = replace(x_transformers_port.port, build=_x_rotary)


def _mlx_rope(config, rotate=True):
    """An MLX ViT as MLX vision towers write their attention: mlx.nn.RoPE on q and k per head
    (``rotate=False``: the same model without it). The rest is impls.mlx_vit's, names and all."""
    import mlx.core as mx
    import mlx.nn as nn

    from impls import mlx_vit

    class RopeAttention(mlx_vit.Attention):
        def __init__(self, *args, **kw):
            super().__init__(*args, **kw)
            self.rope = nn.RoPE(self.head_dim) if rotate else None

        def __call__(self, x, taps=None, name="attn"):
            B, N, _ = x.shape
            qkv = self.qkv(x).reshape(B, N, 3, self.num_heads, self.head_dim).transpose(2, 0, 3, 1, 4)
            q, k, v = qkv[0], qkv[1], qkv[2]
            if self.rope is not None:
                q, k = self.rope(q), self.rope(k)
            weights = mx.softmax((q * self.scale) @ k.swapaxes(-2, -1), axis=-1, precise=True)
            return self.proj(mlx_vit.merge_heads(weights @ v))

    return mlx_vit.VisionTransformer(config, attn_layer=RopeAttention)


mlx_rope_vit = ModelPort(_mlx_rope, rename={})
mlx_vit_without_rope = ModelPort(lambda config: _mlx_rope(config, rotate=False), rename={})


# timm's EVA02 (its Eva block: q's and v's biases without k's, SwiGLU; the base one with q, k and v
# projected apart and a norm in its SwiGLU), declared with the options that say its block
EVA02_TINY = dict(
    global_pool="avg",
    k_bias=False,
    mlp_layer="swiglu_packed",
    act_layer="silu",
    rope_type="cat",
    ref_feat_shape=(16, 16),
)
EVA02_BASE = dict(EVA02_TINY, qkv_fused=False, mlp_layer="swiglu", scale_mlp=True)
eva02_tiny = ModelPort(_timm("eva02_tiny_patch14_224"), rename={}, supports={**SQUARE, **EVA02_TINY})
eva02_base = ModelPort(_timm("eva02_base_patch14_224"), rename={}, supports={**SQUARE, **EVA02_BASE})


# transformers' DINOv3ViTModel declared: q and v biases of three projections, k none; LayerScale's
# lambda1; DINOv3's rotation (periods of base 100, halves rotated); its pooler output, the class token
# after the final norm; mask_token (masked-image pretraining's) unread by an image's forward
HF_DINOV3 = dict(
    num_classes=0,
    reg_tokens=2,
    init_values=1.0,
    pos_embed="none",
    norm_eps=1e-5,
    qkv_fused=False,
    k_bias=False,
    rope_type="dinov3",
    rope_temperature=100.0,
    rope_rotate_half=True,
)
HF_DINOV3_RENAME = {
    "cls_token": "embeddings.cls_token",
    "reg_token": "embeddings.register_tokens",
    "patch_embed.proj": "embeddings.patch_embeddings",
    "blocks.{i}.attn.proj": "model.layer.{i}.attention.o_proj",
    "blocks.{i}.attn": "model.layer.{i}.attention",
    "blocks.{i}.ls1.gamma": "model.layer.{i}.layer_scale1.lambda1",
    "blocks.{i}.ls2.gamma": "model.layer.{i}.layer_scale2.lambda1",
    "blocks.{i}.mlp.fc1": "model.layer.{i}.mlp.up_proj",
    "blocks.{i}.mlp.fc2": "model.layer.{i}.mlp.down_proj",
    "blocks.{i}": "model.layer.{i}",
}
hf_dinov3_declared = ModelPort(
    _hf_dinov3, rename=HF_DINOV3_RENAME, output=lambda out: out.pooler_output, supports={**SQUARE, **HF_DINOV3}
)
