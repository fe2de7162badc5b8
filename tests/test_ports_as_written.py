"""Third-party ViTs as their authors wrote them (lucidrains' vit-pytorch and x-transformers,
transformers' DeiT and BEiT's attention and LayerScale), unmodified: CONFORMANT with the options
that express them, their bugs located, and not expressible (exit 2, a line per option) with the
default config."""

import pytest

from conformance.capture import ModelPort
from conformance.verify import format_report, verify
from impls import get_config
from weights import init_state
from tests.capture_cases import config_for, quick_cases


VIT_PYTORCH = {
    "vit_cls": "VIT_CLS",  # each model of vit-pytorch, and the options that express it
    "vit_mean": "VIT_MEAN",
    "simple": "SIMPLE",
}


@pytest.mark.parametrize("name", list(VIT_PYTORCH))
def test_vit_pytorch_models_unmodified_are_conformant_and_their_bugs_located(name):
    """lucidrains' ViT (pool 'cls' and 'mean') and SimpleViT, unmodified, with the options that
    express them (a norm on the raw patches flattened (p1 p2 c) and one after the Linear
    projection, a fixed sin-cos table, the attention output without bias beside an MLP with
    biases): every stage read from modules as the author wrote them (each block an
    nn.ModuleList([Attention, FeedForward]) whose residuals the parent adds) and within its
    bound. The companions: the attention scale doubled in block 0 is located at its weights, one
    LayerNorm shared by both branches at block 0's norm1."""
    import conformance.examples.vit_pytorch_port as V

    config = get_config("vit_test_token").replace(**getattr(V, VIT_PYTORCH[name]))
    report = verify(getattr(V, name), config, cases=quick_cases(config))
    assert report.conformant and len(report.stages) == 27 and report.unseen == {}, format_report(report)
    bug = verify(getattr(V, f"{name}_scale_bug"), config, cases=quick_cases(config))
    assert bug.first_divergence == "blocks.0.attn.weights", format_report(bug)
    shared = verify(getattr(V, f"{name}_shared_norm"), config, cases=quick_cases(config))
    assert shared.first_divergence == "blocks.0.norm1", format_report(shared)


@pytest.mark.parametrize("name", list(VIT_PYTORCH))
def test_vit_pytorch_models_in_bfloat16_are_conformant(name):
    import conformance.examples.vit_pytorch_port as V

    config = get_config("vit_test_token").replace(**getattr(V, VIT_PYTORCH[name]))
    report = verify(getattr(V, name), config, cases=quick_cases(config), dtype="bfloat16")
    assert report.conformant and len(report.stages) == 27, format_report(report)


@pytest.mark.parametrize(
    "name, lines",
    [
        ("vit_cls", ("qkv_bias=false", "patch_norm=true", "embed_norm=true")),
        (
            "simple",
            (
                "proj_bias=false with mlp_bias=true",
                "class_token=false",
                "pos_embed='sincos'",
                "qkv_bias=false",
                "patch_norm=true",
                "embed_norm=true",
            ),
        ),
    ],
)
def test_a_vit_pytorch_model_on_the_default_config_is_not_expressible_one_line_per_option(name, lines):
    """Without the options, exit 2 (NotExpressible), never NOT CONFORMANT at load: one line per
    option the model needs, each naming it, and no line left over about unfilled parameters."""
    from conformance.capture.expressible import NotExpressible
    import conformance.examples.vit_pytorch_port as V

    build, rename = (V.vit, V.VIT_RENAME) if name == "vit_cls" else (V.simple_vit, V.SIMPLE_RENAME)
    config = get_config("vit_test_token")
    with pytest.raises(NotExpressible) as e:
        ModelPort(build, rename=rename, patch_order="p1 p2 c")(config, init_state(config))
    body = str(e.value).splitlines()[1:]
    assert len(body) == len(lines) and all(sum(want in line for line in body) == 1 for want in lines), str(e.value)
    assert not any("no canonical key fills" in line for line in body), str(e.value)


def test_transformers_deit_with_teacher_unmodified_is_conformant_and_its_bugs_located():
    """DeiTForImageClassificationWithTeacher (the distillation token, two classifiers, the logits
    their mean) with distilled=True: conformant in float32 and bfloat16 with every stage read
    but the attention weights (computed inside F.scaled_dot_product_attention); the attention
    scale doubled in block 0 is located at its output, a LayerNorm shared by block 0's branches
    at its norm1."""
    from conformance.examples.hf_vit import deit_port
    from tests.data.hf_deit_ports import scale_bug_port, shared_norm_port

    config = config_for(deit_port, get_config("vit_test_distilled"))
    for dtype in ("float32", "bfloat16"):
        report = verify(deit_port, config, cases=quick_cases(config), dtype=dtype)
        assert report.conformant and len(report.stages) == 24, format_report(report)
        assert {"pooled", "pooled_dist", "logits"} <= {s.name for s in report.stages}
    assert verify(scale_bug_port, config, cases=quick_cases(config)).first_divergence == "blocks.0.attn"
    assert verify(shared_norm_port, config, cases=quick_cases(config)).first_divergence == "blocks.0.norm1"


