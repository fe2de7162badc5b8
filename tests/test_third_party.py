"""Ports as people wrote them, not as this project would: torchvision's ViT (nn.MultiheadAttention
on its native fast path), open_clip's tower (a final norm on the pooled token, headless), timm
under torch.autocast, a port more precise than its taps; and the tool's own failures told apart
from the port's. Each property has its companion: the same code with a real bug is located."""

import dataclasses

import numpy as np
import pytest

from conformance.capture import ModelPort
from conformance.profiles import heavy
from tests.capture_cases import config_for, example, quick_cases
from conformance.verify import default_config, load_config, verify
from impls import get_config, load_factory, tap_names
from conformance.tests.helpers import DATA_DIR

DATA = DATA_DIR
# ViT-Ti's depth, width and MLP on 32x32 images (16 patches); 4 heads instead of ViT-Ti's 3: torch
# takes MultiheadAttention's native fast path only with an even number of heads.
VIT_TI_SIZED = get_config("vit_tiny_patch16_224").replace(
    img_size=(32, 32), patch_size=(8, 8), num_heads=4, name="vit_tiny_patch16_224 at 32x32, 4 heads"
)


@pytest.mark.parametrize(
    "dtype",
    [
        "float32",
        pytest.param(
            "bfloat16",
            marks=pytest.mark.skipif(
                not heavy(),
                reason="thorough profile: a second 12-block oracle (6 s); ci runs timm's bfloat16 under autocast",
            ),
        ),
    ],
)
def test_torchvision_vit_is_conformant_unmodified_on_its_native_mha_path(dtype, monkeypatch):
    import torch

    native = torch._native_multi_head_attention
    calls = []
    monkeypatch.setattr(torch, "_native_multi_head_attention", lambda *a, **k: calls.append(1) or native(*a, **k))
    port = example("torchvision_vit:port")
    # ci: three cases in one batch shape (ordinary, trained-like, offset 1000) on four of its blocks
    # (the path is each block's); thorough: all ten cases on all twelve
    config = VIT_TI_SIZED if heavy() else VIT_TI_SIZED.replace(depth=4)
    cases = None if heavy() else quick_cases(config)
    report = verify(port, config, port="torchvision", cases=cases, dtype=dtype)
    assert report.conformant, report.failures[:3] or [s for s in report.stages if not s.ok][:3]
    assert len(report.stages) == len(tap_names(config)) - config.depth, [s.name for s in report.stages]
    # the kernel judged is the one users run: once per block per case on the model's own path
    assert len(calls) >= config.depth * len(report.cases), len(calls)
    assert set(report.unseen) == {f"blocks.{i}.attn.weights" for i in range(config.depth)}
    assert "native fast path" in report.unseen["blocks.0.attn.weights"]
    assert "second pass" in report.sources["blocks.0.attn.q"]  # which stage came from which pass


def test_torchvision_vit_reusing_ln_1_for_ln_2_is_located_at_norm2():
    port = example("torchvision_vit:shared_norm_port")
    config = config_for(port)
    report = verify(port, config, port="shared norm", cases=quick_cases(config)[:1])
    assert not report.conformant and report.first_divergence == "blocks.0.norm2", report.failures[:2]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_open_clip_tower_with_a_pooled_token_norm_is_compared_on_that_token(dtype):
    """In bfloat16 the scan pools every whole stage over the cases and passes over the norm given
    for one token (it once raised there, the tool's failure)."""
    port = example("open_clip_vit:pooled_norm_port")
    config = config_for(port)
    assert config.num_classes == 0 and config.pre_norm
    cases = quick_cases(config) if dtype == "float32" else None  # the scan runs on the held default cases
    report = verify(port, config, port="open_clip", cases=cases, dtype=dtype)
    assert report.conformant, report.failures[:3] or [s for s in report.stages if not s.ok][:3]
    norm = next(s for s in report.stages if s.name == "norm")
    assert norm.tokens and norm.tokens.startswith("token 0")
    # headless: its output is the pooled features, judged; nothing said about a dropped head
    assert {"pooled", "logits"} <= {s.name for s in report.stages}
    assert "pooled" not in report.unseen


