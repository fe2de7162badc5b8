"""Models verified as their authors wrote them (conformance.capture): weights through the
user's own mapping, every stage read from outside the model, what cannot be seen listed with
its reason; the examples (timm, transformers, mlx-image, Flax NNX, the seed posts' ViTs) are
verified unmodified and the buggy ones located at their bugs."""

import base64
import dataclasses
import re
import hashlib
import json
import sys
from pathlib import Path

import numpy as np
import pytest

from conformance.capture import LoadError, ModelPort, rename_function
from conformance.profiles import heavy
from conformance.support import Unsupported, build_config
from conformance.verify import verify
from impls import get_config, tap_names
from weights import init_state
from conformance.tests.helpers import DATA_DIR
from tests.capture_cases import config_for, example, quick_cases

DATA = DATA_DIR

# example -> the stage it is located at (None: conformant), and the stages it cannot show per block
EXAMPLES = {
    "timm_vit:port": (None, {"attn.weights"}),
    "timm_vit:explicit": (None, set()),
    "hf_vit:port": (None, {"attn.weights"}),
    "hf_vit:model_port": (None, {"attn.weights"}),
    "mlx_image_vit:port": (None, set()),
    "nnx_vit:port": (None, {"attn.weights"}),
    "nnx_vit:fast_variance_port": ("blocks.0.norm1", {"attn.weights"}),
    "linen_vit:port": (None, set()),
    "linen_vit:fast_variance_port": ("blocks.0.norm1", set()),
    "seed_mlx_vit:port": ("blocks.0.mlp.act", set()),
    "seed_mlx_vit:shared_norm_port": ("blocks.0.norm2", set()),
    "seed_einops_vit:port": ("blocks.0.attn.q", set()),
}


# The Flax examples run in one test, so one process compiles JAX's ops for them all. Capture
# runs them eagerly (XLA compiles each op once per shape): in ci linen's bug (it stands for the
# zoo's JAX fast-variance mutant there, test_zoo.WITNESSED); an NNX model as written is verified
# in ci by test_third_party (nnx_vit:mixed_port, bfloat16); the thorough profile runs all four.
FLAX = [name for name in EXAMPLES if name.startswith(("nnx_vit", "linen_vit"))]
FLAX_RUN = [name for name in FLAX if heavy() or name == "linen_vit:fast_variance_port"]


@pytest.mark.parametrize(
    "names",
    [[name] for name in EXAMPLES if name not in FLAX] + [FLAX_RUN],
    ids=lambda names: names[0] if len(names) == 1 else "flax",
)
def test_each_example_is_verified_unmodified_and_located_at_its_bug(names):
    for name in names:
        _check_example(name)


def _check_example(name):
    port = example(name)
    config = config_for(port)
    report = verify(port, config, port=name, cases=quick_cases(config))
    first, unseen_per_block = EXAMPLES[name]
    assert report.first_divergence == first, report.failures[:3] or [s for s in report.stages if not s.ok][:3]
    assert report.conformant is (first is None)
    unseen = {n.split(".", 2)[2] for n in report.unseen if n.startswith("blocks.")}
    assert unseen == unseen_per_block, report.unseen
    head_less = name == "hf_vit:model_port"
    assert ({"pooled", "logits"} <= set(report.unseen)) is head_less
    named = {s.name for s in report.stages} | set(report.unseen) | {f["stage"] for f in report.failures}
    assert named >= set(tap_names(config)), "every stage checked, listed as unseen or a finding"
    if first is not None:
        assert report.separation(first) is None or report.separation(first) > 100


def structure_of_vit_tiny():
    """ViT-Ti's structure (12 blocks, 3 heads, class token: 125 stages) at a width the CPU runs in
    no time; the stages a model shows depend on its structure, not its width."""
    return dataclasses.replace(get_config("vit_tiny_patch16_224"), img_size=(32, 32), embed_dim=12, name=None)


