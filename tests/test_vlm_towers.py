"""The vision towers of today's VLMs as their authors ship them (issue 60), built small with random
weights: each read up to the tower's output (``ModelPort(tower=...)``), what its model adds after
it (a merger, a projector, a head) out of scope and said so."""

import importlib
import json
import re

import pytest

from conformance.profiles import heavy
from conformance.report import UsageError
from conformance.generators import WeightCase, make_images
from conformance.verify import Case, verify
from conformance.verify.report import format_report
from impls import ViTConfig
from tests.capture_cases import quick_cases

# transformers' Aimv2VisionModel at vit_test_aimv2's sizes, headless as its VLMs read it
AIMV2 = ViTConfig(
    img_size=16, patch_size=4, num_classes=0, embed_dim=24, depth=2, num_heads=3, mlp_ratio=2.75,
    class_token=False, global_pool="avg", fc_norm=False, qkv_bias=False, qkv_fused=False, proj_bias=False,
    act_layer="silu", mlp_layer="swiglu", norm_layer="rmsnorm", embed_norm=True, norm_eps=1e-5,
)  # fmt: skip


# transformers' InternVLVisionModel (InternViT-300M's layout): no final norm, LayerScale, q, k, v apart
INTERNVIT = ViTConfig(
    img_size=16, patch_size=4, num_classes=0, embed_dim=24, depth=2, num_heads=3, qkv_bias=False, qkv_fused=False,
    final_norm=False, init_values=0.1,
)  # fmt: skip


def near_constant_cases(config, seed=0):
    """Images whose tokens have a small spread: where a norm's eps shows (verify's own case)."""
    return [
        Case(
            "near_constant images (batch 3)",
            make_images(config, 3, "near_constant", seed),
            WeightCase(seed, 1.0).make(config),
        )
    ]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_transformers_aimv2_tower_is_conformant_up_to_its_final_norm(dtype):
    """RMSNorm in every norm (the patch embedding's too), SwiGLU, q, k and v apart: every stage up
    to the tower's final norm checked; pooled and logits out of scope, said so."""
    from tests.data.hf_aimv2_port import port

    report = verify(port, AIMV2, cases=quick_cases(AIMV2), dtype=dtype)
    assert report.conformant, format_report(report)
    assert {"patch_embed.norm", "blocks.1.norm2", "norm"} <= {r.name for r in report.stages}
    for stage in ("pooled", "logits"):
        assert report.unseen[stage].startswith("out of scope: after the tower's output, norm"), report.unseen


def test_transformers_aimv2_tower_with_mlx_vlms_eps_is_located_and_named():
    """The companion: the tower built with eps 1e-6 where its config says 1e-5 (the bug mlx-vlm
    shipped in a tower's norm) is located at its first norm and named."""
    from tests.data.hf_aimv2_port import eps_1e6

    report = verify(eps_1e6, AIMV2, cases=near_constant_cases(AIMV2))
    assert report.first_divergence == "patch_embed.norm", format_report(report)
    assert "eps 1e-6" in format_report(report)


def test_a_tower_naming_no_stage_is_exit_2_naming_the_stages(cli):
    """The port's own word, not a finding about it: verify exits 2 naming the stages there are."""
    from dataclasses import replace

    from tests.data.hf_aimv2_port import port

    with pytest.raises(UsageError, match=r"ModelPort\(tower='merger'\) names no stage of this config: one of"):
        verify(replace(port, tower="merger"), AIMV2, cases=quick_cases(AIMV2))
    config = ["--config", json.dumps({k: v for k, v in AIMV2.to_dict().items()})]
    code, _, err = cli("verify", "tests.data.hf_aimv2_port:merger", *config, "--in-process")
    assert code == 2 and "names no stage of this config" in err, err


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_transformers_internvit_tower_is_conformant_up_to_its_last_block(dtype):
    """No final norm: the tower ends at its last block (``tower='blocks.{last}'``); LayerScale as
    bare parameters of each layer is unseen, said why."""
    from tests.data.hf_internvl_port import port

    report = verify(port, INTERNVIT, cases=quick_cases(INTERNVIT), dtype=dtype)
    assert report.conformant, format_report(report)
    assert "blocks.1" in {r.name for r in report.stages} and "norm" not in report.unseen
    assert (
        report.unseen["pooled"] == "out of scope: after the tower's output, blocks.1 (ModelPort(tower='blocks.{last}'))"
    )
    assert "bare parameters" in report.unseen["blocks.0.ls1"]