def test_normalising_the_average_is_not_normalising_then_averaging():
    """The companion: a tower that averages the tokens and then norms, where the config norms
    every token and then averages, is located at norm with the reason."""
    port = example("open_clip_vit:avg_pool_norm_port")
    config = config_for(port)
    assert config.global_pool == "avg" and config.fc_norm is False
    report = verify(port, config, port="avg then norm", cases=quick_cases(config)[:1])
    assert report.first_divergence == "norm"
    assert any("another computation" in f["reason"] for f in report.failures if f["stage"] == "norm")


def test_a_headless_model_returning_tokens_is_told_to_give_its_pooled_output():
    port = dataclasses.replace(example("open_clip_vit:port"), output=lambda out: out[:, None].expand(-1, 5, -1))
    config = config_for(port)
    report = verify(port, config, port="tokens out", cases=quick_cases(config)[:1])
    assert report.first_divergence == "pooled"
    assert any("headless model's output is its pooled features" in f["reason"] for f in report.failures)


def test_timm_under_autocast_is_conformant_in_bfloat16_with_norms_judged_in_float32():
    report = verify(
        example("timm_vit:autocast_port"),
        get_config("vit_test_token"),
        port="autocast",
        dtype="bfloat16",
        policy="autocast",
    )
    assert report.conformant, report.failures[:3] or [s for s in report.stages if not s.ok][:3]
    stored = {s.name: s.stored for s in report.stages}
    assert stored["blocks.0.norm1"] == stored["blocks.0"] == stored["embed"] == "float32"
    assert stored["blocks.0.attn.q"] == stored["blocks.0.mlp"] == "bfloat16"


def test_timm_under_autocast_with_eps_1e5_is_located_at_norm1():
    report = verify(
        example("timm_vit:autocast_eps_1e5_port"), get_config("vit_test_token"), port="autocast eps", dtype="bfloat16"
    )
    assert report.first_divergence == "blocks.0.norm1", report.failures[:2]


def test_the_autocast_policy_finds_a_residual_stream_in_bfloat16():
    """The companion: a whole-bfloat16 model breaks --policy autocast at its first float32 stage."""
    report = verify(
        example("timm_vit:port"), get_config("vit_test_token"), port="all bf16", dtype="bfloat16", policy="autocast"
    )
    assert report.first_divergence == "embed"
    assert any("torch.autocast keeps" in f["reason"] for f in report.failures)


@pytest.fixture
def user_ports(monkeypatch):
    monkeypatch.syspath_prepend(str(DATA))
    import user_ports

    return user_ports


def test_a_port_more_precise_than_its_taps_is_conformant(user_ports):
    """Computing in float64 and emitting float32 taps: the residual's bound counts the summands'
    own rounding (before it, blocks.0 was 15x its unit bound here)."""
    report = verify(user_ports.precise, get_config("vit_test_token"), port="precise")
    assert report.conformant, report.failures[:3] or [s for s in report.stages if not s.ok][:3]
    assert next(s for s in report.stages if s.name == "blocks.0").mode == "local"


@pytest.mark.parametrize(
    "mutant, stage",
    [
        ("precise_shared_norm", "blocks.0.norm2"),
        ("precise_softmax_wrong_axis", "blocks.0.attn.weights"),
        ("precise_eps_1e5", "blocks.0.norm1"),
        ("precise_no_attn_residual", "blocks.0.norm2"),
    ],
)
def test_mutants_of_the_precise_port_are_located_at_their_own_stage(user_ports, mutant, stage):
    report = verify(getattr(user_ports, mutant), get_config("vit_test_token"), port=mutant)
    assert report.first_divergence == stage
    if mutant == "precise_no_attn_residual":  # the residual bug is seen at the block too
        assert not next(s for s in report.stages if s.name == "blocks.0").ok