_JAX_COMPILES = pytest.mark.skipif(
    not heavy(),
    reason="thorough profile: JAX compiles each op of 12 more blocks "
    "(3 to 6 s); the structure rule is the same for all",
)
THIRD_PARTY = [
    "timm_vit:port",
    "hf_vit:port",
    "hf_vit:model_port",
    "mlx_image_vit:port",
    "torchvision_vit:port",
    pytest.param("nnx_vit:port", marks=_JAX_COMPILES),
    pytest.param("linen_vit:port", marks=_JAX_COMPILES),
]


@pytest.mark.parametrize("name", THIRD_PARTY)
def test_third_party_models_show_at_least_100_of_vit_tinys_125_stages(name):
    config = structure_of_vit_tiny() if not heavy() else get_config("vit_tiny_patch16_224")
    port = example(name)
    config = config_for(port, config)
    assert len(tap_names(config)) == 125
    out = port(config, init_state(config, seed=0))(np.zeros((1, 3, *config.img_size), np.float32))
    assert len(out) >= 100 and len(out) + len(out.unseen) == 125, (len(out), out.unseen)
    assert all(reason for reason in out.unseen.values())


def test_captured_taps_survive_a_model_that_adds_residuals_in_place(monkeypatch):
    sys.path.insert(0, str(DATA))
    try:
        from user_models import inplace_port
    finally:
        sys.path.remove(str(DATA))
    config = get_config("vit_test_token")
    assert verify(inplace_port, config, cases=quick_cases(config)).conformant
    # Companion: keep references instead of copies and `h += x` rewrites the attn tap.
    import conformance.capture.adapters as adapters

    monkeypatch.setattr(adapters.TorchAdapter, "copy", lambda self, x: x)
    report = verify(inplace_port, config, cases=quick_cases(config))
    assert report.first_divergence == "blocks.0.attn" and report.separation() > 1e6


def test_a_tap_override_reads_a_stage_the_interception_cannot_see():
    sys.path.insert(0, str(DATA))
    try:
        from user_models import nn_softmax_port, own_softmax_port
    finally:
        sys.path.remove(str(DATA))
    config = get_config("vit_test_token")
    seen = verify(nn_softmax_port, config, cases=quick_cases(config)[:1])  # mlx.nn.softmax: seen
    assert seen.conformant and not seen.unseen and seen.sources["blocks.1.attn.weights"] == "the softmax over keys"
    plain = verify(own_softmax_port, config, cases=quick_cases(config))
    assert plain.conformant and set(plain.unseen) == {"blocks.0.attn.weights", "blocks.1.attn.weights"}
    assert "no softmax" in plain.unseen["blocks.0.attn.weights"]
    given = verify(
        own_softmax_port.with_taps({"blocks.{i}.attn.weights": "layers.{i}.attend"}), config, cases=quick_cases(config)
    )
    assert given.conformant and not given.unseen and "blocks.1.attn.weights" in {s.name for s in given.stages}
    with pytest.raises(ValueError, match="no module 'layers.0.softmax'"):
        own_softmax_port.with_taps({"blocks.{i}.attn.weights": "layers.{i}.softmax"})(config, init_state(config))


def _mlx_example_port(**changes):
    sys.path.insert(0, str(DATA))
    try:
        import my_port
    finally:
        sys.path.remove(str(DATA))
    return dataclasses.replace(my_port.port, **changes)


