"""The options of timm's other ViT builders, each defined once as weights/options.py defines the
rest (and read through it): its Eva's rotary embeddings and EVA02's attention, its NaFlexVit's one
table for every size, its Beit's relative position bias and its VisionTransformerSAM's windows and
decomposed relative positions."""

from __future__ import annotations

from weights.checks import count, grid, indexes, number, one_of
from weights.option import BEIT, DINOV3, EXACT_GRID, SIGLIP2, Option, only

ROPE_TYPES = ("cat", "dinov3", "mixed", "pixtral")  # timm's rope_type, and Pixtral's; 'mrope' not yet

BUILDER_OPTIONS: tuple[Option, ...] = (
    # timm's Eva (eva.py): rotary position embeddings in every block's attention (impls/numpy_pos_embed.py)
    Option(
        "rope_type",
        None,
        None,
        "rotary position embeddings of q and k (the prefix tokens left unrotated): None, 'cat' (EVA02, the "
        "axial rope ViTs), 'dinov3' (DINOv3's centred coordinates and periods), 'mixed' (RoPE-Mixed's "
        "learned frequencies, rope.freqs) or 'pixtral' (Pixtral's bands, the even ones the row's)",
        holds=only(None, {DINOV3: ("dinov3",)}),
        timm_name="rope_type (Eva)",
        draws=(None, None, "cat", "dinov3", "mixed", "pixtral"),
        check=one_of(ROPE_TYPES, none="no rotary embedding"),
    ),
    Option(
        "rope_temperature",
        10000.0,
        10000.0,
        "the rotary bands' base",
        holds=only(10000.0, {DINOV3: None}),
        timm_name="rope_temperature (Eva)",
        draws=(10000.0, 100.0),
        check=number(0),
    ),
    Option(
        "rope_grid_indexing",
        "ij",
        "ij",
        "the rotary grid's coordinates as (row, column), 'ij', or (column, row), 'xy'",
        holds=only("ij"),
        timm_name="rope_grid_indexing (Eva)",
        draws=("ij", "xy"),
        check=one_of(("ij", "xy")),
    ),
    Option(
        "rope_grid_offset",
        0.0,
        0.0,
        "added to the rotary grid's coordinates",
        holds=only(0.0),
        timm_name="rope_grid_offset (Eva)",
        draws=(0.0, 0.0, 1.0),
        check=number(within=2**24, why=EXACT_GRID),
    ),
    Option(
        "rope_rotate_half",
        False,
        False,
        "the rotation's pairs: (x_i, x_{i + hd/2}) (True, DINOv3) or neighbours (x_2i, x_2i+1)",
        holds=only(False, {DINOV3: (True,)}),
        timm_name="rope_rotate_half (Eva)",
        draws=(False, True),
    ),
    Option(
        "ref_feat_shape",
        None,
        None,
        "EVA02's rescale of the rotary grid onto the pretraining grid",
        holds=only(None),
        timm_name="ref_feat_shape (Eva)",
        draws=(None, None, (3, 5)),
        check=grid(none="the images' grid"),
    ),
    # timm's Eva block (eva.py): EVA02; BEiT and transformers' DINOv3 share its attention's biases
    Option(
        "k_bias",
        True,
        True,
        "the key's bias beside q's and v's (False: attn.q_bias and attn.v_bias, k none; EVA02, BEiT)",
        holds=only(True, {DINOV3: None, BEIT: (False,)}),
        timm_name="qkv_bias (Eva's attention: q and v only)",
        draws=(True, True, False),
        lacks=(
            (
                r"blocks\.\d+\.attn\.[qv]_bias",
                "its q and v have no biases apart from a qkv's",
                "k_bias=true (or qkv_bias=false)",
            ),
            (r"blocks\.\d+\.attn\.k_proj\.bias", "its key projection has no bias", "k_bias=false"),
        ),
        adds=("k_bias=false", dict(k_bias=False, qkv_bias=True)),
    ),
    Option(
        "qkv_fused",
        True,
        True,
        "q, k and v from one projection, attn.qkv (False: attn.q_proj, attn.k_proj and attn.v_proj; EVA02 B, L)",
        holds=only(True, {DINOV3: (False,)}),
        timm_name="qkv_fused (Eva)",
        draws=(True, True, False),
        adds=("qkv_fused=false", dict(qkv_fused=False)),
    ),
    Option(
        "scale_mlp",
        False,
        False,
        "a LayerNorm over the MLP's hidden features before fc2, mlp.norm (EVA02's normed SwiGLU)",
        holds=only(False),
        timm_name="scale_mlp (Eva)",
        draws=(False, True),
        lacks=((r"blocks\.\d+\.mlp\.norm\.(weight|bias)", "its MLP has no norm before fc2", "scale_mlp=false"),),
        adds=("scale_mlp=true", dict(scale_mlp=True)),
    ),
    Option(
        "attn_pool_num_heads",
        None,
        (None,),
        "the attention pool's heads (None: num_heads; Perception Encoder: 8)",
        holds=only(None),
        timm_name="attn_pool_num_heads (Eva)",
        draws=(None, None, 1, 2),
        check=count(1, none="num_heads"),
    ),
    # timm's NaFlexVit (naflexvit.py): one learned table for every image size
    Option(
        "pos_embed_grid_size",
        None,
        None,
        "the learned table's own grid where it is not the images' (NaFlex: 16 x 16 at every image size), "
        "resampled to each image's grid as timm resamples it (bicubic, antialiased)",
        holds=only(
            None, {SIGLIP2: None, "npz": None}
        ),  # big_vision's NaFlex ViT: layouts/big_vision.py checks the rest
        timm_name="pos_embed_grid_size (NaFlexVit)",
        check=grid(none="the images' grid"),
    ),
    Option(
        "pos_embed_interp_mode",
        "bicubic",
        "bicubic",
        "how a learned table is resampled to another grid, antialiased: 'bicubic' (timm) or 'bilinear' "
        "(SigLIP 2, timm's NaFlex SigLIP)",
        holds=only("bicubic", {SIGLIP2: ("bilinear",), "npz": ("bicubic", "bilinear")}),
        timm_name="pos_embed_interp_mode (NaFlexVit)",
        check=one_of(("bicubic", "bilinear")),
    ),
    # timm's Beit (beit.py): BEiT's relative position bias in every block's attention
    Option(
        "rel_pos_bias",
        False,
        False,
        "a learned relative position bias added to each block's attention logits, "
        "attn.relative_position_bias_table (BEiT; usually with pos_embed='none')",
        holds=only(False, {BEIT: None}),
        hf="use_relative_position_bias",
        timm_name="use_rel_pos_bias (Beit)",
        draws=(False, False, False, True),
    ),
    # timm's VisionTransformerSAM (SAM's image encoder, ViTDet): windows and decomposed relative positions
    Option(
        "window_size",
        0,
        0,
        "window attention: each block not in global_attn_indexes attends within non-overlapping window_size x "
        "window_size windows of the patch grid, zero-padded to a whole number of them (SAM's image encoder); "
        "0: every block attends globally",
        holds=only(0),
        hf="window_size",
        timm_name="window_size (VisionTransformerSAM)",
        draws=(0, 0, 0, 0, 0, 0, 2, 3),
        check=count(0),
    ),
    # Qwen2.5-VL's vision tower: its windows cut at the image's edge instead of padded
    Option(
        "window_partition",
        "pad",
        "pad",
        "how window_size's windows meet the image's edge: 'pad', the grid zero-padded to whole windows, "
        "attended window by window (SAM's, timm's window_partition); 'truncate', the windows at the edge cut "
        "short and each token attending its window's tokens on the whole grid (Qwen2.5-VL's window attention: "
        "window_size its window in patches, global_attn_indexes its fullatt_block_indexes)",
        holds=only("pad"),
        timm_name=None,
        draws=("pad", "truncate"),
        check=one_of(("pad", "truncate")),
    ),
    Option(
        "global_attn_indexes",
        (),
        ((),),
        "the blocks that attend globally where window_size windows the others (SAM ViT-B: 2, 5, 8, 11)",
        holds=only(()),
        hf="global_attn_indexes",
        timm_name="global_attn_indexes (VisionTransformerSAM)",
        draws=((), (0,)),
        check=indexes(),
    ),
    Option(
        "use_rel_pos",
        False,
        False,
        "decomposed relative positions (MViTv2, SAM): each block's attention logits add q's products with "
        "attn.rel_pos_h and attn.rel_pos_w, learned per row and column offset within its window (or the grid)",
        holds=only(False),
        hf="use_rel_pos",
        timm_name="use_rel_pos (VisionTransformerSAM)",
        draws=(False, False, False, False, False, False, False, True),
        lacks=(
            (
                r"blocks\.\d+\.attn\.rel_pos_[hw]",
                "its attention adds no decomposed relative position",
                "use_rel_pos=false",
            ),
        ),
        adds=("use_rel_pos=true", dict(use_rel_pos=True)),
    ),
)
