"""Llama 4's vision tower as transformers and mlx-vlm ship it, built small with random weights: its
class token after the patches (``ModelPort(prefix="last")``), its rotation a complex buffer, read up to
its final norm (its pixel shuffle and adapter after it out of scope)."""

import warnings
from dataclasses import replace

import pytest

from conformance.capture.adapters.torch import cast_as_loaded
from conformance.capture.expressible import NotExpressible
from conformance.report import CannotJudge
from conformance.verify import verify
from conformance.verify.report import format_report
from impls import ViTConfig
from tests.capture_cases import quick_cases

# transformers' Llama4VisionModel: its class token after the patches, a bias-free Linear over unfolded
# patches, a LayerNorm before the blocks, timm's 'cat' rotation x first from 1; its adapter reads 4 x D
LLAMA4 = ViTConfig(
    img_size=16, patch_size=4, num_classes=0, embed_dim=32, depth=2, num_heads=2, mlp_ratio=4.0, global_pool="avg",
    fc_norm=False, pre_norm=True, patch_bias=False, qkv_fused=False, rope_type="cat", rope_grid_indexing="xy",
    rope_grid_offset=1.0, norm_eps=1e-5,
)  # fmt: skip


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_transformers_llama4_tower_is_conformant_with_its_class_token_last(dtype):
    """Its class token appended after the patches and its table's class row last (``prefix='last'``:
    every tap read in the canonical order), its rotation a complex buffer kept complex by the tool's
    cast: every stage to its final norm checked, the pixel shuffle and adapter after it out of scope."""
    from tests.data.hf_llama4_port import port

    report = verify(port, LLAMA4, cases=quick_cases(LLAMA4), dtype=dtype)
    assert report.conformant, format_report(report)
    assert {"embed", "blocks.0.attn.q_rope", "blocks.1.attn.k_rope", "norm"} <= {r.name for r in report.stages}
    assert report.unseen["pooled"].startswith("out of scope: after the tower's output, norm")


def test_a_llama4_tower_not_saying_where_its_class_token_is_is_located_and_named():
    """The companion: the same port without ``prefix='last'`` is located at embed and named, the
    declaration in the advice."""
    from tests.data.hf_llama4_port import prefix_unsaid

    report = verify(prefix_unsaid, LLAMA4, cases=quick_cases(LLAMA4))
    assert report.first_divergence == "embed", format_report(report)
    assert report.diagnosis.named == "prefix_tokens_last" and "ModelPort(prefix='last')" in format_report(report)


def test_mlx_vlm_llama4_tower_as_shipped_is_located_at_its_quickgelu():
    """A finding about mlx-vlm 0.7.10 as shipped: its Llama 4 tower's MLPs take nn.GELU(approx="fast"),
    x sigmoid(1.702 x), where transformers' take the exact GELU; located at the first MLP's activation
    and named, every stage before it (its own unfold, the class token last, its rotation a complex
    array no module holds) within its tolerance."""
    from tests.data.mlx_vlm_llama4_port import port

    report = verify(port, LLAMA4, cases=quick_cases(LLAMA4))
    assert report.first_divergence == "blocks.0.mlp.act", format_report(report)
    assert report.diagnosis.named == "quick_gelu", format_report(report)
    before = [s.name for s in report.stages][: [s.name for s in report.stages].index("blocks.0.mlp.act")]
    assert len(before) == 11 and all(s.ok for s in report.stages if s.name in before), format_report(report)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_mlx_vlm_llama4_tower_with_transformers_gelu_is_conformant(dtype):
    """The companion: the same tower with the exact GELU in each block, as transformers builds it."""
    from tests.data.mlx_vlm_llama4_port import gelu_as_transformers

    report = verify(gelu_as_transformers, LLAMA4, cases=quick_cases(LLAMA4), dtype=dtype)
    assert report.conformant and len(report.stages) == 26, format_report(report)


def test_a_towers_gradient_is_exit_2_naming_what_lies_after_it():
    """verify --grad on a tower port: the model's loss differentiates what it returns, after its tower
    (Llama 4's pixel shuffle and adapter), which the reference has no part for: exit 2 naming it, not
    NOT CONFORMANT at the cotangent of norm (as it was). Its forward is judged, above."""
    from tests.data.hf_llama4_port import port

    with pytest.raises(CannotJudge, match=r"tower='norm'.*\(pooled, logits out of scope\)"):
        port.make_grad(LLAMA4, quick_cases(LLAMA4)[0].state)


def test_a_tower_the_config_cannot_express_says_its_parameters_after_the_tower_wait_for_the_rest():
    """Llama 4's tower under a config without its rotation: exit 2 naming rope_type, and its adapter's
    parameters (after the tower: set apart only once the model runs) said to be so, not told as a part
    the tower lacks. With the rotation declared it is conformant, the adapter out of scope (above)."""
    from tests.data.hf_llama4_port import SUPPORTS, port

    config = LLAMA4.replace(rope_type=None, rope_grid_indexing="ij", rope_grid_offset=0.0)
    unrotated = replace(port, supports={k: v for k, v in SUPPORTS.items() if not k.startswith("rope")})
    with pytest.raises(NotExpressible) as e:
        unrotated(config, quick_cases(config)[0].state)
    lines = str(e.value).splitlines()[1:]
    assert len(lines) == 2 and "rope_type" in lines[0], str(e.value)
    assert "set apart once the rest is expressed) (vision_adapter.mlp.fc1.weight" in lines[1]


def test_the_tools_cast_keeps_a_complex_buffer_complex():
    """Llama 4's rotation, freqs_ci (complex64, persistent=False), through the tool's cast to bfloat16:
    as the model built it (cast to a real dtype it kept the cosines alone, and the correct tower was
    NOT CONFORMANT at blocks.0.attn.q_rope, 1e6 x the tolerance, for the tool's cast). The companion:
    the model's own .to(dtype) drops the imaginary part."""
    import torch

    from tests.data.hf_llama4_port import build

    model = build(LLAMA4)
    built = model.rotary_embedding.freqs_ci.clone()
    cast_as_loaded(model, torch.bfloat16)
    assert model.patch_embedding.linear.weight.dtype == torch.bfloat16
    assert torch.equal(model.rotary_embedding.freqs_ci, built)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's warning that the cast discards the imaginary part
        model.to(torch.float32)
    assert not model.rotary_embedding.freqs_ci.is_complex()