def test_transformers_internvit_tower_with_its_layerscales_swapped_is_located_and_named():
    """The companion: a rename sending ls1's gamma to lambda_2 and back, located where the first
    branch joins the stream (ls1 itself is unseen) and named."""
    from tests.data.hf_internvl_port import lambdas_swapped

    report = verify(lambdas_swapped, INTERNVIT, cases=quick_cases(INTERNVIT))
    assert report.first_divergence == "blocks.0.norm2", format_report(report)
    assert "ls1's gamma and ls2's swapped" in format_report(report)


def test_mlx_vlm_internvit_tower_as_shipped_is_located_at_its_tanh_gelu():
    """A finding about mlx-vlm 0.7.10 as shipped: its InternViT's MLPs take nn.GELU(approx="precise"),
    the tanh approximation, where InternViT's config says the exact GELU; located at the first MLP's
    activation and named, every stage before it within its tolerance (in bfloat16 the difference, 5e-4
    at most, is below the dtype's rounding)."""
    from tests.data.mlx_vlm_internvl_port import port

    config = INTERNVIT.replace(qkv_fused=True)
    report = verify(port, config, cases=quick_cases(config))
    assert report.first_divergence == "blocks.0.mlp.act", format_report(report)
    assert report.diagnosis.named == "gelu_tanh", format_report(report)


def test_mlx_vlm_internvit_tower_with_the_configs_gelu_is_conformant():
    """The companion: the same tower with the exact GELU in each block, as its config says."""
    from tests.data.mlx_vlm_internvl_port import gelu_as_configured

    config = INTERNVIT.replace(qkv_fused=True)
    report = verify(gelu_as_configured, config, cases=quick_cases(config))
    assert report.conformant and "blocks.1" in {r.name for r in report.stages}, format_report(report)


# transformers' PixtralVisionModel: RMSNorm before the blocks, Pixtral's rotary bands, SwiGLU with GELU
PIXTRAL = ViTConfig(
    img_size=16, patch_size=4, num_classes=0, embed_dim=32, depth=2, num_heads=2, mlp_ratio=2.0, class_token=False,
    global_pool="avg", pos_embed="none", rope_type="pixtral", rope_rotate_half=True, pre_norm=True,
    norm_layer="rmsnorm", final_norm=False, qkv_bias=False, qkv_fused=False, proj_bias=False, mlp_layer="swiglu",
    norm_eps=1e-5,
)  # fmt: skip


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_transformers_pixtral_tower_is_conformant_on_its_one_sequence_batches(dtype):
    """Every image's tokens in one sequence, a block-diagonal mask between them: its taps (1, B N,
    ...) read back as the batch (``sequence='one'``), every stage to the last block checked, q and
    k after Pixtral's rotation."""
    from tests.data.hf_pixtral_port import port

    report = verify(port, PIXTRAL, cases=quick_cases(PIXTRAL), dtype=dtype)
    assert report.conformant, format_report(report)
    assert {"norm_pre", "blocks.0.attn.q_rope", "blocks.1"} <= {r.name for r in report.stages}


def test_transformers_pixtral_tower_whose_mask_leaks_is_located_and_named():
    """The companions: the mask gone (every image attends to the others') is located at the first
    attention and named; the port that does not say its batch is one sequence gets a finding that
    says so at the first token stage."""
    from tests.data.hf_pixtral_port import leaky_mask, unsaid_sequence

    report = verify(leaky_mask, PIXTRAL, cases=quick_cases(PIXTRAL))
    assert report.first_divergence == "blocks.0.attn", format_report(report)
    assert "every image's queries attending over every image's keys" in format_report(report)
    unsaid = verify(unsaid_sequence, PIXTRAL, cases=quick_cases(PIXTRAL))
    assert unsaid.first_divergence == "embed" and "ModelPort(sequence='one')" in unsaid.failures[0]["reason"]


