"""A tower whose positions the config has no word for (rotary embeddings, BEiT's relative position
bias) is told as such: exit 2 naming the scheme and the modules or parameters that show it,
never NOT CONFORMANT at a stage, and never advice to use a position table it does not have."""

import json

import pytest

from conformance.capture.expressible import EXPRESSED_BY, NO_WORD, NotExpressible, schemes
from conformance.capture import ModelPort
from conformance.support import build_config, supports_of
from conformance.verify.forward import verify
from impls import get_config
from tests.data import position_scheme_ports as P

# two blocks of 2 heads on a 4x4 grid of 8x8 patches: rotary needs a head_dim divisible by 4
CONFIG = get_config("vit_test_token").replace(img_size=(32, 32), patch_size=(8, 8), num_heads=2)
ROTARY = "it rotates q and k by their positions"
SEQUENCE = "it rotates q and k by each token's index in the sequence"
RELATIVE = "it adds a learned relative position bias to each block's attention logits"
LEARNED = "it learns its rotary frequencies"
MIXED = "rope_type='mixed'"
SAID = "rope_type ('cat'"  # the option that expresses a rotation of timm's kinds


def answer(port, config=CONFIG) -> str:
    with pytest.raises(NotExpressible) as e:
        verify(port, config, port="tower")
    return str(e.value)


def test_a_rope_vit_whose_every_key_has_its_place_is_not_expressible_and_without_rope_is_conformant():
    """timm's vit_base_patch16_rope_224 mapped whole (no position table, LayerScale renamed), given
    a config without a rotation: once NOT CONFORMANT at blocks.0.attn.q, now the rotation named with
    the option that says it; the companion, the same model built without its rotation, passes: the
    answer comes from the rotary module alone."""
    config = CONFIG.replace(pos_embed="none", init_values=1e-5)
    text = answer(P.rope_vit, config)
    assert text.count("\n") == 1 and f"{ROTARY} " in text and SAID in text, text
    assert "rope (RotaryEmbeddingCat)" in text and "AttentionRope" not in text
    report = verify(P.rope_vit_without_rope, config, port="rope off")
    assert report.conformant, report.failures[:2] or [s.name for s in report.stages if not s.ok]


def test_timms_rope_vit_unmodified_is_conformant_with_its_rotation_declared_and_a_swapped_grid_is_located():
    """The same model, its rotation declared as timm builds it (the axial kind, x first,
    temperature 100): CONFORMANT, q and k after the rotation judged at their own stages. The
    companion: declared with the grid's rows first, the rotation is the first stage found wrong."""
    config = CONFIG.replace(pos_embed="none", init_values=1e-5, **P.ROPE_ON)
    report = verify(P.rope_vit_declared, config, port="timm rope")
    assert report.conformant, report.failures[:2] or [s.name for s in report.stages if not s.ok]
    assert {"blocks.0.attn.q_rope", "blocks.1.attn.k_rope"} <= {s.name for s in report.stages if s.ok}
    swapped = config.replace(rope_grid_indexing="ij")
    declared = ModelPort(
        P.rope_vit_declared.build, rename=P.GAMMAS, supports={**P.ROPE_OPTIONS, **P.ROPE_ON, "rope_grid_indexing": "ij"}
    )
    report = verify(declared, swapped, port="timm rope, rows first")
    assert not report.conformant and report.located() == "blocks.0.attn.q_rope", report.located()


def test_timms_rope_mixed_vit_unmodified_is_conformant_declared_and_its_other_grid_order_is_located():
    """RoPE-Mixed (timm's vit_base_patch16_rope_mixed_224): its learned frequencies are the
    canonical rope.freqs, mapped by name; declared, CONFORMANT, its rotation judged per block; the
    companion, declared with the grid's rows first, is located at the rotation."""
    config = CONFIG.replace(pos_embed="none", init_values=1e-5, rope_type="mixed", rope_grid_indexing="xy")
    report = verify(P.rope_mixed_declared, config, port="timm rope-mixed")
    assert report.conformant, report.failures[:2] or [s.name for s in report.stages if not s.ok]
    assert {"blocks.0.attn.q_rope", "blocks.1.attn.k_rope"} <= {s.name for s in report.stages if s.ok}
    rows = ModelPort(
        P.rope_mixed_declared.build,
        rename=P.GAMMAS,
        supports={**P.rope_mixed_declared.supports, "rope_grid_indexing": "ij"},
    )
    report = verify(rows, config.replace(rope_grid_indexing="ij"), port="timm rope-mixed, rows first")
    assert not report.conformant and report.located() == "blocks.0.attn.q_rope", report.located()