def test_an_exception_inside_the_tool_is_its_own_exit_3_not_the_port_s(monkeypatch, capsys):
    from conformance import capture
    from conformance.commands.cli import main

    def broken(self, *args, **kwargs):
        raise IndexError("injected")

    monkeypatch.setattr(capture.CapturedForward, "_read", broken)  # this process: --in-process
    code = main(["verify", "conformance.examples.timm_vit:port", "--in-process"])
    err = capsys.readouterr().err
    assert code == 3
    assert "INTERNAL ERROR of vit-conformance" in err and "IndexError: injected" in err and "the port raised" not in err
    assert " in broken: " in err  # its last frames


def test_an_exception_inside_the_tool_in_the_port_s_process_is_its_own_exit_3(capsys):
    """Capture runs where the port does: its failure there comes back as the tool's, with the
    frames of the port's process."""
    from conformance.commands.cli import main

    code = main(["verify", "tests.data.hostile_tool_failure:port"])
    err = capsys.readouterr().err
    assert code == 3
    assert "INTERNAL ERROR of vit-conformance" in err and "IndexError: injected" in err and "the port raised" not in err
    assert "in the port's process:" in err and "in _broken" in err


def test_an_exception_in_a_recorder_hook_is_the_tool_s_even_inside_the_model(monkeypatch):
    from conformance.capture import recorder
    from conformance.report import ToolError

    monkeypatch.setattr(recorder.Recorder, "softmax", recorder.guarded(lambda self, out: 1 / 0))
    with pytest.raises(ToolError, match="ZeroDivisionError"):
        verify(example("timm_vit:explicit"), get_config("vit_test_token"), port="explicit")


def test_a_square_only_port_gets_a_square_default_config():
    port = example("torchvision_vit:port")
    config = default_config(port)
    assert config.img_size[0] == config.img_size[1] and config.name == "vit_test_token_square"
    assert default_config(example("timm_vit:port")).name == "vit_test_token"
    assert verify(port, config, port="tv", cases=quick_cases(config)[:1]).conformant


def test_set_overrides_a_preset_and_names_a_bad_field():
    from conformance.verify import UsageError

    config = load_config("vit_base_patch16_siglip_224", None, None, settings=["depth=2", "num_classes=0"])
    assert config.depth == 2 and config.num_classes == 0 and config.global_pool == "map"
    with pytest.raises(UsageError, match="--set detph: not a config field"):
        load_config("vit_base_patch16_siglip_224", None, None, settings=["detph=2"])
    with pytest.raises(UsageError, match="num_heads"):
        load_config("vit_base_patch16_siglip_224", None, None, settings=["num_heads=7"])


def test_siglip_preset_with_set_verifies_from_the_command_line(cli):
    # the MLX port: the command line is the same for every port, and its process imports no torch
    code, out, err = cli(
        "verify",
        "mlx",
        "--preset",
        "vit_base_patch16_siglip_224",
        "--set",
        "depth=1",
        "--set",
        "img_size=32",
        "--set",
        "embed_dim=48",
        "--set",
        "num_heads=2",
    )
    assert code == 0, out[-2000:] + err[-2000:]
    assert "CONFORMANT" in out


def test_convert_takes_the_config_positionally_and_build_the_dtype():
    from conformance.examples.hf_vit import convert

    seen = {}

    def build(config, dtype):
        from conformance.examples.hf_vit import build as hf_build

        seen["dtype"] = dtype
        return hf_build(config)

    config = get_config("vit_test_token").replace(img_size=(16, 16))
    port = ModelPort(
        build,
        convert=lambda state, c: (seen.setdefault("config", c), convert(state))[1],
        output=lambda out: out.logits,
        supports={"global_pool": "token", "square_images": True},
    )
    report = verify(port, config, port="positional", cases=quick_cases(config)[:1], dtype="float32")
    assert report.conformant and seen["config"] == config and seen["dtype"] == "float32"