def test_a_one_sequence_tap_is_unpacked_to_the_batch_it_packs():
    """(1, B N, D), (B N, D), (1, H, B N, hd) and the weights' (1, H, B N, B N) to the batch's own
    shapes (each image's block of the weights); a tap already batched is left as it is. The
    companion: weights whose mask leaked across images come back other than the images' own."""
    import numpy as np

    from conformance.capture.sequence import unpack_sequence

    rng = np.random.default_rng(0)
    B, H, N, hd = 3, 2, 4, 5
    tokens, heads = rng.normal(size=(B, N, 8)), rng.normal(size=(B, H, N, hd))
    assert np.array_equal(unpack_sequence(tokens.reshape(1, B * N, 8), B, N), tokens)
    assert np.array_equal(unpack_sequence(tokens.reshape(B * N, 8), B, N), tokens)
    packed = heads.transpose(1, 0, 2, 3).reshape(1, H, B * N, hd)
    assert np.array_equal(unpack_sequence(packed, B, N), heads)
    assert unpack_sequence(heads, B, N) is heads
    weights = rng.random(size=(B, H, N, N))
    block = np.zeros((1, H, B * N, B * N))
    for i in range(B):
        block[0, :, i * N : (i + 1) * N, i * N : (i + 1) * N] = weights[i]
    assert np.array_equal(unpack_sequence(block, B, N, weights=True), weights)
    assert not np.array_equal(unpack_sequence(block + 0.1, B, N, weights=True), weights)
    # one image of one token (the plugin's smallest drawn case): (1, 1, D) and (1, D) are its tokens
    one = tokens[:1, :1]
    assert np.array_equal(unpack_sequence(one, 1, 1), one) and np.array_equal(unpack_sequence(one[0], 1, 1), one)


# mlx-vlm's Pixtral tower: as PIXTRAL, with the SiLU its MLP takes
MLX_VLM_PIXTRAL = PIXTRAL.replace(act_layer="silu")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_mlx_vlm_pixtral_tower_is_conformant_on_its_one_sequence_batches(dtype):
    """MLX, NHWC images, one sequence with an additive block mask, the rotation from a table over
    the largest grid: every stage to the last block checked."""
    from tests.data.mlx_vlm_pixtral_port import port

    report = verify(port, MLX_VLM_PIXTRAL, cases=quick_cases(MLX_VLM_PIXTRAL), dtype=dtype)
    assert report.conformant, format_report(report)
    assert {"norm_pre", "blocks.0.attn.k_rope", "blocks.1"} <= {r.name for r in report.stages}


def test_mlx_vlm_pixtral_tower_with_its_norms_eps_is_located_and_named():
    """The companion: its blocks' norms at eps 1e-6 where the config says 1e-5, located at the first
    block's norm (ln_pre keeps MLX's default) and named."""
    from tests.data.mlx_vlm_pixtral_port import eps_1e6

    report = verify(eps_1e6, MLX_VLM_PIXTRAL, cases=near_constant_cases(MLX_VLM_PIXTRAL))
    assert report.first_divergence == "blocks.0.norm1", format_report(report)
    assert "eps 1e-6" in format_report(report)


# mlx-vlm's Idefics3 (SmolVLM) vision tower: SigLIP's encoder, q, k and v apart, the tanh GELU, its final
# norm on every token, no head
IDEFICS3 = ViTConfig(
    img_size=16, patch_size=4, num_classes=0, embed_dim=32, depth=2, num_heads=2, mlp_ratio=2.0, class_token=False,
    global_pool="avg", fc_norm=False, qkv_fused=False, act_layer="gelu_tanh", norm_eps=1e-6,
)  # fmt: skip


def test_mlx_vlm_idefics3_tower_as_shipped_is_located_at_its_final_norms_eps():
    """A finding about mlx-vlm 0.7.10 as shipped: the tower's post_layernorm is built with MLX's
    default eps (1e-5) where its blocks' norms, and all three of transformers' Idefics3, take the
    config's 1e-6; every stage before it within its tolerance."""
    from tests.data.mlx_vlm_idefics3_port import port

    report = verify(port, IDEFICS3, cases=quick_cases(IDEFICS3)[:1])
    assert report.first_divergence == "norm", format_report(report)
    assert report.diagnosis.named == "layernorm_eps_1e-5", report.diagnosis
    assert all(s.ok for s in report.stages if s.name != "norm") and not report.unseen.keys() - {
        "pooled",
        "logits",
        "blocks.0.attn.weights",
        "blocks.1.attn.weights",
    }


def test_mlx_vlm_idefics3_tower_with_its_final_norm_at_the_configs_eps_is_conformant():
    """The companion: the same tower with that one norm's eps set as transformers builds it."""
    from tests.data.mlx_vlm_idefics3_port import eps_as_configured

    report = verify(eps_as_configured, IDEFICS3, cases=quick_cases(IDEFICS3))
    assert report.conformant, format_report(report)
    assert {"patch_embed", "blocks.1.attn.q", "norm"} <= {r.name for r in report.stages}


