"""Quantized ports (docs/quantization.md): their packed weights decoded as each framework's own
dequantize does, kernel exactness on those weights, the cost against the float model, and
quantizer bugs located and named (the zoo's quantized mutants: test_zoo)."""

import warnings

import numpy as np
import pytest

from conformance.capture import ModelPort
from conformance.capture.quantized import mlx_weight, pack, torch_weight, unpack
from conformance.examples import quantized as examples
from conformance.numerics.compare import compare_outputs
from conformance.numerics.error_model import CaseModel
from conformance.profiles import heavy
from conformance.verify.cases import default_cases
from conformance.verify.forward import verify
from conformance.verify.quantized import quantization_cost
from conformance.commands.calibrate_quantized import SETTINGS
from impls import get_config

CONFIG = get_config("vit_test_quantized")


@pytest.mark.parametrize("mode, bits, group", SETTINGS, ids=lambda v: str(v))
def test_the_numpy_decoding_equals_mlx_dequantize_in_every_mode_and_width(mode, bits, group):
    import mlx.core as mx

    w = np.random.default_rng(bits).standard_normal((8, 128)).astype(np.float32)
    stored = mx.quantize(mx.array(w), group_size=group, bits=bits, mode=mode)
    mine = mlx_weight(*(np.array(a) for a in stored[:2]), np.array(stored[2]) if mode == "affine" else None,
                      group, bits, mode).value  # fmt: skip
    theirs = np.array(mx.dequantize(*stored, group_size=group, bits=bits, mode=mode).astype(mx.float32))
    # MLX dequantizes affine codes as scale * code + bias in float32: a rounding of |scale code| + |bias|
    assert np.allclose(mine, theirs, rtol=0, atol=2**-23 * np.abs(theirs).max())
    assert not np.array_equal(np.roll(mine, 1, -1), theirs)  # (a decoding that is off is seen)


def test_pack_and_unpack_are_inverse_in_every_width():
    for bits in (1, 2, 3, 4, 5, 6, 8):
        codes = np.random.default_rng(bits).integers(0, 2**bits, (3, 64))
        assert np.array_equal(unpack(pack(codes, bits), bits, 64), codes)


@pytest.mark.filterwarnings("ignore:torch.quantize_per")
@pytest.mark.parametrize("per_channel", [False, True])
def test_the_numpy_decoding_equals_torch_dequantize(per_channel):
    import torch

    w = torch.randn(16, 32)
    q = (
        torch.quantize_per_channel(w, w.abs().amax(1) / 127, torch.zeros(16, dtype=torch.long), 0, torch.qint8)
        if per_channel
        else torch.quantize_per_tensor(w, float(w.abs().max()) / 127, 0, torch.qint8)
    )
    theirs = q.dequantize().double().numpy()  # scale * (code - zero point), in float32
    assert np.allclose(torch_weight(q).value, theirs, rtol=2**-23, atol=0)
    assert not np.allclose(torch_weight(q).value[:, ::-1], theirs, rtol=2**-23, atol=0)


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_the_numpy_decoding_equals_torchaos_dequantize():
    import torch
    from torchao.quantization import Int8WeightOnlyConfig, quantize_

    from conformance.capture.quantized import torchao_weight

    model = torch.nn.Sequential(torch.nn.Linear(64, 32))
    quantize_(model, Int8WeightOnlyConfig())
    theirs = model[0].weight.dequantize().double().numpy()  # code * scale, in float32
    mine = torchao_weight(model[0].weight, "0").value
    assert np.allclose(mine, theirs, rtol=2**-23, atol=0) and not np.allclose(mine[::-1], theirs, rtol=2**-23, atol=0)


# in ci one port of each kernel: MLX's quantized_matmul and torch.ao's dynamic Linear (the 8-bit
# port's weights are the zoo's quantized mutants', torchao's decoding is checked above)
THOROUGH = pytest.mark.skipif(not heavy(), reason="thorough profile: ci verifies one port of each kernel")