@pytest.mark.parametrize(
    "rename, message",
    [
        ({"blocks": "blocks"}, "the mapping gives 24 key(s) the model does not have: 'blocks.0.ff_in.bias', "),
        (
            {"mlp.fc1": "ff_out", "mlp.fc2": "ff_in"},
            "shape mismatch(es): 'layers.0.ff_in.bias': mapped (24,), the model has (96,)",
        ),
        ({"head": None}, None),
        ({"pos_embed": None}, "it has no learned position table: pos_embed='sincos'"),
    ],
    ids=["missing-key", "wrong-shape", "head-dropped", "key-dropped"],
)
def test_a_mapping_that_does_not_fit_is_a_load_finding_naming_keys_and_shapes(rename, message):
    port = _mlx_example_port()
    port = dataclasses.replace(port, rename={**port.rename, **rename})
    config = get_config("vit_test_token")
    if message is None:  # the model's classifier left at its initial values: named, located at load
        report = verify(port, config, cases=quick_cases(config))
        assert any(
            "do not fill, left at the model's initial values: classifier.bias, classifier.weight" in f["reason"]
            for f in report.failures
        ), report.failures
        assert report.first_divergence == "load" and not report.conformant
        return
    from conformance.capture.expressible import NotExpressible

    if "position table" in message:  # the config names a part the model lacks: verify's exit 2, not a finding
        with pytest.raises(NotExpressible, match=re.escape(message)):
            verify(port, config, cases=quick_cases(config)[:1])
        return
    with pytest.raises(LoadError) as info:
        port(config, init_state(config))
    assert message in str(info.value)
    report = verify(port, config, cases=quick_cases(config)[:1])
    assert report.first_divergence == "load" and message in report.failures[0]["reason"]


def test_rename_tables_rename_segments_and_block_patterns():
    rename = rename_function({"blocks.{i}.norm1": "1.{i}.0.fn.0", "norm": "ln", "head": None})
    assert rename("blocks.3.norm1.weight") == "1.3.0.fn.0.weight"
    assert rename("norm.bias") == "ln.bias" and rename("blocks.0.norm2.bias") == "blocks.0.norm2.bias"
    assert rename("head.weight") is None


def test_a_rename_entry_never_renames_another_entry_s_output():
    """vit-pytorch's table: block 0's first norm becomes ``transformer.layers.0.0.norm``, and the
    final norm's entry must not rename that ``norm`` again. The companion: applied one entry
    after another on the key as rewritten, the table gave the key issue 42 found."""
    table = {"blocks.{i}.norm1": "transformer.layers.{i}.0.norm", "norm": "transformer.norm"}
    rename = rename_function(table)
    assert rename("blocks.0.norm1.bias") == "transformer.layers.0.0.norm.bias"
    assert rename("norm.bias") == "transformer.norm.bias"
    key = "blocks.0.norm1.bias"
    for old, new in table.items():  # the old way: each entry on what the last one wrote
        key = (
            key.replace("blocks.0.norm1", new.replace("{i}", "0"))
            if "{i}" in old
            else key.replace(".norm.", f".{new}.")
        )
    assert key == "transformer.layers.0.0.transformer.norm.bias"


def test_a_config_outside_what_the_port_supports_is_refused_naming_the_option():
    port = example("mlx_image_vit:port")
    with pytest.raises(Unsupported, match=r"img_size=\(16, 24\) \(supported: square images only\)"):
        verify(port, get_config("vit_test_token"))
    with pytest.raises(Unsupported, match="global_pool='avg'"):
        port(get_config("vit_test_avg"), init_state(get_config("vit_test_avg")))


def test_the_vendored_mlx_image_file_is_the_published_one():
    from conformance.examples import vendor

    body = (Path(vendor.__file__).parent / "mlxim_vit.py").read_bytes()
    digest = base64.urlsafe_b64encode(hashlib.sha256(body).digest()).rstrip(b"=").decode()
    assert digest == vendor.MLX_IMAGE_VIT_SHA256