# transformers' Qwen2.5-VL vision tower: a bias-free patch projection over two identical frames, RMSNorm,
# Qwen2-VL's rotation (timm's 'cat' bands as halves), SwiGLU with biases, no final norm
QWEN2_5_VL = ViTConfig(
    img_size=16, patch_size=4, num_classes=0, embed_dim=32, depth=2, num_heads=2, mlp_ratio=2.0, class_token=False,
    global_pool="avg", pos_embed="none", rope_type="cat", rope_rotate_half=True, patch_bias=False,
    norm_layer="rmsnorm", final_norm=False, mlp_layer="swiglu", act_layer="silu", norm_eps=1e-6,
)  # fmt: skip


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_transformers_qwen2_5_vl_tower_is_conformant_in_its_merge_order(dtype):
    """Its tokens in 2 x 2 merge groups, one sequence, one fused attention call per image or window
    (cu_seqlens): read back as the batch, row-major (``sequence='merge2x2'``); every stage to the last
    block but q and k before their rotation (no module holds them) checked. Its windows cover the
    image here: the window attention itself is not exercised."""
    from tests.data.hf_qwen2_5_vl_port import port

    report = verify(port, QWEN2_5_VL, cases=quick_cases(QWEN2_5_VL), dtype=dtype)
    assert report.conformant, format_report(report)
    assert {"patch_embed", "blocks.0.attn.v", "blocks.1.attn.q_rope", "blocks.1"} <= {r.name for r in report.stages}
    # its merger, left in the model, after the tower: its parameters out of scope, and said so
    assert "parameter(s) there" in report.unseen["pooled"] and "visual.merger.ln_q.weight" in report.unseen["pooled"]
    # q before its rotation: timm reads it at a weightless q_norm, which this model has not
    assert report.unseen["blocks.0.attn.q"].startswith(
        "timm shows it at blocks.0.attn.q_norm, a module without weights"
    )


def test_a_mergers_parameter_shaped_as_an_options_part_is_not_read_as_one():
    """At 48 wide with 8 x 8 patches the merger's first bias, (4 D,), has a raw patch's size (3 x 8 x 8):
    the parts the config does not name are asked of the parameters left once those after the tower
    are set apart (it was exit 2, "patch_norm=true", in the property suite's draws)."""
    from tests.data.hf_qwen2_5_vl_port import port

    config = QWEN2_5_VL.replace(embed_dim=48, patch_size=8, img_size=32)
    assert config.patch_dim == 4 * config.embed_dim
    report = verify(port, config, cases=quick_cases(config)[:1])
    assert report.conformant, format_report(report)
    assert "visual.merger.mlp.0.bias" in report.unseen["pooled"]


# transformers' Qwen3-VL vision tower: a learned table and Qwen2-VL's rotation, LayerNorm, a GELU MLP, no
# final norm; its merger and a deepstack merger (called after block 0) left in the model
QWEN3_VL = ViTConfig(
    img_size=16, patch_size=4, num_classes=0, embed_dim=32, depth=2, num_heads=2, mlp_ratio=2.0, class_token=False,
    global_pool="avg", rope_type="cat", rope_rotate_half=True, final_norm=False, act_layer="gelu_tanh",
)  # fmt: skip


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_transformers_qwen3_vl_tower_is_conformant_with_its_mergers_in_place(dtype):
    """Its deepstack merger runs between its blocks on block 0's tokens, its merger after the last:
    neither changes a stage of the tower, so their parameters are out of scope, named; every stage to
    the last block checked."""
    from tests.data.hf_qwen3_vl_port import port

    report = verify(port, QWEN3_VL, cases=quick_cases(QWEN3_VL), dtype=dtype)
    assert report.conformant, format_report(report)
    assert {"embed", "blocks.0.attn.q_rope", "blocks.1"} <= {r.name for r in report.stages}
    assert "the model's 12 parameter(s) there" in report.unseen["pooled"], report.unseen["pooled"]
    assert "visual.deepstack_merger_list.0.linear_fc1.weight" in report.unseen["pooled"]


