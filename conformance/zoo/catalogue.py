"""Every mutant with what it breaks, where the bug comes from, and where it first diverges."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Mutant:
    name: str
    framework: str
    factory: str  # "module:callable", exactly what a user passes to --port
    description: str
    source: str
    first_divergence: str  # the first stage that diverges; for attention mutants, "attn" or "attn.weights";
    # for gradient mutants the first tap (its cotangent) or parameter (its gradient) in backward order
    # "model": a port factory; "packed": one of packed batches (NaFlex); "quantized": a ModelPort(quantize=);
    # "attention": an attention factory;
    # "gradient": a make_grad
    level: str = "model"
    note: str = ""  # what a case must have to expose the bug
    catchers: tuple[str, ...] = ()  # the sampled property tests that must fail on it, beside the main one
    min_ratio: float = 10.0  # the separation the meta-test demands; below 10 only with a reason in `note`
    config: str = "vit_test_token"  # the preset verify runs it on
    dtype: str = "float32"  # what it computes in (precision mutants: the dtype where the bug bites)
    plugin_in_ci: bool = True  # False: its plugin run is in the thorough profile (ci budget); verify locates it in ci
    bug_class: str = ""  # the class verify's diagnosis names (conformance.diagnosis.classes), in its dtype

    @property
    def sample(self) -> tuple[str, ...]:
        """The tests this mutant sees in the zoo's plugin run (README: "How much of the suite")."""
        main = {"model": MAIN_MODEL_TEST, "gradient": MAIN_GRADIENT_TEST, "packed": MAIN_VERIFIED_TEST}
        main = {**main, "quantized": MAIN_VERIFIED_TEST}.get(self.level, ())
        return (*main, *self.catchers)


# The rope configs a rope mutant's sampled run may draw (its ``supports``, each narrowing this to
# where its bug shows): both of timm's kinds, both grid orders, both bases, no position table.
# BEiT's relative position bias on its block (q's and v's biases, LayerScale, no position table)
REL_SUPPORTS = {"rel_pos_bias": True, "pos_embed": "none", "k_bias": (False, True), "init_values": (0.1, None)}
# A learned table met by images of other grids: vit_test_dynamic's options (and the original ViT's)
DYNAMIC_SUPPORTS = {
    "dynamic_img_size": True,
    "reg_tokens": (0, 1),
    "no_embed_class": (False, True),
    "init_values": (None, 1e-5),
}
ROPE_SUPPORTS = {
    "rope_type": ("cat", "dinov3"),
    "rope_grid_indexing": ("ij", "xy"),
    "rope_temperature": (100.0, 10000.0),
    "pos_embed": "none",
}

MAIN_MODEL_TEST = ("test_every_tap_of_every_port_matches_the_oracle",)
MAIN_GRADIENT_TEST = ("test_every_taps_and_parameters_gradient_and_the_images_match_the_reference",)
MAIN_VERIFIED_TEST = ("test_a_packed_or_quantized_port_conforms_on_drawn_configs",)  # packed and quantized ports


_T, _M, _J = "conformance.zoo.torch_mutants", "conformance.zoo.mlx_mutants", "conformance.zoo.jax_mutants"
_P = "conformance.zoo.packed_mutants"
_Q = "conformance.zoo.quantized_mutants"  # a quantized port's stored weights (MLX's nn.quantize)
_PE = "conformance.zoo.position_mutants"  # a position embedding of another kind (PyTorch)  # NaFlex's packed batches (PyTorch)