def test_cli_verifies_an_attention_port_and_an_example_with_a_tap_override(cli, tmp_path):
    """``python -m conformance verify`` in this process (test_verify_checks also runs it as a subprocess)."""
    sys.path.insert(0, str(DATA))
    try:
        code, out, err = cli("verify", "--attention", "user_ports:correct_attention", "--json", tmp_path / "a.json")
        assert code == 0 and "CONFORMANT: all 2 stages" in out, out + err
        assert json.loads((tmp_path / "a.json").read_text())["config"]["num_heads"] == 2
        code, out, err = cli(
            "verify", "--attention", "user_ports:mean_of_values_attention", "--json", tmp_path / "b.json"
        )
        assert code == 1 and json.loads((tmp_path / "b.json").read_text())["first_divergence"] == "attn.weights", out
    finally:
        sys.path.remove(str(DATA))
    code, out, err = cli(
        "verify",
        "conformance.examples.seed_einops_vit:port",
        "--config",
        json.dumps(config_for(example("seed_einops_vit:port")).to_dict()),
        "--tap",
        "blocks.{i}.mlp.act=1.{i}.1.fn.1.1",
        "--json",
        str(tmp_path / "c.json"),
    )
    report = json.loads((tmp_path / "c.json").read_text())
    assert code == 1 and report["first_divergence"] == "blocks.0.attn.q", out + err
    assert report["sources"]["blocks.0.mlp.act"] == "output of 1.0.1.fn.1.1", report["sources"]
    # a square-only port gets vit_test_token's square twin by default, and a non-square config it is given refused
    code, out, err = cli("verify", "conformance.examples.mlx_image_vit:port", "--preset", "vit_test_token")
    assert code == 2 and "img_size=(16, 24) (supported: square images only)" in err, out + err
    code, out, err = cli("verify", "torch", "--tap", "norm=x")
    assert code == 2 and "--tap applies to a ModelPort" in err, out + err


def test_without_interception_q_k_v_come_from_the_projections(monkeypatch):
    """Where no attention call or product is seen (an operator the capture cannot wrap), q, k,
    v are read from separate projections with the heads split, or from a fused qkv split as
    timm's (3, H, hd); the weights are then unseen."""
    import conformance.capture.adapters as adapters

    monkeypatch.setattr(adapters.MLXAdapter, "patches", lambda self, recorder: [])
    for name, where in (
        ("mlx_image_vit:port", "output of encoder.layers.0.self_attention.query_proj, heads split"),
        ("seed_mlx_vit:port", "output of blocks.0.mhsa.qkv split as timm's (3, H, hd)"),
    ):
        port = example(name)
        config = config_for(port)
        report = verify(port, config, cases=quick_cases(config)[:1])
        assert report.sources["blocks.0.attn.q"].startswith(where), report.sources["blocks.0.attn.q"]
        assert "no softmax" in report.unseen["blocks.0.attn.weights"]
        assert report.first_divergence == EXAMPLES[name][0]


def test_a_rename_converts_layouts_by_module_type_even_where_shapes_cannot_tell():
    """A square Flax kernel (to_out, D x D) fits transposed or not, and so does an MLX conv
    weight when in_chans equals the patch size; the receiving module's type decides. The MLX
    model's rename table serves a Flax NNX model too (weight -> kernel or scale)."""
    sys.path.insert(0, str(DATA))
    try:
        from user_models import nnx_port, own_softmax_port
    finally:
        sys.path.remove(str(DATA))
    config = dataclasses.replace(get_config("vit_test_token"), img_size=(9, 12), patch_size=(3, 3), name=None)
    for port in (nnx_port, own_softmax_port):
        report = verify(port, config, cases=quick_cases(config)[1:2])
        assert report.conformant, (report.failures, [s for s in report.stages if not s.ok][:2])
        assert len(report.stages) >= 23


def test_drawn_configs_move_inside_what_a_port_supports():
    from conformance.support import unsupported_option

    drawn = dict(
        img_size=(12, 8),
        patch_size=(4, 2),
        in_chans=2,
        num_classes=3,
        global_pool="avg",
        class_token=False,
        embed_dim=8,
        depth=1,
        num_heads=2,
        mlp_ratio=2.0,
        qkv_bias=True,
    )
    for supports in (
        {"square_patches": True},
        {"square_images": True},
        {"global_pool": "token", "in_chans": 3},
        {"qkv_bias": (False,), "mlp_ratio": (1.0, 4.0)},
        "vit_test_token",
    ):
        config = build_config(supports, drawn)
        assert config is not None and unsupported_option(supports, config) is None, (supports, config)
    assert build_config({"depth": lambda d: d > 1}, drawn) is None  # a predicate rejects: the draw is discarded
    assert (
        unsupported_option({"square_images": True}, get_config("vit_test_token"))
        == "img_size=(16, 24) (supported: square images only)"
    )
    with pytest.raises(ValueError, match="unknown option"):
        unsupported_option({"pooling": "token"}, get_config("vit_test_token"))
    # a pair-valued option's pair is its one value (EVA02's ref_feat_shape), a tuple of pairs a choice
    eva = get_config("eva02_tiny_patch14_224")
    rope = {"rope_type": "cat", "k_bias": False, "mlp_layer": "swiglu_packed", "act_layer": "silu"}
    assert unsupported_option({**rope, "ref_feat_shape": (16, 16)}, eva) is None
    assert unsupported_option({**rope, "ref_feat_shape": ((8, 8), (16, 16))}, eva) is None
    assert (
        unsupported_option({**rope, "ref_feat_shape": (8, 8)}, eva) == "ref_feat_shape=(16, 16) (supported: ((8, 8),))"
    )
    assert build_config({**rope, "ref_feat_shape": (16, 16)}, {**drawn, "embed_dim": 16}).ref_feat_shape == (16, 16)