def test_a_model_that_chooses_its_own_dtypes_keeps_them():
    """build(config, dtype=...) decides each parameter's precision: a torch model that keeps its
    LayerNorms in float32 under bfloat16 is loaded as built, and judged as stored."""
    from conformance.references import timm_vit

    def build(config, dtype):
        import torch

        model = timm_vit(config).to(getattr(torch, dtype))
        return model

    port = ModelPort(build, rename={}, supports=example("timm_vit:port").supports)
    forward = port(get_config("vit_test_token"), quick_cases(get_config("vit_test_token"))[0].state, "bfloat16")
    assert next(forward.adapter.model.parameters()).dtype.__repr__() == "torch.bfloat16"
    images = np.zeros((1, 3, 16, 24), np.float32)
    assert forward(images).dtypes["blocks.0.norm1"] == "bfloat16"


def test_mlx_multi_head_attention_shows_q_k_v_at_its_fused_call(monkeypatch):
    monkeypatch.syspath_prepend(str(DATA))
    import mlx_mha

    config = get_config("vit_test_token")
    report = verify(mlx_mha.port, config, port="mlx MHA", cases=quick_cases(config)[:1])
    assert report.conformant, report.failures[:3] or [s for s in report.stages if not s.ok][:3]
    assert "mx.fast.scaled_dot_product_attention" in report.sources["blocks.0.attn.q"]
    assert set(report.unseen) == {"blocks.0.attn.weights", "blocks.1.attn.weights"}


def test_the_plugin_s_set_fixes_a_field_in_every_drawn_config(monkeypatch):
    from conformance import plugin
    from conformance.support import build_config

    monkeypatch.setattr(plugin, "_SETTINGS", plugin.settings_of(["num_classes=0", "depth=1"]))
    supports = plugin._supports("torch")
    drawn = get_config("vit_test_deep")
    config = build_config(supports, {f: getattr(drawn, f) for f in drawn.__dataclass_fields__ if f != "name"})
    assert config.num_classes == 0 and config.depth == 1 and config.embed_dim == drawn.embed_dim
    with pytest.raises(pytest.UsageError, match="--set 'detph=1'"):
        plugin.settings_of(["detph=1"])


def test_a_sequence_first_multihead_attention_with_need_weights_shows_k_v_and_weights(monkeypatch):
    monkeypatch.syspath_prepend(str(DATA))
    import user_models

    config = get_config("vit_test_token")
    report = verify(user_models.seq_first_port, config, port="seq first", cases=quick_cases(config))
    assert report.conformant, report.failures[:3] or [s for s in report.stages if not s.ok][:3]
    checked = {s.name for s in report.stages}
    assert {"blocks.0.attn.k", "blocks.0.attn.v", "blocks.0.attn.weights", "blocks.0.attn"} <= checked
    assert "scaled inside F.multi_head_attention_forward" in report.unseen["blocks.0.attn.q"]
    assert "sequence first" in report.sources["blocks.0.norm1"]


def test_a_flax_model_built_for_bfloat16_keeps_float32_norms_and_is_judged_as_stored():
    """build(config, dtype=...): Flax's dtype= on the projections with float32 parameters and
    LayerNorms; loaded without a cast, judged stage by stage in the precision each was stored in."""
    port = example("nnx_vit:mixed_port")
    config = config_for(port)
    report = verify(port, config, port="flax mixed", cases=quick_cases(config)[:1], dtype="bfloat16")
    assert report.conformant, report.failures[:3] or [s for s in report.stages if not s.ok][:3]
    stored = {s.name: s.stored for s in report.stages}
    assert stored["blocks.0.norm1"] == "float32" and stored["blocks.0.mlp"] == "bfloat16"
    # every stage read but the weights NNX's dot_product_attention keeps inside (as nnx_vit:port)
    assert {n.split(".", 2)[2] for n in report.unseen if n.startswith("blocks.")} == {"attn.weights"}


