"""The presets: configs named as timm's models (``timm.create_model(name)`` builds each with
random weights, at its default img_size and num_classes), and small ones for tests."""

from __future__ import annotations

from typing import Any

from weights.config import ConfigError, ViTConfig

# A table: one entry per row (the formatter would give each argument a line).
# fmt: off
PRESETS: dict[str, ViTConfig] = {
    # timm's presets (timm.models.vision_transformer).
    "vit_tiny_patch16_224": ViTConfig(patch_size=16, embed_dim=192, depth=12, num_heads=3),
    "vit_small_patch16_224": ViTConfig(patch_size=16, embed_dim=384, depth=12, num_heads=6),
    "vit_base_patch16_224": ViTConfig(patch_size=16, embed_dim=768, depth=12, num_heads=12),
    "vit_large_patch16_224": ViTConfig(patch_size=16, embed_dim=1024, depth=24, num_heads=16),
    # The ViT family, as timm.create_model(name) builds them (its default img_size and num_classes).
    "vit_small_patch14_dinov2": ViTConfig(img_size=518, patch_size=14, num_classes=0, embed_dim=384, depth=12,
                                          num_heads=6, init_values=1e-5),
    "vit_small_patch14_reg4_dinov2": ViTConfig(img_size=518, patch_size=14, num_classes=0, embed_dim=384, depth=12,
                                               num_heads=6, init_values=1e-5, reg_tokens=4, no_embed_class=True),
    "vit_giant_patch14_dinov2": ViTConfig(img_size=518, patch_size=14, num_classes=0, embed_dim=1536, depth=40,
                                          num_heads=24, init_values=1e-5, mlp_ratio=2.66667 * 2,
                                          mlp_layer="swiglu_packed", act_layer="silu"),
    "vit_base_patch16_clip_224": ViTConfig(patch_size=16, embed_dim=768, depth=12, num_heads=12, pre_norm=True,
                                           norm_eps=1e-5),
    "vit_base_patch16_clip_quickgelu_224": ViTConfig(patch_size=16, num_classes=512, embed_dim=768, depth=12,
                                                     num_heads=12, pre_norm=True, norm_eps=1e-5,
                                                     act_layer="quick_gelu"),
    # The towers vision-language models port: LLaVA's CLIP ViT-L/14 at 336, PaliGemma's SigLIP so400m/14 at 384.
    "vit_large_patch14_clip_336": ViTConfig(img_size=336, patch_size=14, embed_dim=1024, depth=24, num_heads=16,
                                            pre_norm=True, norm_eps=1e-5),
    "vit_large_patch14_clip_quickgelu_336": ViTConfig(img_size=336, patch_size=14, num_classes=768, embed_dim=1024,
                                                      depth=24, num_heads=16, pre_norm=True, norm_eps=1e-5,
                                                      act_layer="quick_gelu"),
    "vit_so400m_patch14_siglip_384": ViTConfig(img_size=384, patch_size=14, num_classes=0, embed_dim=1152, depth=27,
                                               num_heads=16, mlp_ratio=3.7362, class_token=False, global_pool="map"),
    "vit_base_patch16_siglip_224": ViTConfig(patch_size=16, num_classes=0, embed_dim=768, depth=12, num_heads=12,
                                             class_token=False, global_pool="map"),
    "vit_base_patch16_siglip_gap_224": ViTConfig(patch_size=16, num_classes=0, embed_dim=768, depth=12,
                                                 num_heads=12, class_token=False, global_pool="avg", fc_norm=False),
    "deit_small_distilled_patch16_224": ViTConfig(patch_size=16, embed_dim=384, depth=12, num_heads=6,
                                                  distilled=True),
    "deit3_small_patch16_224": ViTConfig(patch_size=16, embed_dim=384, depth=12, num_heads=6, no_embed_class=True,
                                         init_values=1e-6),
    # timm names no ViT with LayerNorm qk-norm (its qk-norm ViTs use RmsNorm and parallel blocks):
    # this is timm.create_model("vit_small_patch16_224", qk_norm=True).
    "vit_small_patch16_qknorm_224": ViTConfig(patch_size=16, embed_dim=384, depth=12, num_heads=6, qk_norm=True),
    # timm's Eva with rotary position embeddings and timm's Attention (attn_type='rope'): DINOv3
    # (average-pooled, as timm's default) and the axial RoPE ViT of naver-ai/rope-vit
    **{
        f"vit_{size}_patch16_dinov3": ViTConfig(
            patch_size=16, embed_dim=dim, depth=depth, num_heads=heads, num_classes=0, qkv_bias=False, init_values=1e-5,
            reg_tokens=4, global_pool="avg", fc_norm=False, norm_eps=1e-5, pos_embed="none", dynamic_img_size=True,
            rope_type="dinov3", rope_temperature=100.0, rope_rotate_half=True,
        )
        for size, dim, depth, heads in (("small", 384, 12, 6), ("base", 768, 12, 12), ("large", 1024, 24, 16))
    },
    "vit_base_patch16_rope_224": ViTConfig(
        patch_size=16, embed_dim=768, depth=12, num_heads=12, init_values=1e-5, fc_norm=False, pos_embed="none",
        rope_type="cat", rope_grid_indexing="xy", rope_temperature=100.0,
    ),
    # EVA02 (timm's Eva, its own attention): q's and v's biases apart and k none, 2-D rotary embeddings
    # rescaled onto the 16 x 16 pretraining grid beside a learned table, SwiGLU (packed in the tiny one;
    # with a norm, and q, k and v projected apart, from the base one on)
    "eva02_tiny_patch14_224": ViTConfig(
        patch_size=14, embed_dim=192, depth=12, num_heads=3, num_classes=0, global_pool="avg", k_bias=False,
        mlp_layer="swiglu_packed", act_layer="silu", mlp_ratio=16 / 3, rope_type="cat", ref_feat_shape=16,
    ),
    "eva02_base_patch14_224": ViTConfig(
        patch_size=14, embed_dim=768, depth=12, num_heads=12, num_classes=0, global_pool="avg", k_bias=False,
        qkv_fused=False, mlp_layer="swiglu", act_layer="silu", mlp_ratio=4 * 2 / 3, scale_mlp=True,
        rope_type="cat", ref_feat_shape=16,
    ),
    # naver-ai's RoPE-Mixed ViT: learned rotary frequencies per block and head (timm's Eva, its Attention)
    "vit_base_patch16_rope_mixed_224": ViTConfig(
        patch_size=16, embed_dim=768, depth=12, num_heads=12, init_values=1e-5, pos_embed="none",
        rope_type="mixed", rope_grid_indexing="xy", rope_temperature=10.0,
    ),
    # Meta's Perception Encoder (timm's Eva): CLIP's norm_pre, the rotation at coordinates from 1, (column,
    # row), rescaled onto a 24 x 24 grid beside a learned table, and an attention pool of 8 heads over every
    # token, the class token's too, projected to 512
    "vit_pe_core_tiny_patch16_384": ViTConfig(
        img_size=384, patch_size=16, embed_dim=192, depth=12, num_heads=3, num_classes=512, global_pool="map",
        pool_include_prefix=True, attn_pool_num_heads=8, pre_norm=True, norm_eps=1e-5, rope_type="cat",
        rope_grid_offset=1.0, rope_grid_indexing="xy", ref_feat_shape=24,
    ),
    # BEiT (timm's Beit): a relative position bias in every block and no position table, q's and v's
    # biases without k's, LayerScale, the patch tokens' mean through fc_norm; v2 differs in its init alone
    **{
        name: ViTConfig(
            patch_size=16, embed_dim=768, depth=12, num_heads=12, global_pool="avg", k_bias=False, init_values=init,
            pos_embed="none", rel_pos_bias=True,
        )
        for name, init in (("beit_base_patch16_224", 0.1), ("beitv2_base_patch16_224", 1e-5))
    },
    # timm's NaFlexVit: no class token, registers after the table is added, one 16 x 16 table resampled to
    # every image's grid (bicubic, antialiased), the patch embedding a Linear (timm's weights as its
    # `embeds`: weights/layouts/naflex.py); at its pretrained image size, 384
    **{
        name: ViTConfig(
            img_size=384, patch_size=16, embed_dim=dim, depth=depth, num_heads=heads, mlp_ratio=ratio,
            qkv_bias=qkv_bias, init_values=1e-5, class_token=False, reg_tokens=regs, no_embed_class=True,
            global_pool=pool, fc_norm=True if pool == "avg" else None, dynamic_img_size=True, pos_embed_grid_size=16,
        )
        for name, dim, depth, heads, ratio, qkv_bias, regs, pool in (
            ("naflexvit_base_patch16_gap", 768, 12, 12, 4.0, True, 4, "avg"),
            ("naflexvit_base_patch16_map", 768, 12, 12, 4.0, True, 1, "map"),
            ("naflexvit_so150m2_patch16_reg1_gap", 832, 21, 13, 34 / 13, False, 1, "avg"),
        )
    },
    # ... and as SigLIP 2 (timm's NaFlex SigLIP): tanh GELU, the attention pool, the table resampled bilinearly
    **{
        name: ViTConfig(
            img_size=384, patch_size=16, embed_dim=dim, depth=depth, num_heads=heads, mlp_ratio=ratio, num_classes=0,
            class_token=False, no_embed_class=True, global_pool="map", act_layer="gelu_tanh", dynamic_img_size=True,
            pos_embed_grid_size=16, pos_embed_interp_mode="bilinear",
        )
        for name, dim, depth, heads, ratio in (
            ("naflexvit_base_patch16_siglip", 768, 12, 12, 4.0),
            ("naflexvit_so400m_patch16_siglip", 1152, 27, 16, 3.7362),
        )
    },
    # InternViT-300M (timm's distilled copy): LayerScale, and no final norm, the last block's tokens as they are
    "vit_intern300m_patch14_448": ViTConfig(
        img_size=448, patch_size=14, num_classes=0, embed_dim=1024, depth=24, num_heads=16, init_values=0.1, final_norm=False,
        dynamic_img_size=True,
    ),
    # Apple's AIMv2 (timm's): RMSNorm for every norm, the patch embedding's too, no class token, the
    # patch tokens' mean after the final norm, SwiGLU, no q, k, v or output biases
    "aimv2_large_patch14_224": ViTConfig(
        patch_size=14, num_classes=0, embed_dim=1024, depth=24, num_heads=8, mlp_ratio=2.75, class_token=False,
        global_pool="avg", fc_norm=False, qkv_bias=False, proj_bias=False, act_layer="silu", mlp_layer="swiglu",
        norm_layer="rmsnorm", embed_norm=True, norm_eps=1e-5,
    ),
    # SAM ViT-B's image encoder (timm's samvit_base_patch16) up to its neck, which no option expresses:
    # 14 x 14 windows but in blocks 2, 5, 8 and 11, decomposed relative positions, no class token, no
    # final norm (timm's position table is (1, 64, 64, 768) on the grid: the canonical (1, 4096, 768))
    "samvit_base_patch16": ViTConfig(
        img_size=1024, patch_size=16, num_classes=0, embed_dim=768, depth=12, num_heads=12, class_token=False,
        global_pool="avg", final_norm=False, window_size=14, global_attn_indexes=(2, 5, 8, 11), use_rel_pos=True,
    ),
    # Qwen2.5-VL-7B's vision tower up to its merger (transformers' Qwen2_5_VisionTransformerPretrainedModel,
    # at 448 x 448): windows of 8 x 8 patches (112 pixels) cut at the image's edge but in blocks 7, 15, 23
    # and 31, Qwen2-VL's rotation, RMSNorm, SwiGLU with biases, a bias-free patch projection, no final norm
    "qwen2_5_vl_7b_vision": ViTConfig(
        img_size=448, patch_size=14, num_classes=0, embed_dim=1280, depth=32, num_heads=16, mlp_ratio=3420 / 1280,
        class_token=False, global_pool="avg", final_norm=False, pos_embed="none", rope_type="cat",
        rope_rotate_half=True, patch_bias=False, norm_layer="rmsnorm", mlp_layer="swiglu", act_layer="silu",
        window_size=8, window_partition="truncate", global_attn_indexes=(7, 15, 23, 31),
    ),
    # Small ones for tests: non-square grids, other channel counts, both poolings.
    "vit_test_token": ViTConfig(
        img_size=(16, 24), patch_size=4, in_chans=3, num_classes=7, embed_dim=24, depth=2, num_heads=3
    ),
    # vit_test_token with vit_base_patch16_rope_224's rotary embedding and no position table (the zoo's rope bugs)
    "vit_test_rope": ViTConfig(
        img_size=(16, 24), patch_size=4, in_chans=3, num_classes=7, embed_dim=24, depth=2, num_heads=3,
        pos_embed="none", rope_type="cat", rope_grid_indexing="xy", rope_temperature=100.0,
    ),
    # vit_test_rope with EVA02's block: q's and v's biases without k's, a norm in its MLP
    "vit_test_eva": ViTConfig(
        img_size=(16, 24), patch_size=4, in_chans=3, num_classes=7, embed_dim=24, depth=2, num_heads=3,
        pos_embed="none", rope_type="cat", rope_grid_indexing="xy", rope_temperature=100.0, k_bias=False,
        scale_mlp=True,
    ),
    # vit_test_token as NaFlexVit holds it: registers and no class token, a 3 x 5 table resampled to every grid
    "vit_test_naflex": ViTConfig(
        img_size=(16, 24), patch_size=4, in_chans=3, num_classes=7, embed_dim=24, depth=2, num_heads=3,
        class_token=False, reg_tokens=2, no_embed_class=True, init_values=1e-5, global_pool="avg", fc_norm=True,
        dynamic_img_size=True, pos_embed_grid_size=(3, 5),
    ),
    # vit_test_token as aimv2_large_patch14_224 is: RMSNorm everywhere, the patch tokens' mean, SwiGLU
    "vit_test_aimv2": ViTConfig(
        img_size=(16, 24), patch_size=4, in_chans=3, num_classes=7, embed_dim=24, depth=2, num_heads=3,
        mlp_ratio=2.75, class_token=False, global_pool="avg", fc_norm=False, qkv_bias=False, proj_bias=False,
        act_layer="silu", mlp_layer="swiglu", norm_layer="rmsnorm", embed_norm=True, norm_eps=1e-5,
    ),
    # vit_test_token as SAM's encoder is: 3 x 3 windows over a 4 x 6 grid (padded to 6 x 6) but in block 1,
    # decomposed relative positions, no class token; a final norm before the mean (timm's SAM without its neck)
    "vit_test_sam": ViTConfig(
        img_size=(16, 24), patch_size=4, in_chans=3, num_classes=7, embed_dim=24, depth=2, num_heads=3,
        class_token=False, global_pool="avg", fc_norm=False, window_size=3, global_attn_indexes=(1,), use_rel_pos=True,
    ),
    # vit_test_token as Qwen2.5-VL's tower is: windows of 4 x 4 patches over a 4 x 6 grid (the right one cut
    # to 4 x 2) but in block 1, its rotation, RMSNorm, SwiGLU, no class token, no final norm
    "vit_test_qwen2_5_vl": ViTConfig(
        img_size=(16, 24), patch_size=4, in_chans=3, num_classes=7, embed_dim=24, depth=2, num_heads=3,
        class_token=False, global_pool="avg", final_norm=False, pos_embed="none", rope_type="cat",
        rope_rotate_half=True, patch_bias=False, norm_layer="rmsnorm", mlp_layer="swiglu", act_layer="silu",
        window_size=4, window_partition="truncate", global_attn_indexes=(1,),
    ),
    # vit_test_token's square twin: the default for ports of square images only.
    "vit_test_token_square": ViTConfig(
        img_size=16, patch_size=4, in_chans=3, num_classes=7, embed_dim=24, depth=2, num_heads=3
    ),
    # vit_test_token_square wide enough for MLX's quantization groups of 32 and 64 (docs/quantization.md)
    "vit_test_quantized": ViTConfig(
        img_size=16, patch_size=4, in_chans=3, num_classes=7, embed_dim=64, depth=2, num_heads=2
    ),
    "vit_test_avg": ViTConfig(
        img_size=(20, 12), patch_size=4, in_chans=2, num_classes=5, global_pool="avg",
        embed_dim=16, depth=2, num_heads=2,
    ),
    "vit_test_avg_nocls": ViTConfig(
        img_size=(12, 16), patch_size=(4, 2), in_chans=1, num_classes=3, global_pool="avg",
        class_token=False, embed_dim=12, depth=1, num_heads=2, qkv_bias=False,
    ),
    "vit_test_avg_100_tokens": ViTConfig(
        img_size=40, patch_size=4, in_chans=3, num_classes=4, global_pool="avg", class_token=False,
        embed_dim=16, depth=1, num_heads=2,
    ),
    "vit_test_deep": ViTConfig(
        img_size=(8, 16), patch_size=2, in_chans=4, num_classes=4, embed_dim=32, depth=3,
        num_heads=4, mlp_ratio=2.0, qkv_bias=False,
    ),
    # Small ones of the ViT family (DINOv2 with registers, CLIP, SigLIP), for the family's mutants.
    "vit_test_dinov2": ViTConfig(
        img_size=(16, 24), patch_size=4, in_chans=3, num_classes=7, embed_dim=24, depth=2, num_heads=3,
        reg_tokens=2, no_embed_class=True, init_values=1e-5,
    ),
    "vit_test_registers_avg": ViTConfig(
        img_size=(16, 24), patch_size=4, in_chans=3, num_classes=7, embed_dim=24, depth=2, num_heads=3,
        reg_tokens=2, global_pool="avg",
    ),
    "vit_test_dynamic": ViTConfig(
        img_size=(16, 24), patch_size=4, in_chans=3, num_classes=7, embed_dim=24, depth=2, num_heads=3,
        reg_tokens=1, no_embed_class=True, init_values=1e-5, dynamic_img_size=True,
    ),
    "vit_test_clip": ViTConfig(
        img_size=(16, 24), patch_size=4, in_chans=3, num_classes=7, embed_dim=24, depth=2, num_heads=3,
        pre_norm=True, norm_eps=1e-5, act_layer="quick_gelu",
    ),
    "vit_test_siglip": ViTConfig(
        img_size=(16, 24), patch_size=4, in_chans=3, num_classes=7, embed_dim=24, depth=2, num_heads=3,
        class_token=False, global_pool="map", act_layer="gelu_tanh",
    ),
    # timm's keywords for ports as people write them: a norm after the patch projection, no
    # position table, the mean over every token (the class and register tokens too).
    "vit_test_embed_norm": ViTConfig(
        img_size=(16, 24), patch_size=4, in_chans=3, num_classes=7, embed_dim=24, depth=2, num_heads=3,
        reg_tokens=1, embed_norm=True, pos_embed="none", global_pool="avg", pool_include_prefix=True,
    ),
    # BEiT's block on a non-square grid (the zoo's relative position bugs)
    "vit_test_beit": ViTConfig(
        img_size=(16, 24), patch_size=4, in_chans=3, num_classes=7, embed_dim=24, depth=2, num_heads=3,
        global_pool="avg", k_bias=False, init_values=0.1, pos_embed="none", rel_pos_bias=True,
    ),
    "vit_test_distilled": ViTConfig(
        img_size=(16, 24), patch_size=4, in_chans=3, num_classes=7, embed_dim=24, depth=2, num_heads=3,
        distilled=True,
    ),
}
# fmt: on
PRESETS = {name: cfg.replace(name=name) for name, cfg in PRESETS.items()}


def get_config(name: str, **overrides: Any) -> ViTConfig:
    try:
        cfg = PRESETS[name]
    except KeyError:
        raise ConfigError(f"unknown preset {name!r}; presets: {sorted(PRESETS)}") from None
    return cfg.replace(**overrides) if overrides else cfg