def test_a_parameter_no_canonical_key_fills_before_the_towers_output_stays_a_finding():
    """The companion of the merger's parameters left out of scope: the same tower under a wrapper
    that scales its patches by a parameter of its own (at 1, so no stage moves) is not conformant at
    load, naming that parameter alone; the merger's, one module at a time, still out of scope."""
    from tests.data.hf_qwen2_5_vl_port import gained

    report = verify(gained, QWEN2_5_VL, cases=quick_cases(QWEN2_5_VL)[:1])
    assert report.first_divergence == "load", format_report(report)
    (load,) = [f["reason"] for f in report.failures if f["stage"] == "load"]
    assert load.endswith(
        "the model has 1 parameter(s) the canonical weights do not fill, left at the model's initial values: gain"
    ), load
    assert "visual.merger.ln_q.weight" in report.unseen["pooled"] and "gain" not in report.unseen["pooled"]


def test_transformers_qwen2_5_vl_tower_read_in_row_major_order_is_located_and_named():
    """The companion: the same tower read as if its sequence were row-major, located at the patch
    embedding and named, with the option that reads it."""
    from tests.data.hf_qwen2_5_vl_port import row_major

    report = verify(row_major, QWEN2_5_VL, cases=quick_cases(QWEN2_5_VL))
    assert report.first_divergence == "patch_embed", format_report(report)
    assert "2 x 2 merge groups" in format_report(report) and "sequence='merge2x2'" in format_report(report)


# Qwen2.5-VL's windows smaller than the image: a 6 x 6 grid in windows of 4 x 4 patches (2 x 2 merge groups),
# those at the edge cut short, every block but the last attending within them
QWEN2_5_VL_WINDOWS = QWEN2_5_VL.replace(
    img_size=24, window_size=4, window_partition="truncate", global_attn_indexes=(1,)
)
QWEN_TOWERS = ["hf_qwen2_5_vl_port", "mlx_vlm_qwen2_5_vl_port"]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("tower", QWEN_TOWERS)
def test_a_qwen2_5_vl_tower_in_windows_is_conformant_with_them_declared(tower, dtype):
    """transformers' and mlx-vlm's Qwen2.5-VL towers with windows smaller than the image
    (``window_partition='truncate'``): their blocks read in window order, each fused call a window's
    tokens joined in order; every stage the tower shows checked, in float32 and bfloat16."""
    port = importlib.import_module(f"tests.data.{tower}").windowed
    report = verify(port, QWEN2_5_VL_WINDOWS, cases=quick_cases(QWEN2_5_VL_WINDOWS), dtype=dtype)
    assert report.conformant, format_report(report)
    assert {"embed", "blocks.0.attn", "blocks.1.attn.k_rope", "blocks.1"} <= {r.name for r in report.stages if r.ok}


@pytest.mark.parametrize("tower", QWEN_TOWERS)
def test_a_qwen2_5_vl_tower_whose_blocks_ignore_their_windows_is_located_and_named(tower):
    """The companion: the same tower with every block in fullatt_block_indexes (its tokens in window
    order, its windows' cu_seqlens never used), located at the first block's attention and named."""
    port = importlib.import_module(f"tests.data.{tower}").windows_ignored
    report = verify(port, QWEN2_5_VL_WINDOWS, cases=quick_cases(QWEN2_5_VL_WINDOWS)[:1])
    assert report.first_divergence == "blocks.0.attn" and report.diagnosis.named == "windows_ignored", format_report(
        report
    )


@pytest.mark.parametrize("tower", QWEN_TOWERS)
def test_a_qwen2_5_vl_tower_in_windows_under_a_config_without_them_is_exit_2_naming_the_option(cli, tower):
    """Under a config that does not declare its windows, the oracle attends over the whole image: a
    correct tower is not a finding (it was NOT CONFORMANT at blocks.0.attn) but exit 2, its one line
    the windows and the options that express them."""
    config = ["--config", json.dumps(QWEN2_5_VL.to_dict())]
    code, out, err = cli("verify", f"tests.data.{tower}:windowed", *config, "--in-process")
    said = [line for line in err.splitlines() if "cannot express" in line]
    assert code == 2 and len(said) == 1 and not out.strip(), out + err
    assert "attends within windows of each image's 16 tokens (in block 0 " in said[0], said
    assert "called on 4 tokens at a time" in said[0] and "window_partition='truncate' expresses it" in said[0]