# A table: one entry per row (the formatter would give each argument a line).
# fmt: off
_ALL = [
    Mutant("mlx_shared_layernorm", "mlx", f"{_M}:shared_layernorm",
           "one LayerNorm (norm1) reused before the MLP", "seed post 000 (MLX ViT); allenai/OLMo#222",
           "blocks.0.norm2", note="norms must differ: the initialiser draws them distinct",
           catchers=("test_each_layernorm_is_used_where_it_belongs",),
           bug_class="norm2_with_norm1_weights"),
    Mutant("torch_layernorm_eps_1e5", "torch", f"{_T}:layernorm_eps_1e5",
           "LayerNorm eps 1e-5 (nn.LayerNorm's default) instead of timm's 1e-6",
           "huggingface/transformers#15332, kornia/kornia#2786", "blocks.0.norm1",
           note="needs a small normalised variance: near-constant or constant images",
           catchers=("test_each_layernorm_is_used_where_it_belongs",),
           bug_class="layernorm_eps_1e-5"),
    Mutant("torch_layernorm_where_rmsnorm", "torch", f"{_T}:layernorm_where_rmsnorm",
           "nn.LayerNorm(bias=False) where AIMv2's norms are RMSNorm (the mean subtracted)",
           "issue 60: AIMv2's RMSNorm read as LayerNorm", "patch_embed.norm", config="vit_test_aimv2",
           plugin_in_ci=False, bug_class="layernorm_where_rmsnorm"),
    Mutant("torch_windows_ignored", "torch", f"{_PE}:windows_ignored",
           "Qwen2.5-VL's windows never applied: every block attends over the whole image",
           "issue 60: Qwen2.5-VL's window attention (cu_window_seqlens)", "blocks.0.attn.weights",
           config="vit_test_qwen2_5_vl", plugin_in_ci=False, bug_class="windows_ignored"),
    Mutant("torch_rel_pos_key_minus_query", "torch", f"{_PE}:rel_pos_key_minus_query",
           "SAM's relative positions read as the key's position minus the query's (k_coords - q_coords)",
           "issue 60: SAM's decomposed relative positions (timm's get_rel_pos)", "blocks.0.attn.rel_pos",
           config="vit_test_sam", plugin_in_ci=False, bug_class="rel_pos_offsets_reversed"),
    Mutant("jax_gelu_tanh", "jax", f"{_J}:gelu_tanh", "jax.nn.gelu's default tanh approximation",
           "jax-ml/jax#4428, apple/coremltools#2863", "blocks.0.mlp.act",
           note="tanh and exact GELU differ by at most 4.7e-4 (near |x| = 2); judged per element against the "
                "GELU's own bound, not against the activation range; an atol of 1e-3 would never see it",
           bug_class="gelu_tanh"),
    Mutant("jax_layernorm_fast_variance", "jax", f"{_J}:layernorm_fast_variance",
           "Flax LayerNorm's default use_fast_variance=True (E[x^2] - E[x]^2)", "Flax default",
           "blocks.0.norm1", note="needs a token whose mean is large against its spread: huge constant images",
           catchers=("test_each_layernorm_is_used_where_it_belongs",),
           bug_class="layernorm_fast_variance"),
    Mutant("mlx_dropout_left_active", "mlx", f"{_M}:dropout_left_active",
           "nn.Dropout(0.1) in the MLP with the model never put in eval mode",
           "seed post 000; FluxML/Metalhead.jl#238", "blocks.0.mlp.act",
           catchers=("test_two_calls_give_bitwise_identical_results",),
           bug_class="active_dropout"),
    Mutant("torch_fused_attention_dropout", "torch", f"{_T}:fused_attention_dropout",
           "dropout_p=0.1 passed to F.scaled_dot_product_attention, which ignores eval()",
           "pytorch/pytorch#124464", "blocks.0.attn",
           catchers=("test_two_calls_give_bitwise_identical_results",),
           bug_class="active_dropout"),
    Mutant("torch_attention_projects_input", "torch", f"{_T}:attention_projects_input",
           "`out = self.to_out(x)`: the attention result discarded, the input projected",
           "seed post 001 (PyTorch attention)", "blocks.0.attn",
           catchers=("test_perturbing_one_heads_weights_changes_only_its_slice",),
           bug_class="attention_projects_input"),
    Mutant("torch_scale_after_softmax", "torch", f"{_T}:scale_after_softmax",
           "softmax(q k^T) / sqrt(emb_size): scaled after the softmax, by the wrong size",
           "seed post 002 (einops ViT); FrancescoSaverioZuppichini/ViT#2", "blocks.0.attn.weights",
           catchers=("test_model_attention_weights_are_softmax_of_scaled_qk_over_keys",),
           bug_class="attention_scale_after_softmax"),
    Mutant("torch_scale_by_embed_dim", "torch", f"{_T}:scale_by_embed_dim",
           "logits scaled by embed_dim^-0.5 instead of head_dim^-0.5", "omihub777/ViT-CIFAR#11",
           "blocks.0.attn.weights", note="invisible with one head",
           catchers=("test_model_attention_weights_are_softmax_of_scaled_qk_over_keys",),
           bug_class="attention_scale_by_embed_dim"),
    Mutant("mlx_attention_scale_missing", "mlx", f"{_M}:attention_scale_missing",
           "the 1/sqrt(head_dim) scale forgotten", "nerminnuraydogan/vision-transformer#1",
           "blocks.0.attn.weights",
           catchers=("test_model_attention_weights_are_softmax_of_scaled_qk_over_keys",),
           bug_class="attention_scale_missing"),
    Mutant("mlx_softmax_over_queries", "mlx", f"{_M}:softmax_over_queries",
           "softmax over the query axis (-2) instead of keys", "labmlai/annotated_deep_learning_paper_implementations#146",
           "blocks.0.attn.weights",
           catchers=("test_model_attention_weights_are_softmax_of_scaled_qk_over_keys",),
           bug_class="softmax_over_queries"),
    Mutant("torch_qkv_heads_first", "torch", f"{_T}:qkv_heads_first",
           "fused qkv rows read as (heads, 3, head_dim) instead of (3, heads, head_dim)",
           "Oneflow-Inc/libai#146", "blocks.0.attn.q", note="invisible with one head",
           catchers=("test_perturbing_one_heads_weights_changes_only_its_slice",),
           bug_class="qkv_rows_h_qkv_d"),
    Mutant("torch_qkv_einops_h_d_qkv", "torch", f"{_T}:qkv_einops_h_d_qkv",
           "rearrange 'b n (h d qkv) -> qkv b h n d': not timm's (qkv h d)", "seed post 002", "blocks.0.attn.q",
           catchers=("test_perturbing_one_heads_weights_changes_only_its_slice",),
           bug_class="qkv_rows_h_d_qkv"),
    Mutant("jax_heads_merged_head_dim_first", "jax", f"{_J}:heads_merged_head_dim_first",
           "heads merged as (head_dim, heads) instead of head-major", "FluxML/Metalhead.jl#231",
           "blocks.0.attn", note="invisible with one head",
           catchers=("test_perturbing_one_heads_weights_changes_only_its_slice",),
           bug_class="heads_merged_head_dim_first"),
    Mutant("mlx_conv_kernel_hw_swapped", "mlx", f"{_M}:conv_kernel_hw_swapped",
           "conv kernel converted OIHW -> OWHI: H and W of each patch swapped",
           "huggingface/transformers#11883, Blaizzy/mlx-vlm#1545", "patch_embed",
           note="non-square patches do not even load (reported as a finding)",
           catchers=("test_conv_patch_embed_equals_rearrange_then_linear",),
           bug_class="patch_kernel_hw_swapped"),
    Mutant("torch_tokens_column_major", "torch", f"{_T}:tokens_column_major",
           "patch tokens flattened column-major (w, h)", "lyuwenyu/RT-DETR#14", "patch_embed",
           note="invisible on a 1xN or Nx1 grid",
           catchers=("test_tokens_come_out_row_major", "test_shifting_the_image_by_one_patch_shifts_the_token_grid",),
           bug_class="tokens_column_major"),
    Mutant("torch_patch_linear_s1s2c", "torch", f"{_T}:patch_linear_s1s2c",
           "linear patch embedding over (s1 s2 c) fed a conv kernel flattened (c s1 s2)",
           "seed post 002", "patch_embed", note="invisible with one channel",
           catchers=("test_conv_patch_embed_equals_rearrange_then_linear",),
           bug_class="patch_flattened_channels_last"),
    Mutant("torch_patch_embed_times_sqrt_d", "torch", f"{_T}:patch_embed_times_sqrt_d",
           "the patch embedding times √embed_dim, the Transformer paper's embedding scale (a ViT has none)",
           "seed post 004", "patch_embed", plugin_in_ci=False, bug_class="constant_factor"),
    # a position embedding of another kind in place of the learned table (issue 45)
    Mutant("torch_pos_embed_sinusoid_1d", "torch", f"{_PE}:pos_embed_sinusoid_1d",
           "the Transformer paper's 1-D sinusoidal encoding over the sequence in place of the learned table",
           "seed post 004", "embed", plugin_in_ci=False, bug_class="pos_embed_sinusoidal_1d"),
    Mutant("torch_pos_embed_sincos_2d", "torch", f"{_PE}:pos_embed_sincos_2d",
           "SimpleViT's fixed 2-D sin-cos table in place of the learned one (the checkpoint's left unread)",
           "ports from lucidrains' SimpleViT loading a ViT checkpoint", "embed", plugin_in_ci=False,
           bug_class="pos_embed_sincos_2d"),
    Mutant("torch_pos_embed_sincos_mae", "torch", f"{_PE}:pos_embed_sincos_mae",
           "MAE's fixed 2-D sin-cos table computed at the grid in place of the learned one",
           "ports from MAE's models_mae.py (get_2d_sincos_pos_embed) loading a ViT checkpoint", "embed",
           plugin_in_ci=False, bug_class="pos_embed_sincos_2d_mae"),
    Mutant("torch_pos_embed_table_cropped", "torch", f"{_PE}:pos_embed_table_cropped",
           "dynamic image size: the table cropped to a smaller grid at its top left instead of resampled",
           "ports slicing pos_embed to the images' grid (the learned table of another grid)", "embed",
           config="vit_test_dynamic", note="only images on a smaller grid than the table's show it",
           plugin_in_ci=False, bug_class="pos_embed_table_cropped"),
    Mutant("torch_mean_pool_instead_of_cls", "torch", f"{_T}:mean_pool_instead_of_cls",
           "mean over all tokens where timm pools the class token", "huggingface/pytorch-image-models#2543",
           "pooled", note="token pooling only",
           bug_class="mean_pool_over_every_token"),
    Mutant("torch_distillation_head_unused", "torch", f"{_T}:distillation_head_unused",
           "a distilled DeiT's logits from its class token's head alone (a classifier without the teacher "
           "head run on a distilled checkpoint)", "DeiT's two heads (timm VisionTransformerDistilled)", "logits",
           config="vit_test_distilled", plugin_in_ci=False, bug_class="distillation_head_dropped"),
    Mutant("mlx_extra_layernorm_in_mlp", "mlx", f"{_M}:extra_layernorm_in_mlp",
           "an extra LayerNorm(hidden) inside the MLP, at its default init", "seed post 000", "blocks.0.mlp",
           bug_class="extra_layernorm_in_mlp"),
    Mutant("jax_qkv_bias_dropped", "jax", f"{_J}:qkv_bias_dropped",
           "qkv bias dropped by a non-strict load", "keras-team/keras-cv#1014, vllm-project/vllm#40160",
           "blocks.0.attn.q", note="qkv_bias=True configs only",
           bug_class="qkv_bias_dropped"),
    Mutant("jax_cls_token_without_pos_embed", "jax", f"{_J}:cls_token_without_pos_embed",
           "class token prepended after the position embedding (big_vision order) on a timm checkpoint",
           "huggingface/pytorch-image-models#2543, facebookresearch/dinov2#378", "embed",
           note="class-token configs only",
           bug_class="class_token_without_pos_embed"),
    Mutant("torch_softmax_over_batch", "torch", f"{_T}:softmax_over_batch",
           "softmax(dim=0): normalised across the batch", "axis counted from the front", "blocks.0.attn.weights",
           catchers=("test_a_batch_elements_output_does_not_depend_on_the_others", "test_batch_size_does_not_change_per_element_results",),
           bug_class="softmax_over_batch"),
    Mutant("torch_causal_mask", "torch", f"{_T}:causal_mask",
           "is_causal=True copied from a decoder's attention", "decoder attention reused in an encoder",
           "blocks.0.attn",
           bug_class="causal_mask"),
    Mutant("torch_naive_softmax", "torch", f"{_T}:naive_softmax",
           "softmax written as exp(l) / sum(exp(l)) in the model: inf / inf = NaN once a logit passes ~88",
           "hand-written softmax in ports; pytorch/pytorch#131060 (NaN rows)", "blocks.0.attn.weights",
           note="needs attention logits above 88: trained-like weights",
           bug_class="softmax_without_max_float32"),
    Mutant("torch_naive_softmax_fp16", "torch", f"{_T}:naive_softmax",
           "the same softmax in float16: exp overflows once a logit passes ~11",
           "facebookresearch/deit#109 (NaN under mixed precision)", "blocks.0.attn.weights", dtype="float16",
           note="needs logits above 11",
           bug_class="softmax_without_max_float16"),
    Mutant("torch_layernorm_stats_fp16", "torch", f"{_T}:layernorm_stats_in_input_dtype",
           "LayerNorm statistics as E[x^2] - E[x]^2 in float16, no upcast: x^2 overflows past |x| = 256",
           "pytorch/pytorch#66707, neuroneural/brainchop-cli#56 (x^2 past 256 in fp16)",
           "blocks.0.norm1", dtype="float16", note="needs massive activations (|x| > 256): trained-like weights",
           bug_class="layernorm_stats_float16"),
    Mutant("torch_qk_scaled_after_product_fp16", "torch", f"{_T}:scaled_after_product",
           "attention logits scaled after q k^T in float16: the unscaled product overflows 65504",
           "ultralytics/ultralytics#24990, philipturner/metal-flash-attention#8", "blocks.0.attn.weights",
           dtype="float16", note="needs scaled logits between 65504 / sqrt(head_dim) and 65504 (verify's "
                                 "case with block 0 logits at 3e4; head_dim >= 5)",
           bug_class="logits_scaled_after_product_float16"),
    Mutant("torch_token_sum_fp16", "torch", f"{_T}:token_sum_in_input_dtype",
           "average pooling as a running token sum in float16", "hand-written pooling in half precision",
           "pooled", dtype="float16", config="vit_test_avg_100_tokens",
           note="needs a large common mean over many tokens (the offset case: 100 x 1000 > 65504)",
           bug_class="token_sum_float16"),
    # The ViT family (issue 13): each bug from a public report, on a small preset with the option.
    # Rotary position embeddings (issue 43): the grid's axes and the rotation's pairs
    Mutant("torch_rope_grid_axes_swapped", "torch", f"{_T}:rope_grid_axes_swapped",
           "the rotary grid's x and y swapped (meshgrid's other indexing)", "2-D RoPE ports of EVA02 and the rope "
           "ViTs (timm's rope_grid_indexing)", "blocks.0.attn.q_rope", config="vit_test_rope",
           bug_class="rope_grid_ij"),
    Mutant("torch_rope_sin_cos_swapped", "torch", f"{_T}:rope_sin_cos_swapped",
           "the rotary tables' sin and cos exchanged", "RoPE caches laid out [cos, sin] (transformers' "
           "position_embeddings tuple order) read as timm's [sin, cos]", "blocks.0.attn.q_rope", config="vit_test_rope",
           bug_class="rope_sin_cos_swapped"),
    Mutant("torch_rope_default_temperature", "torch", f"{_T}:rope_default_temperature",
           "the rotary base 10000 (EVA02's, timm's default) for a model trained with 100", "ports of the rope "
           "ViTs and DINOv3 that keep a library's default theta", "blocks.0.attn.q_rope", config="vit_test_rope",
           bug_class="rope_temperature_10000"),
    Mutant("torch_rope_pairs_as_halves", "torch", f"{_T}:rope_pairs_as_halves",
           "the rotation's pairs as halves (x_i, x_i+hd/2) where the model's are neighbours (x_2i, x_2i+1)",
           "ports of EVA02 and the rope ViTs that reuse Llama's rotate_half (timm: rope_rotate_half=False)",
           "blocks.0.attn.q_rope", config="vit_test_rope", bug_class="rope_rotate_half"),
    Mutant("torch_rope_from_first_token", "torch", f"{_T}:rope_from_first_token",
           "the rotation applied from the first token: the class token turned, the last patch not",
           "ports that rotate q[..., :P] where timm's Eva rotates q[..., npt:]", "blocks.0.attn.q_rope",
           config="vit_test_rope", bug_class="rope_from_first_token"),
    Mutant("torch_rel_pos_index_transposed", "torch", f"{_T}:rel_pos_index_transposed",
           "BEiT's relative position index transposed: each pair reads key minus query, and the class "
           "token's query and key rows exchanged", "ports that build the index as coords[:, None, :] - "
           "coords[:, :, None] (timm: query minus key)", "blocks.0.attn.rel_pos_bias", config="vit_test_beit",
           plugin_in_ci=False, bug_class="rel_pos_index_transposed"),
    Mutant("mlx_rel_pos_bias_one_head", "mlx", f"{_M}:rel_pos_bias_one_head",
           "BEiT's relative position table read as one head's: its first column for every head",
           "ports that squeeze or index the table's head axis (table[index][..., 0])", "blocks.0.attn.rel_pos_bias",
           config="vit_test_beit", plugin_in_ci=False, bug_class="rel_pos_bias_one_head"),
    Mutant("torch_qv_biases_misplaced", "torch", f"{_T}:qv_biases_misplaced",
           "q's and v's biases joined as (q, v, 0): k gets v's bias, v none", "ports of EVA02 and BEiT that "
           "assemble the qkv bias from q_bias and v_bias by hand", "blocks.0.attn.k", config="vit_test_eva",
           bug_class="qv_biases_misplaced"),
    Mutant("mlx_rope_pairs_as_halves", "mlx", f"{_M}:rope_pairs_as_halves",
           "mlx.nn.RoPE's default rotate-half pairs for a model that rotates neighbouring pairs",
           "mlx.nn.RoPE(traditional=False) in MLX ports of interleaved RoPE", "blocks.0.attn.q_rope",
           config="vit_test_rope", bug_class="rope_rotate_half"),
    Mutant("mlx_layerscale_not_loaded", "mlx", f"{_M}:layerscale_not_loaded",
           "DINOv2 blocks without LayerScale: load_weights(strict=False) drops every ls1/ls2 gamma and the "
           "residual branches run unscaled", "riccardomusmeci/mlx-image#26", "blocks.0.ls1",
           config="vit_test_dinov2", plugin_in_ci=False,
           bug_class="layerscale_missing"),
    Mutant("torch_gelu_for_quick_gelu", "torch", f"{_T}:gelu_for_quick_gelu",
           "OpenAI CLIP weights run with GELU instead of QuickGELU (x sigmoid(1.702 x))",
           "huggingface/pytorch-image-models#2031, mlfoundations/open_clip#771", "blocks.0.mlp.act",
           config="vit_test_clip", plugin_in_ci=False,
           bug_class="gelu_exact"),
    Mutant("torch_registers_in_patch_mean", "torch", f"{_T}:registers_in_patch_mean",
           "average pooling skips the class token only: the register tokens are averaged with the patches",
           "huggingface/transformers#37817, kaiko-ai/eva#672", "pooled",
           config="vit_test_registers_avg", plugin_in_ci=False,
           bug_class="mean_pool_skipping_only_the_class_token"),
    Mutant("mlx_map_head_exact_gelu", "mlx", f"{_M}:map_head_exact_gelu",
           "SigLIP's attention-pool (MAP) head built with exact GELU while its blocks use tanh GELU",
           "a SigLIP conversion's unlocated residual difference (huggingface/transformers#32938)",
           "attn_pool.mlp.act", config="vit_test_siglip",
           note="tanh and exact GELU differ by at most 4.7e-4; judged against the GELU's own bound",
           plugin_in_ci=False,
           bug_class="gelu_exact"),
    Mutant("torch_pos_embed_no_antialias", "torch", f"{_T}:pos_embed_no_antialias",
           "dynamic image size: the position grid resampled bicubic without antialias, where timm's is "
           "antialiased (the interpolation mismatch of Blaizzy/mlx-vlm#2266; facebookresearch/dinov2#378)",
           "Blaizzy/mlx-vlm#2266, facebookresearch/dinov2#378", "embed", config="vit_test_dynamic",
           note="only images of another size than the position grid's show it", plugin_in_ci=False,
           bug_class="pos_embed_resampled_without_antialias"),
    # NaFlex's packed batches (issue 43): a port's packed path (verify's packed cases, on drawn configs in the plugin)
    Mutant("torch_naflex_padding_attended", "torch", f"{_P}:naflex_padding_attended",
           "a packed batch's padding attended: the attention without its key mask", "NaFlex and SigLIP 2 ports "
           "that drop the patch mask (timm's patch_valid, transformers' pixel_attention_mask) in the encoder",
           "blocks.0.attn.weights", level="packed", config="vit_test_naflex", bug_class="padding_attended"),
    Mutant("torch_naflex_grid_swapped", "torch", f"{_P}:naflex_grid_swapped",
           "each row's grid read from its patch coordinates as (x, y): the table resampled to (columns, rows)",
           "NaFlex ports mixing (height, width) spatial_shapes with (x, y) coordinates", "embed", level="packed",
           config="vit_test_naflex", bug_class="pos_embed_grid_swapped"),
    Mutant("torch_naflex_pos_embed_no_antialias", "torch", f"{_P}:naflex_pos_embed_no_antialias",
           "a packed batch's table resampled to each row's grid bicubic without antialias",
           "Blaizzy/mlx-vlm#2266 (the interpolation mismatch), on NaFlex's per-image grids", "embed",
           level="packed", config="vit_test_naflex", bug_class="pos_embed_resampled_without_antialias"),
    Mutant("torch_naflex_pos_embed_align_corners", "torch", f"{_P}:naflex_pos_embed_align_corners",
           "a packed batch's table resampled to each row's grid with align_corners=True",
           "a resize helper called with align_corners=True (issue 43's NaFlex bugs: the table resized with "
           "align_corners flipped)", "embed", level="packed", config="vit_test_naflex",
           bug_class="pos_embed_resampled_align_corners"),
    # quantized ports (issue 44): their quantize step's packed weights (verify's weight check, on drawn configs
    # in the plugin)
    Mutant("mlx_quant_bits_order_reversed", "mlx", f"{_Q}:bits_order_reversed",
           "4-bit codes packed most significant first in each uint32 word (MLX reads them least significant "
           "first)", "converters from GPTQ and AWQ checkpoints, whose packing orders differ from MLX's",
           "blocks.0.attn.q", level="quantized", config="vit_test_quantized", min_ratio=5.0,
           note="the separation of a weight moved within its group's range is bounded by the grid: 4-bit "
           "codes shuffled within a word move each weight about 20 half steps (the cost's ratio)",
           bug_class="quant_bits_order_reversed"),
    Mutant("mlx_quant_group_scales_shifted", "mlx", f"{_Q}:group_scales_shifted",
           "each group's weights read with the next group's scale and bias (8 bits, groups of 32)",
           "an off-by-one group index in a converter's scales (w[i] with scales[i // group_size + 1])",
           "blocks.0.attn.q", level="quantized", config="vit_test_quantized",
           bug_class="quant_group_scales_shifted"),
    Mutant("mlx_quant_zero_point_dropped", "mlx", f"{_Q}:zero_point_dropped",
           "every group's bias (its zero point) dropped (8 bits, groups of 32)",
           "a reader of a symmetric format (w = scale * code) given MLX's affine one",
           "blocks.0.attn.q", level="quantized", config="vit_test_quantized",
           bug_class="quant_zero_point_dropped"),
    Mutant("torch_mha_causal_mask", "torch", f"{_T}:mha_causal_mask",
           "a causal mask always applied in a standalone attention", "decoder attention reused in an encoder",
           "attn.weights", level="attention",
           catchers=("test_permuting_keys_and_values_together_leaves_the_output_unchanged", "test_permuting_queries_permutes_the_output",),
           bug_class="mha_causal_mask"),
    Mutant("torch_mha_scale_by_dim", "torch", f"{_T}:mha_scale_by_dim",
           "standalone attention scaled by dim^-0.5 instead of head_dim^-0.5", "omihub777/ViT-CIFAR#11",
           "attn.weights", level="attention",
           catchers=("test_multihead_attention_is_single_heads_side_by_side",),
           bug_class="mha_scale_by_dim"),
    Mutant("torch_mha_naive_softmax", "torch", f"{_T}:mha_naive_softmax",
           "softmax written as exp(l) / sum(exp(l)), no max subtracted: NaN once logits pass ~88",
           "hand-written softmax in ports; pytorch/pytorch#131060 (NaN rows)", "attn.weights", level="attention",
           catchers=("test_large_logits_stay_finite_and_match_the_oracle",),
           bug_class="mha_softmax_without_max"),
    Mutant("mlx_mha_softmax_over_queries", "mlx", f"{_M}:mha_softmax_over_queries",
           "standalone attention with softmax over queries", "labmlai/annotated_deep_learning_paper_implementations#146",
           "attn.weights", level="attention",
           catchers=("test_weights_sum_to_one_over_keys_not_queries_in_cross_attention", "test_adding_a_constant_to_a_querys_logits_changes_nothing",),
           bug_class="mha_softmax_over_queries"),
    Mutant("torch_mask_ignored", "torch", f"{_T}:mask_ignored",
           "`energy.masked_fill(...)` never assigned: the mask never masks", "seed post 002; lucidrains/x-transformers#160",
           "attn.weights", level="attention",
           catchers=("test_masked_keys_do_not_influence_the_output",),
           bug_class="mask_ignored"),
    Mutant("mlx_mask_inverted", "mlx", f"{_M}:mask_inverted", "boolean mask read as True = masked",
           "ml-explore/mlx#2395", "attn.weights", level="attention",
           catchers=("test_masked_keys_do_not_influence_the_output", "test_boolean_mask_equals_additive_zero_or_minus_inf_mask",),
           bug_class="mask_inverted"),
    Mutant("jax_mask_after_softmax", "jax", f"{_J}:mask_after_softmax",
           "mask multiplied into the weights after softmax, not renormalised",
           "facebookresearch/fairseq#1682", "attn.weights", level="attention",
           catchers=("test_masked_keys_do_not_influence_the_output",),
           bug_class="mask_after_softmax"),
    # Backward mutants: the forward is the correct port's (every forward check passes), the
    # gradients are wrong (docs/gradients.md).
    Mutant("torch_pos_embed_frozen", "torch", f"{_T}:pos_embed_frozen",
           "`.detach()` / requires_grad=False on the position embedding", "fine-tuning scripts that freeze it; "
           "interpolation helpers returning detached tensors", "pos_embed", level="gradient", plugin_in_ci=False,
           bug_class="frozen_parameter"),
    Mutant("torch_gelu_backward_missing_term", "torch", f"{_T}:gelu_backward_missing_term",
           "a hand-written GELU backward keeping Phi(x) and dropping x phi(x)", "memory-saving autograd.Functions",
           "blocks.1.mlp.fc1.weight", level="gradient", plugin_in_ci=False,
           bug_class="gelu_backward_without_x_pdf"),
    Mutant("torch_gelu_tanh_backward", "torch", f"{_T}:gelu_tanh_backward",
           "an exact GELU whose backward is the tanh approximation's slope", "fused GELU kernels written for one "
           "and used for the other", "blocks.1.mlp.fc1.weight", level="gradient", plugin_in_ci=False,
           note="the two slopes differ by at most 2e-3, near |x| = 2: 2x the tolerance on seeded weights, whose "
                "pre-activations stay small, 24x on weights at 4x",
           bug_class="gelu_backward_of_tanh"),
    Mutant("torch_layernorm_detached_statistics", "torch", f"{_T}:layernorm_detached_statistics",
           "a LayerNorm backward with its mean and variance treated as constants (`.detach()`)",
           "hand-written LayerNorms in ports", "blocks.1.attn", level="gradient", plugin_in_ci=False,
           bug_class="norm2_backward_detached_statistics"),
    Mutant("torch_attn_residual_detached", "torch", f"{_T}:attn_residual_detached",
           "`x + attn(...).detach()`: the attention branch cut from the graph", "activation-checkpointing and "
           "caching code", "blocks.1.attn", level="gradient", plugin_in_ci=False,
           bug_class="detached_branch"),
    Mutant("mlx_cls_token_stop_gradient", "mlx", f"{_M}:cls_token_stop_gradient",
           "`mx.stop_gradient` on the class token", "frozen-token tricks carried into fine-tuning", "cls_token",
           level="gradient", plugin_in_ci=False,
           bug_class="frozen_parameter"),
    Mutant("jax_softmax_kernel_backward", "jax", f"{_J}:softmax_kernel_backward",
           "a custom_vjp softmax whose backward is P g, without - P sum(P g)", "hand-written attention kernels "
           "(tenstorrent/tt-forge-onnx#1383 checks backward for this reason)", "blocks.1.attn.k", level="gradient", plugin_in_ci=False,
           bug_class="softmax_backward_without_correction"),
]
# fmt: on

MUTANTS: dict[str, Mutant] = {m.name: m for m in _ALL}
