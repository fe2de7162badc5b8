"""ViTConfig: timm's names and semantics, presets equal to timm's, and clear errors."""

from pathlib import Path

import pytest

from impls import PRESETS, ConfigError, ViTConfig, get_config, tap_names, tap_shapes
from weights import expected_shapes


def timm_state_keys(model):
    from conformance.references import timm_state_keys

    return timm_state_keys(model)


def timm_model(config: ViTConfig):
    from conformance.references import timm_vit

    return timm_vit(config)


@pytest.mark.parametrize(
    "name", ["vit_tiny_patch16_224", "vit_small_patch16_224", "vit_base_patch16_224", "vit_large_patch16_224"]
)
def test_timm_preset_has_timm_keys_and_shapes(name):
    import timm
    import torch

    with torch.device("meta"):  # keys and shapes only: no memory, no init (ViT-B's 86M parameters)
        model = timm.create_model(name, pretrained=False)
    timm_shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    assert expected_shapes(get_config(name)) == timm_shapes


# timm has no Qwen2.5-VL tower (its windows cut at the edge, its rotation beside RMSNorm): its preset's keys are
# transformers' (tests/test_vlm_towers.py loads a state of its options strictly into Qwen2.5-VL's tower, no head)
NOT_TIMM = ("vit_test_qwen2_5_vl",)


@pytest.mark.parametrize("name", sorted(n for n in PRESETS if n.startswith("vit_test") and n not in NOT_TIMM))
def test_every_preset_matches_a_timm_model_built_from_its_options(name):  # timm's own: above
    config = get_config(name)
    timm_shapes = timm_state_keys(timm_model(config))  # (timm's Eva and Beit: gamma_1 as ls1.gamma)
    assert list(expected_shapes(config)) == list(timm_shapes)  # same keys, same order
    assert expected_shapes(config) == timm_shapes


def test_int_img_size_means_square():
    assert ViTConfig(img_size=32, patch_size=8).img_size == (32, 32)
    assert ViTConfig(img_size=(32, 16), patch_size=8).grid_size == (4, 2)


@pytest.mark.parametrize(
    "options, words",
    [
        (dict(embed_dim=10, num_heads=3), ["embed_dim 10", "num_heads 3"]),
        (dict(img_size=(30, 32), patch_size=16, dynamic_img_size=True), ["img_size (30, 32)", "patch_size (16, 16)"]),
        (dict(img_size=(8, 32), patch_size=16), ["img_size (8, 32)", "smaller than patch_size (16, 16)"]),
        (dict(global_pool="gap"), ["global_pool", "'gap'"]),
        (dict(mlp_layer="glu"), ["mlp_layer", "'glu'"]),
        (dict(mlp_layer="swiglu_packed", embed_dim=6, num_heads=2, mlp_ratio=1.5), ["swiglu_packed", "9", "even"]),
        (dict(class_token=False, global_pool="token"), ["class_token=False", "avg"]),
        (dict(distilled=True, fc_norm=True), ["distilled=True", "no fc_norm=True", "unnormalised"]),
        (dict(depth=0), ["depth", "0"]),
        (dict(in_chans=2.5), ["in_chans", "2.5"]),
        (dict(num_classes=-1), ["num_classes", "-1"]),
        (dict(norm_eps=0.0), ["norm_eps"]),
        (dict(mlp_ratio=0.0), ["mlp_ratio"]),
        (dict(img_size=(1, 2, 3)), ["img_size", "(1, 2, 3)"]),
        # beyond float32: no port can run the config (Inf, or 0), so it is exit 2, not a finding
        (dict(rope_type="cat", rope_grid_offset=1e300), ["rope_grid_offset", "float32 rounds to Inf"]),
        (dict(rope_type="cat", rope_temperature=1e-300), ["rope_temperature", "0 or a subnormal"]),
        (dict(rope_type="cat", rope_grid_offset=1e20), ["rope_grid_offset", "2^24"]),
        (dict(norm_eps=1e-300), ["norm_eps", "0 or a subnormal"]),
        # SAM's windows and relative positions: the patch grid alone, at the config's own size
        (dict(window_size=2), ["window_size=2", "no prefix token", "1 prefix tokens"]),
        (
            dict(class_token=False, global_pool="avg", use_rel_pos=True, dynamic_img_size=True),
            ["use_rel_pos", "no option yet"],
        ),
        (
            dict(class_token=False, global_pool="avg", global_attn_indexes=(1,)),
            ["global_attn_indexes [1]", "window_size > 0"],
        ),
        (
            dict(class_token=False, global_pool="avg", window_size=2, global_attn_indexes=(1, 0)),
            ["global_attn_indexes", "increasing"],
        ),
        (
            dict(class_token=False, global_pool="avg", window_size=2, global_attn_indexes=(True,)),
            ["global_attn_indexes", "non-negative ints"],
        ),
    ],
)
def test_invalid_config_raises_a_clear_error(options, words):
    with pytest.raises(ConfigError) as info:
        ViTConfig(**options)
    for word in words:
        assert word in str(info.value)