def test_each_adapter_is_named_by_the_import_path_of_the_module_system_it_reads():
    """docs/model.md's names: an adapter's name is a module path, and framework_of finds it from
    a model's class; a class from elsewhere is refused naming the module systems."""
    import importlib.util

    import torch

    from conformance.capture import ADAPTERS, framework_of

    assert sorted(ADAPTERS) == ["equinox", "flax.linen", "flax.nnx", "keras", "mlx.nn", "torch.nn"]
    assert all(importlib.util.find_spec(name) is not None for name in ADAPTERS)
    assert framework_of(torch.nn.Linear(2, 2)) == "torch.nn"
    from conformance.capture.adapters import ModuleSystemNotTaken

    with pytest.raises(ModuleSystemNotTaken, match="torch.nn, mlx.nn, flax.nnx, flax.linen"):
        framework_of(object())


def test_a_convert_s_arrays_meet_the_model_s_parameters_in_size_1_axes():
    """A convert that hands timm's model its class token as (1, 1, 1, D) and its position table
    as (N, D), in its own layouts but for axes of size 1, loads and is conformant. The companion:
    a convert whose array differs in more than size-1 axes is a shape finding naming the key."""
    from conformance.examples.timm_vit import build
    from conformance.capture import LoadError

    def convert(state):
        return {**state, "cls_token": state["cls_token"][None], "pos_embed": state["pos_embed"][0]}

    config = get_config("vit_test_token")
    assert verify(ModelPort(build, convert=convert), config).conformant

    def transposed(state):
        return {**state, "pos_embed": state["pos_embed"][0].T}

    with pytest.raises(LoadError, match=r"'pos_embed': mapped \(24, 25\), the model has \(1, 25, 24\)"):
        ModelPort(build, convert=transposed)(config, init_state(config))


def test_a_model_the_config_cannot_express_is_exit_2_with_a_line_per_part_and_its_option(cli):
    """timm's model without q, k, v biases and without a class token, against the default config
    (issue 42: it was NOT CONFORMANT at load). The companion: the config that names both parts
    makes the same model conformant."""
    code, out, err = cli("verify", "tests.data.unexpressed_ports:port", "--in-process")
    lines = err.strip().splitlines()
    assert code == 2 and out == "" and lines[0].startswith("the config cannot express this model:"), err
    assert lines[1:] == [
        "  its final norm comes after the pooling (timm's fc_norm): fc_norm=true expresses it (norm.bias, norm.weight)",
        "  its q, k and v projections have no bias: qkv_bias=false expresses it (blocks.{i}.attn.qkv.bias)",
        "  it has no class token: class_token=false (with global_pool='avg') expresses it (cls_token)",
    ]
    from conformance.report import UsageError
    from conformance.sandbox.isolated import Isolated
    from tests.data.unexpressed_ports import port

    # from the port's own process (as verify runs it) the answer keeps its label
    with pytest.raises(UsageError) as info:
        Isolated._check(None, {"status": "usage", "message": "m", "label": "the config cannot express this model"})
    assert info.value.label == "the config cannot express this model"
    config = get_config("vit_test_token").replace(qkv_bias=False, class_token=False, global_pool="avg")
    assert verify(port, config, cases=quick_cases(config)).conformant  # the same model, the config that names it