@pytest.mark.parametrize(
    "name, unseen", [("hf_vit:clip_port", {"attn.weights"}), ("hf_vit:siglip_port", {"attn.weights"})]
)
def test_transformers_clip_and_siglip_towers_are_conformant_unmodified(name, unseen):
    """CLIPVisionModel norms the class token alone (compared on it); SiglipVisionModel's MAP head
    is an nn.MultiheadAttention. Both headless: their pooler_output is the pooled stage."""
    port = example(name)
    config = config_for(port)
    report = verify(port, config, port=name, cases=quick_cases(config)[:2])
    assert report.conformant, report.failures[:3] or [s for s in report.stages if not s.ok][:3]
    assert {n.split(".", 2)[2] for n in report.unseen if n.startswith("blocks.")} == unseen
    assert {"pooled", "norm" if "clip" in name else "attn_pool.proj"} <= {s.name for s in report.stages}
    if "clip" in name:
        assert next(s for s in report.stages if s.name == "norm").tokens.startswith("token 0")


def test_a_one_token_model_s_final_norm_is_the_whole_stage_not_a_pooled_form():
    """With one token (one patch, no class token) a (B, 1, D) norm is the whole stage: judged as
    such, not refused as a normalised pooled vector (found by the thorough profile)."""
    from conformance.numerics.compare import token_subset

    config = get_config("vit_test_avg_nocls").replace(img_size=(4, 2), fc_norm=False)
    assert config.num_tokens == 1
    assert token_subset("norm", np.zeros((1, 1, config.embed_dim)), (1, 1, config.embed_dim), config) == (None, None)
    assert token_subset("norm", np.zeros((3, config.embed_dim)), (3, 1, config.embed_dim), config) == (0, None)
    many = config.replace(img_size=(8, 8))  # several tokens, average pooling: a (B, D) norm is another computation
    assert token_subset("norm", np.zeros((3, many.embed_dim)), (3, many.num_tokens, many.embed_dim), many)[1]
    report = verify(load_factory("torch"), config, port="torch", dtype="float16")
    assert report.conformant, report.failures[:2] or [s for s in report.stages if not s.ok][:2]


def _hf_vit(**overrides):
    """transformers' ViTForImageClassification, unmodified, built from an HF config with
    ``overrides`` (None: the key left to transformers' default)."""
    from conformance.examples import hf_vit
    from weights.hf import vit_config_to_hf

    def build(config):
        from transformers import ViTConfig, ViTForImageClassification

        hf = vit_config_to_hf(config)
        for key, value in overrides.items():
            hf.pop(key) if value is None else hf.__setitem__(key, value)
        return ViTForImageClassification(ViTConfig(**hf)).eval()

    return ModelPort(build, convert=hf_vit.convert, output=lambda out: out.logits, supports=hf_vit.SUPPORTS)


@pytest.mark.parametrize(
    "overrides, stage, named",
    [
        ({"layer_norm_eps": None}, "blocks.0.norm1", "layernorm_eps_1e-12"),  # ViTConfig's default eps
        ({"hidden_act": "gelu_new"}, "blocks.0.mlp.act", "gelu_tanh"),  # transformers' tanh GELU
    ],
    ids=["default_eps", "gelu_new"],
)
def test_transformers_vit_built_with_a_real_config_mistake_is_located_and_named(overrides, stage, named):
    """The bug a converter makes with transformers' own defaults, in its own code: verify says
    where and what (docs/diagnosis.md)."""
    report = verify(_hf_vit(**overrides), get_config("vit_test_token_square"), port="transformers")
    assert report.first_divergence == stage, report.failures[:2]
    assert report.diagnosis is not None and report.diagnosis.named == named, report.diagnosis.line()