def test_transformers_dinov3_unmodified_is_conformant_declared_and_its_other_pairs_are_located():
    """transformers' DINOv3ViTModel, a rename of its names alone: CONFORMANT with DINOv3's rotation and
    its attention's biases (q and v, k none, three projections) declared; the companion, declared with
    neighbouring pairs rotated where it turns halves, is located at the rotation."""
    config = CONFIG.replace(**P.HF_DINOV3)
    report = verify(P.hf_dinov3_declared, config, port="transformers DINOv3")
    assert report.conformant, report.failures[:2] or [s.name for s in report.stages if not s.ok]
    assert {"blocks.0.attn.k", "blocks.1.attn.q_rope"} <= {s.name for s in report.stages if s.ok}
    pairs = config.replace(rope_rotate_half=False)
    port = ModelPort(
        P.hf_dinov3_declared.build,
        rename=P.HF_DINOV3_RENAME,
        output=P.hf_dinov3_declared.output,
        supports={**P.hf_dinov3_declared.supports, "rope_rotate_half": False},
    )
    report = verify(port, pairs, port="transformers DINOv3, pairs")
    assert not report.conformant and report.located() == "blocks.0.attn.q_rope", report.located()


@pytest.mark.parametrize(
    "tower, scheme, shown, lines",
    [
        ("dinov3", ROTARY, "rope (RotaryEmbeddingDinoV3)", ["reg_tokens=4 expresses it", "init_values with a rename"]),
        ("rope_mixed_vit", LEARNED, "rope.freqs", []),
        ("beit", RELATIVE, "blocks.{i}.attn.relative_position_bias_table", ["q and v projections have biases"]),
        ("hf_dinov3", ROTARY, "rope_embeddings (DINOv3ViTRopePositionEmbedding)", ["reg_tokens=2 expresses it"]),
        ("hf_beit", RELATIVE, "relative_position_bias_table", []),
        ("x_transformers_rotary", SEQUENCE, "attn_layers.rotary_pos_emb.inv_freq", []),
        ("mlx_rope_vit", SEQUENCE, "blocks.{i}.attn.rope (RoPE)", []),
    ],
)
def test_a_tower_with_another_position_scheme_is_told_what_the_config_cannot_say(tower, scheme, shown, lines):
    """The scheme's line first, with what shows it; the missing pos_embed is part of that line, not
    a suggestion of a sin-cos table or none; the parts options do express named as before."""
    config = CONFIG.replace(pos_embed="none", init_values=1e-5) if tower == "rope_mixed_vit" else CONFIG
    if tower == "x_transformers_rotary":  # the options its port declares (x_transformers_port.OPTIONS)
        config = build_config(supports_of(P.x_transformers_rotary), CONFIG.to_dict() | {"name": None})
    text = answer(getattr(P, tower), config)
    first = text.splitlines()[1]
    # a rotation of timm's kinds has its option, the learned one 'mixed', BEiT's bias rel_pos_bias
    said = {ROTARY: SAID, LEARNED: "rope_type='mixed'", RELATIVE: "rel_pos_bias=true"}.get(scheme, NO_WORD)
    assert first.strip().startswith(scheme) and said in first and shown in first, text
    # (BEiT's line itself says it has no table: pos_embed='none' beside rel_pos_bias)
    others = "\n".join(line for line in text.splitlines() if not line.strip().startswith(RELATIVE))
    assert "pos_embed='sincos'" not in others and "pos_embed='none'" not in others, text
    for expected in lines:
        assert expected in text, (expected, text)