def test_a_merge_grouped_tap_is_brought_to_row_major_order():
    """(1, B N, D) in 2 x 2 merge groups back to (B, N, D) row-major, and the weights' queries and
    keys both; the companion: read as a row-major sequence it stays in the other order."""
    import numpy as np

    from conformance.capture.sequence import merge_order, unpack_sequence

    rng = np.random.default_rng(1)
    B, grid, D = 2, (4, 6), 3
    N = grid[0] * grid[1]
    tokens = rng.normal(size=(B, N, D))
    order = merge_order(grid, 2)
    assert sorted(order) == list(range(N)) and list(order[:4]) == [0, 1, 6, 7]
    packed = tokens[:, order].reshape(1, B * N, D)
    assert np.array_equal(unpack_sequence(packed, B, N, grid, 2), tokens)
    assert not np.array_equal(unpack_sequence(packed, B, N, grid, 1), tokens)
    weights = rng.random(size=(B, 1, N, N))
    block = np.zeros((1, 1, B * N, B * N))
    for i in range(B):
        block[0, :, i * N : (i + 1) * N, i * N : (i + 1) * N] = weights[i][:, order][:, :, order]
    assert np.array_equal(unpack_sequence(block, B, N, grid, 2, weights=True), weights)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_mlx_vlm_qwen2_5_vl_tower_is_conformant_in_its_merge_order(dtype):
    """mlx-vlm's Qwen2.5-VL tower (MLX: its Conv3d's output channels last, one mx.fast call per image
    or window): as transformers' is read."""
    from tests.data.mlx_vlm_qwen2_5_vl_port import port

    report = verify(port, QWEN2_5_VL, cases=quick_cases(QWEN2_5_VL), dtype=dtype)
    assert report.conformant, format_report(report)
    assert {"patch_embed", "blocks.0.attn.v", "blocks.1.attn.k_rope", "blocks.1"} <= {r.name for r in report.stages}


def test_mlx_vlm_qwen2_5_vl_tower_with_its_gate_and_value_swapped_is_located_and_named():
    """The companion: a convert sending the gate's weights to up_proj and back, located at the first
    block's activation and named."""
    from tests.data.mlx_vlm_qwen2_5_vl_port import gate_for_up

    report = verify(gate_for_up, QWEN2_5_VL, cases=quick_cases(QWEN2_5_VL))
    assert report.first_divergence == "blocks.0.mlp.act", format_report(report)
    assert "SwiGLU's gate and value projections swapped" in format_report(report)


# Qwen2.5-VL's rotation at its own reach: a 32 x 32 grid, heads of 80 as its 7B tower's, one block
QWEN2_5_VL_REACH = QWEN2_5_VL.replace(img_size=128, embed_dim=160, depth=1)


def test_the_tools_cast_leaves_the_buffers_no_checkpoint_holds_as_the_model_built_them():
    """Cast to bfloat16 as from_pretrained(dtype=...) loads: the parameters, not Qwen2.5-VL's rotary
    inv_freq (persistent=False), which .to(dtype) rounds (its 7B tower at 448 pixels was NOT
    CONFORMANT at blocks.0.attn.k_rope, 4.5 % off, for the tool's cast). The companion: a build that
    casts with .to(dtype) itself (NVIDIA-NeMo/Automodel#3856's) has it rounded."""
    import torch

    from tests.data.hf_qwen2_5_vl_port import freqs_in_dtype, port

    state = quick_cases(QWEN2_5_VL)[0].state
    ours = port(QWEN2_5_VL, state, "bfloat16").adapter.model.visual
    assert ours.blocks[0].attn.qkv.weight.dtype == torch.bfloat16
    assert ours.rotary_pos_emb.inv_freq.dtype == torch.float32
    assert freqs_in_dtype(QWEN2_5_VL, state, "bfloat16").adapter.model.visual.rotary_pos_emb.inv_freq.dtype == (
        torch.bfloat16
    )


@pytest.mark.skipif(not heavy(), reason="thorough profile: a 32 x 32 grid; ci checks the cast itself (above)")
def test_a_qwen2_5_vl_tower_at_its_rotations_reach_is_conformant_in_bfloat16_and_its_rounded_frequencies_located():
    from tests.data.hf_qwen2_5_vl_port import freqs_in_dtype, port

    cases = quick_cases(QWEN2_5_VL_REACH)
    report = verify(port, QWEN2_5_VL_REACH, cases=cases, dtype="bfloat16")
    assert report.conformant, format_report(report)
    bug = verify(freqs_in_dtype, QWEN2_5_VL_REACH, cases=cases, dtype="bfloat16")
    assert bug.first_divergence in ("blocks.0.attn.q_rope", "blocks.0.attn.k_rope"), format_report(bug)
    assert bug.diagnosis.named == "rope_frequencies_bfloat16", format_report(bug)