def test_open_clip_tower_built_with_gelu_on_quickgelu_weights_is_named():
    """open_clip#771: OpenAI's weights (QuickGELU) run in a tower built with open_clip's default
    nn.GELU; verify names the exact GELU at the first activation."""
    from conformance.examples import open_clip_vit as oc
    from tests.capture_cases import config_for

    port = ModelPort(lambda c: oc.build(c.replace(act_layer="gelu")), rename=oc.RENAME, supports=oc.SUPPORTS)
    report = verify(port, config_for(port).replace(act_layer="quick_gelu"), port="open_clip")
    assert report.first_divergence == "blocks.0.mlp.act", report.failures[:2]
    assert report.diagnosis.named == "gelu_exact", report.diagnosis.line()


def _registers_after_the_position_embedding(self, x):
    """Hugging Face Dinov2WithRegisters' order on a table that covers the registers: the class
    token and the patches take their entries, the registers are inserted after, with none."""
    import torch

    cls = self.cls_token.expand(x.shape[0], -1, -1) + self.pos_embed[:, :1]
    x = x + self.pos_embed[:, self.num_prefix_tokens :]
    return torch.cat([cls, self.reg_token.expand(x.shape[0], -1, -1), x], 1)


def _table_read_from_its_start(self, x):
    """The table taken for the patches' alone (a no_embed_class layout's reading)."""
    import torch

    x = x + self.pos_embed[:, : x.shape[1]]
    prefix = [t.expand(x.shape[0], -1, -1) for t in (self.cls_token, self.reg_token) if t is not None]
    return torch.cat(prefix + [x], 1)


@pytest.mark.parametrize(
    "pos_embed, named",
    [
        (_registers_after_the_position_embedding, "registers_without_pos_embed"),
        (_table_read_from_its_start, "pos_embed_not_offset_by_prefix"),
    ],
    ids=["registers_after", "table_from_its_start"],
)
def test_timm_with_a_porters_own_embedding_order_is_located_and_named(pos_embed, named):
    """timm's VisionTransformer (a class token, two registers, pos_embed covering all three kinds
    of token) with only its ``_pos_embed`` replaced by a porter's order: verify locates the
    embedding and names what it does instead; timm's own ``_pos_embed`` is the companion."""
    import types

    from conformance.references import timm_vit

    def build(config, replaced):
        model = timm_vit(config)
        if replaced is not None:
            model._pos_embed = types.MethodType(replaced, model)
        return model

    config = get_config("vit_test_registers_avg")
    for replaced in (None, pos_embed):
        port = ModelPort(lambda c: build(c, replaced), rename={}, supports=example("timm_vit:port").supports)
        report = verify(port, config, port="timm", cases=quick_cases(config)[:1])
        if replaced is None:
            assert report.conformant, report.failures[:2]
            continue
        assert report.first_divergence == "embed", report.failures[:2]
        assert report.diagnosis is not None and report.diagnosis.named == named, report.diagnosis.line()


def test_mlx_image_in_bfloat16_is_named_for_its_softmax_in_bfloat16():
    """mlx-image's attention calls mx.softmax without precise=True: in bfloat16 its exponentials and
    their sum are stored in bfloat16, where timm under autocast keeps the softmax in float32. verify
    locates it at the first attention's weights and names it (α ≈ 0.99: the oracle sums in another
    order than MLX); this project's MLX port, precise=True, is conformant in bfloat16 (the scan's
    calibration: the correct ports, MLX's among them, never reach the class)."""
    report = verify(
        example("mlx_image_vit:port"), get_config("vit_test_token_square"), dtype="bfloat16", port="mlx-image"
    )
    assert report.first_divergence == "blocks.0.attn.weights", report.failures[:2]
    assert report.diagnosis is not None and report.diagnosis.named == "softmax_in_bfloat16", report.diagnosis.line()
    assert "precise=True" in report.diagnosis.line()