def test_a_convert_reading_a_key_the_config_moves_is_told_where_it_went():
    """Under average pooling timm has no final ``norm`` (it is ``fc_norm``, after the pooling): a
    convert written for token pooling reads ``norm.weight`` and used to end in a bare KeyError.
    The companion: a KeyError of the convert's own, not a canonical key, is left as it is."""
    from conformance.capture import LoadError
    from conformance.examples.timm_vit import build

    config = get_config("vit_test_avg")

    def convert(state):
        return {**state, "final": state["norm.weight"]}

    with pytest.raises(LoadError, match=r"'norm.weight'.*fc_norm.weight\) when global_pool='avg'"):
        ModelPort(build, convert=convert)(config, init_state(config))

    def own_bug(state):
        return {"renamed": {}["mine"]}

    with pytest.raises(KeyError, match="mine"):
        ModelPort(build, convert=own_bug)(config, init_state(config))


def test_a_parameter_with_no_elements_is_not_a_weight_left_unfilled():
    """vit-pytorch under mean pooling holds its class token as a (0, D) parameter: nothing to fill,
    never "left at the model's initial values". The companion: the same model with a (1, D)
    parameter the mapping does not fill is named."""
    import torch

    import impls
    from conformance.examples.timm_vit import build

    config = get_config("vit_test_avg")

    def with_extra(rows):
        def make(config):
            model = build(config)
            model.cls_like = torch.nn.Parameter(torch.zeros(rows, config.embed_dim))
            return model

        return ModelPort(make, rename={}, supports=impls.VIT_FAMILY)

    state = init_state(config)
    assert with_extra(0)(config, state).findings == []  # the load's findings, before any call
    (stage, reason), *_ = with_extra(1)(config, state).findings
    assert stage == "load" and "left at the model's initial values: cls_like" in reason


def _unexpressed(cli, port: str, *args) -> list[str]:
    """verify's answer for tests/data/unexpressed_ports.py's ``port``: exit 2, the config cannot
    express the model; its lines after the first (one a part)."""
    code, out, err = cli("verify", f"tests.data.unexpressed_ports:{port}", *args, "--in-process")
    lines = err.strip().splitlines()
    assert code == 2 and lines[0].startswith("the config cannot express this model:"), err
    return lines[1:]


def test_a_model_without_a_final_norm_is_exit_2_naming_final_norm_and_conformant_with_it(cli):
    """A tower that ends at its last block (timm's final_norm=False: InternViT, Pixtral) against
    the default config: one line, the final norm's weight and bias together, never a bias-free
    norm's advice (issue 60). The companion: final_norm=false makes the same model conformant."""
    lines = _unexpressed(cli, "no_final_norm")
    assert lines == ["  it has no final norm: final_norm=false expresses it (norm.bias, norm.weight)"]
    from tests.data.unexpressed_ports import no_final_norm

    config = get_config("vit_test_token").replace(final_norm=False)
    assert verify(no_final_norm, config, cases=quick_cases(config)).conformant


def test_a_final_norm_on_every_token_under_a_config_that_norms_after_the_pooling_is_exit_2_naming_fc_norm(cli):
    """global_pool='avg' takes timm's fc_norm by default (the norm after the pooling); a tower whose
    final norm acts on every token before it (SigLIP's, Idefics3's post_layernorm) is one line naming
    fc_norm=false and the module, never "it has no final norm" (the advice it had). The companion:
    fc_norm=false makes the same model conformant."""
    config = get_config("vit_test_token").replace(global_pool="avg", class_token=False)
    assert _unexpressed(cli, "norm_before_pooling", "--config", json.dumps(config.to_dict())) == [
        "  its final norm acts on every token, before the pooling (norm): fc_norm=false expresses it "
        "(fc_norm.bias, fc_norm.weight)"
    ]
    from tests.data.unexpressed_ports import norm_before_pooling

    fixed = config.replace(fc_norm=False)
    assert verify(norm_before_pooling, fixed, cases=quick_cases(fixed)).conformant