# transformers' SamVisionModel (SAM's image encoder) at a small size: a 8 x 8 grid in 3 x 3 windows (padded
# to 9 x 9) but in block 1, decomposed relative positions, no class token, no final norm before its neck
SAM = ViTConfig(
    img_size=32, patch_size=4, num_classes=0, embed_dim=24, depth=3, num_heads=3, class_token=False,
    global_pool="avg", final_norm=False, window_size=3, global_attn_indexes=(1,), use_rel_pos=True,
)  # fmt: skip


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_transformers_sam_image_encoder_is_conformant_up_to_its_neck(dtype):
    """Its blocks' (B, h, w, D) tokens and its windows' (B nW, w, w, D) read as the taps; q, k, v and
    the decomposed bias from its fused attention call's arguments, in windows and globally; the
    neck (no option expresses it), left in the model, after the tower: its parameters out of scope."""
    from tests.data.hf_sam_port import port

    report = verify(port, SAM, cases=quick_cases(SAM), dtype=dtype)
    assert report.conformant, format_report(report)
    checked = {r.name for r in report.stages}
    assert {"blocks.0.attn.rel_pos", "blocks.0.attn", "blocks.1.attn.rel_pos", "blocks.2"} <= checked
    assert report.unseen["pooled"].startswith("out of scope: after the tower's output, blocks.2")
    assert "the model's 6 parameter(s) there" in report.unseen["pooled"], report.unseen["pooled"]


def test_transformers_sam_with_its_rel_pos_tables_swapped_is_located_and_named():
    """The companion: rel_pos_h sent where rel_pos_w goes and back (a square window's tables have one
    shape, so nothing refuses the load), located at the first block's bias and named."""
    from tests.data.hf_sam_port import rows_and_columns_swapped

    report = verify(rows_and_columns_swapped, SAM, cases=quick_cases(SAM))
    assert report.first_divergence == "blocks.0.attn.rel_pos", format_report(report)
    assert "rel_pos_h and rel_pos_w swapped" in format_report(report)


def test_transformers_sam_with_no_tower_declared_is_exit_2_naming_the_neck_alone(cli):
    """The same encoder with no ModelPort(tower=...): the config cannot express its neck, and that is
    the answer's one line, with the option that checks the tower up to it (not a finding about the
    port: its parameters are the neck's, filled by no canonical key)."""
    config = ["--config", json.dumps(SAM.to_dict())]
    code, _, err = cli("verify", "tests.data.hf_sam_port:without_tower", *config, "--in-process")
    assert code == 2, err
    lines = [line for line in err.splitlines() if line.startswith("  ")]
    assert len(lines) == 1 and "convolutional neck after its blocks (vision_encoder.neck" in lines[0], err
    assert "ModelPort(tower='blocks.{last}') checks the tower up to it" in lines[0], err


TOWER_PORTS = (
    "hf_aimv2_port",
    "hf_internvl_port",
    "hf_pixtral_port",
    "hf_qwen2_5_vl_port",
    "hf_sam_port",
    "hf_llama4_port",
)


@pytest.mark.skipif(not heavy(), reason="thorough profile: the property suite on six tower ports (about 2 minutes)")
def test_the_property_suite_passes_on_the_tower_ports_as_shipped():
    """The plugin's properties on each tower as its VLM reads it (tower=, sequence=), where their
    declared configs reach; the companion: InternViT's swapped LayerScales fail the same run."""
    from pathlib import Path

    from tests.test_plugin import run_pytest

    ports = [a for p in TOWER_PORTS for a in ("--port", f"tests.data.{p}:port")]
    broken = ("--port", "tests.data.hf_internvl_port:lambdas_swapped")
    code, out = run_pytest(Path(__file__).parents[1], "--only-given-ports", *ports, *broken, select=None)
    failed = {re.search(r"\[([^\]]+)\]", line)[1] for line in out.splitlines() if line.startswith("FAILED ")}
    assert code == 1 and failed == {"tests.data.hf_internvl_port:lambdas_swapped"}, out[-3000:]