@pytest.mark.parametrize(
    "example",
    [
        "mlx_image_4bit",
        pytest.param("mlx_image_8bit", marks=THOROUGH),
        "timm_int8",
        pytest.param("timm_torchao_int8", marks=THOROUGH),
    ],
)
def test_a_quantized_port_is_kernel_exact_and_its_cost_is_tabled(example):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # torch.ao's quantization API
        warnings.simplefilter("ignore", UserWarning)  # torchao's registrations
        report = verify(getattr(examples, example), CONFIG, port=example)
    assert report.conformant, report.failures[:2] or [(s.name, s.ratio) for s in report.stages if not s.ok][:3]
    assert len([s for s in report.stages if s.ok]) >= 20
    cost = report.quantization["cost"]
    assert set(cost) == {s.name for s in report.stages}
    reading = {"blocks.0.attn.q", "blocks.0.attn.k", "blocks.0.attn.v", "blocks.0.attn", "blocks.0.mlp.act"}
    assert reading <= {s for s, r in cost.items() if r["ratio"] is not None} and cost["embed"]["ratio"] is None


def test_the_cost_falls_by_about_six_decibels_a_bit():
    """The cost is the quantization's: 8 bits in groups of 32 against 4 in groups of 64, on the same
    case, at the first stage that reads a quantized weight (uniform rounding: 6.02 dB a bit)."""
    case = default_cases(CONFIG)[0]
    sqnr = {}
    for bits, port in ((4, examples.mlx_image_4bit), (8, examples.mlx_image_8bit)):
        out = port(CONFIG, case.state)(case.images)
        rows = {r["stage"]: r for r in quantization_cost(out, case, CONFIG, "float32")}
        sqnr[bits] = rows["blocks.0.attn.q"]["sqnr_db"]
    assert 20 < sqnr[8] - sqnr[4] < 30, sqnr


def test_the_kernel_verdict_is_not_the_float_one():
    """The companion: a quantized port's stages are far from the float oracle's rounding bounds
    (so that judging them on its own weights is what makes it conformant)."""
    case = default_cases(CONFIG)[0]
    out = examples.mlx_image_4bit(CONFIG, case.state)(case.images)
    results = compare_outputs(out, CaseModel(CONFIG, case.state, case.images))
    assert sum(not r.ok for r in results) >= 15


def test_a_kernel_that_drops_the_zero_point_is_located_where_it_computes():
    """A kernel bug, not a weight's: each QuantizedLinear computes without its biases; the weights
    read back are right, the stage computed from them is not."""

    def quantize(model):
        import mlx.nn as nn

        nn.quantize(model, group_size=64, bits=4)
        for _, m in model.named_modules():
            if isinstance(m, nn.QuantizedLinear):
                m.__class__ = type("NoZeroPoint", (nn.QuantizedLinear,), {"__call__": _without_biases})

    from dataclasses import replace

    report = verify(replace(examples.mlx_image_4bit, quantize=quantize), CONFIG, port="no zero point")
    assert not report.conformant and report.located() == "blocks.0.attn.q", report.located()
    assert report.separation() > 100


def _without_biases(self, x):
    import mlx.core as mx

    y = mx.quantized_matmul(x, self["weight"], scales=self["scales"], biases=mx.zeros_like(self["biases"]),
                            transpose=True, group_size=self.group_size, bits=self.bits)  # fmt: skip
    return y + self["bias"] if "bias" in self else y