def test_q_k_and_v_projected_apart_under_a_config_that_fuses_them_is_exit_2_naming_qkv_fused(cli):
    """A model with three projections where the rename sends them (attn.q_proj, k_proj, v_proj) under
    the default config's one attn.qkv: one line naming qkv_fused=false, not a load finding (the
    mapping gives keys the model does not have). The companion: qkv_fused=false makes it conformant."""
    assert _unexpressed(cli, "qkv_apart") == [
        "  its q, k and v are projected apart (blocks.0.attn.q_proj, ...): qkv_fused=false expresses it "
        "(blocks.{i}.attn.qkv.bias, blocks.{i}.attn.qkv.weight)"
    ]
    from tests.data.unexpressed_ports import qkv_apart

    config = get_config("vit_test_token").replace(qkv_fused=False)
    assert verify(qkv_apart, config, cases=quick_cases(config)).conformant


def test_a_model_with_rmsnorm_is_exit_2_naming_norm_layer_and_conformant_with_it(cli):
    """timm's model with RmsNorm for its norms (AIMv2's) against the default config: one line naming
    norm_layer='rmsnorm' and the modules that show it, never a bias-free LayerNorm's advice (issue
    60: it was NOT CONFORMANT at patch_embed.norm). The companion: the config that says it makes the
    same model conformant."""
    code, out, err = cli("verify", "tests.data.unexpressed_ports:rms_norm", "--in-process")
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 2 and "norm_layer='rmsnorm'" in lines[1], err
    assert "RmsNorm" in lines[1] and "norm_bias" not in err, err
    from tests.data.unexpressed_ports import rms_norm

    config = get_config("vit_test_token").replace(norm_layer="rmsnorm")
    assert verify(rms_norm, config, cases=quick_cases(config)).conformant


def test_a_bias_free_patch_convolution_is_exit_2_naming_patch_bias_not_pre_norm(cli):
    """A patch convolution without a bias and no norm after it (Qwen2-VL's, Pixtral's before its
    ln_pre) against the default config: the line names patch_bias=false, never pre_norm=true, which
    would add a norm the model has not (issue 60). The companion: patch_bias=false makes the same
    model conformant."""
    code, out, err = cli("verify", "tests.data.unexpressed_ports:no_patch_bias", "--in-process")
    lines = err.strip().splitlines()
    assert code == 2 and lines[1:] == [
        "  its patch embedding has no bias: patch_bias=false expresses it (patch_embed.proj.bias)"
    ], err
    from tests.data.unexpressed_ports import no_patch_bias

    config = get_config("vit_test_token").replace(patch_bias=False)
    assert verify(no_patch_bias, config, cases=quick_cases(config)).conformant


def test_a_hierarchical_tower_is_exit_2_naming_its_widths_not_not_conformant_at_load(cli):
    """A tower whose width doubles between stages (Hiera, Swin, MViT), its weights named as timm's
    ViT's: the shapes that do not fit show the width changing across blocks, which one embed_dim
    cannot express: exit 2 (issue 60: NOT CONFORMANT at load, 15 shape mismatches). The companion:
    a mapping whose shapes do not fit one block alone stays a finding at load."""
    code, out, err = cli("verify", "tests.data.hierarchical_port:port", "--in-process")
    assert code == 2 and "its width changes across its blocks (block: width 0: 24, 1: 48" in err, out + err
    from conformance.capture.expressible import hierarchical

    config = get_config("vit_test_token")
    canonical = {f"layers.{i}.ln.weight": f"blocks.{i}.norm1.weight" for i in range(2)}
    assert hierarchical(canonical, {"layers.0.ln.weight": (24,), "layers.1.ln.weight": (48,)}, config) is not None
    assert hierarchical(canonical, {"layers.0.ln.weight": (24,), "layers.1.ln.weight": (24,)}, config) is None