def test_unknown_preset_names_the_known_ones():
    with pytest.raises(ConfigError, match="vit_tiny_patch16_224"):
        get_config("vit_huge_patch99")


def test_config_round_trips_through_dict():
    for config in PRESETS.values():
        assert ViTConfig.from_dict(config.to_dict()) == config
    with pytest.raises(ConfigError, match="depht"):
        ViTConfig.from_dict({"depht": 3})


def test_avg_pool_has_no_final_norm_stage_and_every_tap_has_a_shape():
    for config in PRESETS.values():
        names = tap_names(config)
        assert ("norm" in names) == config.use_final_norm
        assert set(names) == set(tap_shapes(config, 2))
        first = "patch_embed.patch_norm" if config.patch_norm else "patch_embed"
        last = ["pooled", "pooled_dist", "logits"] if config.distilled else ["pooled", "logits"]
        assert names[0] == first and names[-len(last) :] == last


def _disagreements(options, config_cls) -> list[str]:
    """Where the option table and ViTConfig's fields differ (a field missing or another default)."""
    fields = config_cls.__dataclass_fields__
    found = [f"{o.field}: no such field" for o in options if o.field not in fields]
    return found + [
        f"{o.field}: default {o.default!r}, the config's {fields[o.field].default!r}"
        for o in options
        if o.field in fields and fields[o.field].default != o.default
    ]


def test_each_option_is_defined_once_and_everything_reads_it():
    """weights/options.py is the one definition: the config's fields and defaults agree with it, and
    the original ViT's supports, the .npz, open_clip and Hugging Face layouts' refusals and
    docs/model.md's table are read from it. The companion: an entry whose default differs from the
    config's is found."""
    import dataclasses

    from conformance.commands.docs import option_table
    from impls import ORIGINAL_VIT, VIT_FAMILY
    from weights import formats
    from weights.hf import family
    from weights.options import BY_FIELD, FAMILY, OPTIONS, holds, original_vit

    assert _disagreements(OPTIONS, ViTConfig) == []
    broken = (dataclasses.replace(BY_FIELD["norm_eps"], default=1e-5),)
    assert _disagreements(broken, ViTConfig) == ["norm_eps: default 1e-05, the config's 1e-06"]
    assert ORIGINAL_VIT == original_vit() and set(VIT_FAMILY) == set(FAMILY)
    assert formats.NPZ_HOLDS == holds("npz") and formats.OPEN_CLIP_HOLDS == holds("open_clip")
    assert family.HOLDS == {t: holds(f"hf:{t}") for t in family.FAMILY_MODEL_TYPES}
    docs = (Path(__file__).parent.parent / "docs" / "model.md").read_text()
    assert option_table() in docs
    config = ViTConfig(reg_tokens=4, global_pool="map", class_token=False)
    assert config.beyond_original_vit() == ["global_pool='map'", "reg_tokens=4"]


def _unchecked(options) -> list[str]:
    """The options whose declared check takes a value of no field's type (an object), or refuses
    their own default."""
    found = []
    for option in options:
        option.check(option.default, option.field)  # the default is a valid value
        try:
            option.check(object(), option.field)
        except ConfigError as e:
            assert option.field in str(e)  # the refusal names the field
        else:
            found.append(option.field)
    return found


def test_each_options_value_is_checked_as_it_declares():
    """Every option's field is checked by the check its entry declares (weights/checks.py), which
    ViTConfig runs; a value of another type is refused naming the field. The companion: an entry
    whose check takes anything is found, and a config with it takes a wrong value."""
    import dataclasses

    from weights.checks import Check
    from weights.options import BY_FIELD, OPTIONS

    assert _unchecked(OPTIONS) == []
    lax = dataclasses.replace(BY_FIELD["qk_norm"], check=Check("bool", lambda value, name: value))
    assert _unchecked((lax,)) == ["qk_norm"]
    with pytest.raises(ConfigError, match="qk_norm must be a bool, got 'yes'"):
        ViTConfig(qk_norm="yes")


def test_a_number_float32_holds_is_a_valid_config():
    """The companion: the same options at values float32 holds are taken."""
    for options in (dict(rope_grid_offset=0.5), dict(rope_temperature=1e-30), dict(norm_eps=1e-30)):
        ViTConfig(rope_type="cat", **options)


def test_a_value_beyond_float32_is_exit_2_naming_the_option(cli):
    code, out, err = cli("verify", "torch", "--preset", "vit_test_rope", "--set", "rope_grid_offset=1e300")
    assert code == 2 and "rope_grid_offset must be a number float32 holds" in out + err, out + err


def test_a_declared_depth_of_a_billion_is_refused_before_anything_is_built():
    with pytest.raises(ConfigError, match="depth must be at most 65536"):
        ViTConfig(depth=10**9)
    assert ViTConfig(depth=65536).depth == 65536  # the companion: the limit itself is taken