def test_a_quantized_timm_model_with_a_bug_is_located_at_it():
    from dataclasses import replace

    from conformance.examples import timm_vit

    port = replace(examples.timm_int8, build=lambda c: timm_vit.build(c.replace(norm_eps=1e-5)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        report = verify(port, CONFIG, port="timm int8, eps 1e-5", cases=default_cases(CONFIG)[:1])
    assert report.located() == "blocks.0.norm1"


def test_a_model_quantized_by_build_is_exit_2_naming_the_quantize_route():
    import mlx.nn as nn

    from conformance.capture.adapters import QuantizedNotTaken
    from conformance.examples import mlx_image_vit

    def build(config):
        model = mlx_image_vit.build(config)
        nn.quantize(model)
        return model

    port = ModelPort(build, convert=mlx_image_vit.convert, images="NHWC", supports=mlx_image_vit.SUPPORTS)
    with pytest.raises(QuantizedNotTaken, match=r"ModelPort\(quantize=\.\.\.\)"):
        port(CONFIG, default_cases(CONFIG)[0].state)


def test_the_command_line_names_a_quantizer_bug_and_prints_the_cost(cli):
    code, out, err = cli(
        "verify", "conformance.zoo.quantized_mutants:zero_point_dropped", "--preset", "vit_test_quantized"
    )
    assert code == 1, out + err
    assert "its zero point (bias) dropped" in out and "SQNR dB" in out, out
    assert "NOT CONFORMANT: first divergent stage blocks.0.attn.q" in out, out


def _coarse(model):
    """nn.quantize, then each group's scale 225 times the format's, its codes chosen on that grid (all 0)."""
    import mlx.core as mx
    import mlx.nn as nn

    nn.quantize(model, group_size=64, bits=4)
    for _, m in model.named_modules():
        if isinstance(m, nn.QuantizedLinear):
            m.scales, m.weight = m.scales * 225, mx.zeros_like(m.weight)


def test_a_grid_too_coarse_to_hold_the_float_weights_is_a_finding():
    """A quantizer with wrong scales (x225: every code 0, SQNR -8.6 dB) is consistent on its own
    coarse grid: its half steps are taken at the format's documented scale, so the weights lie
    beyond them and the cost ratio counts against that (the correct 4-bit port: above, conformant)."""
    from dataclasses import replace

    port = replace(examples.mlx_image_4bit, quantize=_coarse)
    report = verify(port, CONFIG, port="scales x225", cases=default_cases(CONFIG)[:1])
    assert not report.conformant and report.located() == "blocks.0.attn.q", report.located()
    reasons = " ".join(f["reason"] for f in report.failures)
    assert "grid's scale is up to 22" in reasons and "what its weights' half steps explain" in reasons, reasons[:300]


@pytest.mark.filterwarnings("ignore:torch.quantize_per")
def test_a_weight_moved_by_five_percent_is_not_named_as_a_dropped_zero_point():
    """The class 'each group off by one constant' fits any move where a group is one weight: torch's
    groups are its rows (per channel) or the whole tensor, and 1.05 w is no constant per group."""
    import torch

    from conformance.capture.quantized import ZERO_POINT_DROPPED

    w = torch.randn(16, 64, generator=torch.Generator().manual_seed(0))
    moved = torch.quantize_per_channel(1.05 * w, 1.05 * w.abs().amax(1) / 127.5, torch.zeros(16, dtype=torch.long),
                                       0, torch.qint8)  # fmt: skip
    read = torch_weight(moved)
    assert read.group_size == 64 and not read.fits(w.double().numpy(), "float32")
    assert read.explain(w.double().numpy(), "float32") is None
    # the companion: each row off by its own constant (a zero point dropped) is named
    shift = torch.arange(16.0)[:, None] * 0.5
    stored = torch.quantize_per_channel(w, w.abs().amax(1) / 127.5, torch.zeros(16, dtype=torch.long), 0, torch.qint8)
    dropped = torch_weight(stored)
    assert dropped.explain((w + shift).double().numpy(), "float32") == ZERO_POINT_DROPPED


@pytest.mark.parametrize("returned", [("model",), "model"], ids=["tuple", "string"])
def test_a_quantize_step_that_returns_no_model_is_exit_2_naming_quantize(returned):
    """quantize= returning a tuple or a string is the user's input, named (not 'module system not
    taken', not a finding); the companion: a step returning None (in place) runs, above."""
    from dataclasses import replace

    from conformance.report import UsageError

    def quantize(model):
        examples.mlx_image_4bit.quantize(model)
        return returned

    port = replace(examples.mlx_image_4bit, quantize=quantize)
    with pytest.raises(UsageError, match=r"ModelPort\(quantize=\.\.\.\) returned a (tuple|str)"):
        port(CONFIG, default_cases(CONFIG)[0].state)
    with pytest.raises(UsageError, match=r"returned a (tuple|str)"):  # through verify: exit 2, not a finding
        verify(port, CONFIG, cases=default_cases(CONFIG)[:1])


@pytest.mark.parametrize(
    "name, error, message",
    [
        ("quantize_step", "Unsupported", r"hold integer weights the reader does not know \(blocks.0.attn.qkv \(Int8Linear: weight int8\)"),
        ("quantized_in_build", "QuantizedNotTaken", r"hold quantized weights \(blocks.0.attn.qkv \(Int8Linear: weight int8\).*quantize="),
    ],
)  # fmt: skip
def test_a_hand_written_int8_linear_is_exit_2_naming_the_module(name, error, message):
    """A quantized Linear of no known class or format (int8 codes and a float scale per row, its own
    forward): the tool cannot judge it (Unsupported, QuantizedNotTaken: exit 2) and names the module
    and its integer weight, not a finding at load ('quantized nothing', or float weights copied into
    int8 buffers). The companion: torch.ao's int8 Linear in the same place is read and judged
    (test_a_quantized_port_is_kernel_exact_and_its_cost_is_tabled)."""
    from conformance.report import CannotJudge
    from conformance.support import Unsupported
    from tests.data import hand_quantized_ports

    with pytest.raises((Unsupported, CannotJudge), match=message) as info:
        getattr(hand_quantized_ports, name)(CONFIG, default_cases(CONFIG)[0].state)
    assert type(info.value).__name__ == error


def test_a_stage_of_few_roundings_is_not_judged_on_its_cost_ratio():
    """The property suite drew mlx-image's correct 4-bit ViT with one class (seed 138): its logits
    of one image are one number, whose ratio (3.97) is one rounding realisation over three noise
    draws, F(1, 3)'s tail beyond the tolerance 6.6 %; and timm's torchao int8 ViT 2 wide, whose
    projection's 18 outputs come from 4 weights' roundings (4.3), and 6 wide, whose head's 12 logits
    over three like images vary along about two directions (3.15). Stages under COST_MIN_ELEMENTS
    roundings show their ratio, unjudged; the companion: the same ratio over twelve is a finding."""
    from conformance.verify.drawn import check_verified
    from conformance.verify.quantized import COST_MIN_ELEMENTS, cost_tolerance, costs_too_much

    config = CONFIG.replace(img_size=8, num_classes=1, embed_dim=128, num_heads=1, mlp_ratio=1.0)
    check_verified("mlx_image_4bit", examples.mlx_image_4bit, config, seed=138, packed=False)
    narrow = get_config("vit_test_token").replace(
        img_size=(16, 14), patch_size=(4, 7), num_classes=3, global_pool="avg", class_token=True,
        embed_dim=2, depth=2, num_heads=1, mlp_ratio=2.0, qkv_bias=True, proj_bias=True,
    )  # fmt: skip
    six = narrow.replace(img_size=(15, 6), patch_size=(5, 3), in_chans=2, num_classes=4, global_pool="token",
                         embed_dim=6, depth=1, num_heads=3, mlp_ratio=4.0)  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        check_verified("timm_torchao_int8", examples.timm_torchao_int8, narrow, seed=2, packed=False)
        check_verified("timm_torchao_int8", examples.timm_torchao_int8, six, seed=1746, packed=False)
    row = {"ratio": 1.4 * cost_tolerance(), "roundings": 1}
    assert not costs_too_much(row) and costs_too_much({**row, "roundings": COST_MIN_ELEMENTS})