def test_deit_on_a_config_without_its_distillation_token_is_not_expressible():
    from conformance.capture.expressible import NotExpressible
    from conformance.examples.hf_vit import build_deit, deit_convert

    config = get_config("vit_test_token_square")
    with pytest.raises(
        NotExpressible, match=r"distilled=true expresses it \(dist_token, head_dist.weight, head_dist.bias\)"
    ):
        ModelPort(build_deit, convert=deit_convert)(config, init_state(config))


def test_a_k_projection_without_bias_is_conformant_and_only_because_the_softmax_removes_it(monkeypatch):
    """A model whose k projections have no bias (BEiT's) computes timm's function whatever b_k is:
    CONFORMANT, its k tap compared with b_k added back. The companion: the same model judged with
    its k taps as they are is NOT CONFORMANT at block 0's k, which is what the equivalence covers."""
    from tests.data.k_bias_free_port import port

    config = config_for(port, get_config("vit_test_token_square"))
    report = verify(port, config, cases=quick_cases(config))
    assert report.conformant and report.unseen.keys() <= {f"blocks.{i}.attn.weights" for i in range(2)}, format_report(
        report
    )
    assert "plus the k bias" in report.to_dict()["sources"]["blocks.0.attn.k"]
    monkeypatch.setattr(ModelPort, "_k_bias_free", lambda self, state, config: [])
    assert verify(port, config, cases=quick_cases(config)).first_divergence == "blocks.0.attn.k"


def test_layerscale_held_as_bare_parameters_of_the_block_is_not_read_as_the_blocks_output():
    """transformers' BEiT (without its relative position bias) keeps LayerScale as lambda_1 and
    lambda_2, parameters of the layer itself: ls1 and ls2 are unseen, said why, not the layer's
    output judged as theirs (2e14x before), and the model, its k projection without bias too, is
    CONFORMANT. The companion: the two gammas swapped by the convert are caught at the first stage
    after ls1 that is read."""
    from dataclasses import replace

    from tests.data.hf_beit_port import convert, port

    config = config_for(port, get_config("vit_test_token_square")).replace(norm_eps=1e-12)
    report = verify(port, config, cases=quick_cases(config))
    assert report.conformant, format_report(report)
    assert "bare parameters" in report.unseen["blocks.0.ls1"] and "blocks.1.ls2" in report.unseen

    def swapped(state):
        out = convert(state)
        for i in range(config.depth):
            a, b = f"beit.layers.{i}.lambda_1", f"beit.layers.{i}.lambda_2"
            out[a], out[b] = out[b], out[a]
        return out

    bug = verify(replace(port, convert=swapped), config, cases=quick_cases(config))
    assert bug.first_divergence == "blocks.0.norm2", format_report(bug)


def test_x_transformers_vit_unmodified_is_conformant_and_its_bugs_located():
    """x-transformers' ViTransformerWrapper: bias-free norms (a LayerNorm without affine, times a
    gamma) on the raw patches, after the projection and in every block; each block two entries
    of one ModuleList whose residuals the Encoder adds, so no module holds a block: q, k and v are
    read from its to_q, to_k and to_v, the weights and the block outputs unseen, said why. 22
    stages in float32 and bfloat16; the attention scale doubled in block 0 is located at its
    output, a LayerNorm shared by its two branches at its norm1. On the default config: one line
    per option the model needs."""
    from conformance.capture.expressible import NotExpressible
    from tests.data.x_transformers_port import port, scale_bug_port, shared_norm_port

    config = config_for(port, get_config("vit_test_token_square"))
    for dtype in ("float32", "bfloat16"):
        report = verify(port, config, cases=quick_cases(config), dtype=dtype)
        assert report.conformant and len(report.stages) == 22, format_report(report)
    assert verify(scale_bug_port, config, cases=quick_cases(config)).first_divergence == "blocks.0.attn"
    assert verify(shared_norm_port, config, cases=quick_cases(config)).first_divergence == "blocks.0.norm1"
    default = get_config("vit_test_token_square")
    with pytest.raises(NotExpressible) as e:
        ModelPort(port.build, convert=port.convert, patch_order="p1 p2 c")(default, init_state(default))
    lines = str(e.value).splitlines()[1:]
    wanted = (
        "patch_norm=true",
        "embed_norm=true",
        "mlp_bias=true",
        "qkv_bias=false",
        "norm_bias=false",
        "class_token=false",
    )
    assert len(lines) == len(wanted) and all(sum(w in line for line in lines) == 1 for w in wanted), str(e.value)