def test_the_cli_exits_2_on_a_rotary_tower_with_the_configs_label(cli):
    """In verify's process: the answer is the config's wherever the port runs (its own process
    would import timm only to say the same)."""
    config = CONFIG.replace(pos_embed="none", init_values=1e-5)
    spec = "tests.data.position_scheme_ports:rope_vit"
    code, out, err = cli("verify", spec, "--config", json.dumps(config.to_dict()), "--in-process")
    assert code == 2 and "NOT CONFORMANT" not in out, out + err
    assert "the config cannot express this model" in err and ROTARY in err, err


def test_only_the_modules_that_make_the_angles_are_read_as_a_scheme():
    """The companion of the rule on class names: timm's and transformers' rotary modules (a patch's
    row and column), MLX's and x-transformers' (a token's index in the sequence: no option says it)
    and BEiT's bias are found, each as its own scheme; an attention class that can rotate (timm's
    AttentionRope, which runs without angles too) and names that merely contain the letters are not."""
    found = schemes(
        {
            "rope": "RotaryEmbeddingCat",
            "rope_embeddings": "DINOv3ViTRopePositionEmbedding",
            "layers.0.rope": "RoPE",
            "rotary": "RotaryEmbedding",
            "rel": "BeitRelativePositionBias",
        },
        [],
    )
    keys = list(found)
    assert [k.split(" (")[0] for k in keys] == [SEQUENCE, ROTARY, RELATIVE], found
    assert NO_WORD in keys[0] and SAID in keys[1] and "rel_pos_bias=true" in keys[2], found
    assert found[keys[0]] == ["layers.{i}.rope (RoPE)", "rotary (RotaryEmbedding)"], found
    assert len(found[keys[1]]) == 2 and found[keys[2]] == ["rel (BeitRelativePositionBias)"], found
    # their frequencies, where a model holds them (x-transformers' buffer, transformers' DINOv3's
    # periods; timm's mixed rope learns them, which rope_type='mixed' says: that line alone, also
    # beside another kind declared)
    assert schemes({}, ["attn_layers.rotary_pos_emb.inv_freq"]) == {keys[0]: ["attn_layers.rotary_pos_emb.inv_freq"]}
    assert schemes({}, ["rope_embeddings.periods"]) == {keys[1]: ["rope_embeddings.periods"]}
    learned = schemes({"rope": "RotaryEmbeddingMixed"}, ["rope.freqs"])
    assert list(learned) == [f"{LEARNED}, per block and head (RoPE-Mixed): {EXPRESSED_BY[MIXED]}"], learned
    assert schemes({"rope": "RotaryEmbeddingMixed"}, ["rope.freqs"], CONFIG.replace(rope_type="cat")) == learned
    assert schemes({"rope": "RotaryEmbeddingMixed"}, ["rope.freqs"], CONFIG.replace(rope_type="mixed")) == {}
    # a config that declares a rotation leaves it to be judged, BEiT's bias still unsaid; one that
    # declares the bias leaves that to be judged
    declared = CONFIG.replace(rope_type="cat")
    assert list(schemes({"rope": "RotaryEmbeddingCat", "rel": "BeitRelativePositionBias"}, [], declared)) == [keys[2]]
    beit = CONFIG.replace(pos_embed="none", rel_pos_bias=True, global_pool="avg")
    assert schemes({"rel": "BeitRelativePositionBias"}, ["rel.relative_position_bias_table"], beit) == {}
    assert list(schemes({"layers.0.rope": "RoPE"}, [], declared)) == [keys[0]]  # 'cat' is not the sequence's
    assert schemes({"blocks.0.attn": "AttentionRope", "d": "Dropout", "p": "DropPath", "x": "PropertyNet"}, []) == {}
    assert schemes({}, ["blocks.0.attn.qkv.weight", "pos_embed"]) == {}


def test_the_mlx_model_without_its_rope_is_conformant():
    """The companion of the MLX row above: the same model, its attention without nn.RoPE, passes
    (what made it unexpressible was the rotation, found through the MLX adapter's modules)."""
    report = verify(P.mlx_vit_without_rope, CONFIG, port="mlx without rope")
    assert report.conformant, report.failures[:2] or [s.name for s in report.stages if not s.ok]
