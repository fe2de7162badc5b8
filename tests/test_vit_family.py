"""The ViT family beyond the original (DINOv2, CLIP, SigLIP, DeiT III, qk-norm models): timm's
options in the config, the canonical weights and the float64 oracle, each checked against timm's
VisionTransformer built with the same options; the framework ports refuse them by name until
they implement them."""

import re

import numpy as np
import pytest
import torch

from conformance import properties as P
from conformance import strategies as S
from conformance.numerics.compare import error
from conformance.profiles import heavy
from conformance.references import timm_taps, timm_vit
from conformance.support import Unsupported
from conformance.tests.helpers import factory
from impls import ConfigError, get_config, tap_names
from impls.numpy_vit import resample_pos_embed
from weights import init_state
from weights.canonical import expected_shapes

BASE = get_config("vit_test_token")
VARIANTS = {
    "dinov2_reg": dict(reg_tokens=4, no_embed_class=True, init_values=1e-5),
    "registers_with_position": dict(reg_tokens=2),
    "deit3": dict(no_embed_class=True, init_values=0.1),
    "clip": dict(pre_norm=True, act_layer="quick_gelu"),
    "token_fc_norm": dict(fc_norm=True),
    "big_vision_gap": dict(global_pool="avg", fc_norm=False),
    "siglip_act": dict(act_layer="gelu_tanh"),
    "qk_norm": dict(qk_norm=True, init_values=0.5),
    "no_proj_bias": dict(proj_bias=False, qkv_bias=False),
    "siglip_map": dict(class_token=False, global_pool="map", act_layer="gelu_tanh"),
    "map_after_tokens": dict(global_pool="map", reg_tokens=1, fc_norm=True),
    "avgmax": dict(global_pool="avgmax", reg_tokens=1),
    "max": dict(global_pool="max", class_token=False),
    "swiglu_packed": dict(mlp_layer="swiglu_packed", act_layer="silu", mlp_ratio=2.0, init_values=1.0),
    "swiglu": dict(mlp_layer="swiglu", act_layer="silu", proj_bias=False),
}


def assert_oracle_equals_timm_in_float64(oracle, ref, config, name):
    """Every stage below 1e-12 relative: float64 rounding, nothing more."""
    for stage in tap_names(config):
        _, rel = error(oracle[stage], ref[stage])
        assert rel < 1e-12, f"{name} {stage}: oracle vs timm float64 rel_err {rel:.3e}"


def images(config, seed=0):
    return np.random.default_rng(seed).normal(size=(2, config.in_chans, *config.img_size)).astype(np.float32)


@pytest.mark.parametrize("name", list(VARIANTS))
def test_oracle_equals_timm_in_float64_at_every_stage_for_each_option(name):
    config = BASE.replace(**VARIANTS[name])
    state = init_state(config, seed=3)
    model = timm_vit(config, state, dtype=torch.float64)
    assert list(model.state_dict()) == list(expected_shapes(config)), "canonical keys and order are timm's"
    assert {k: tuple(v.shape) for k, v in model.state_dict().items()} == expected_shapes(config)
    x = images(config)
    ref, oracle = timm_taps(model, x), factory("numpy")(config, state)(x)
    assert sorted(ref) == sorted(tap_names(config))
    assert_oracle_equals_timm_in_float64(oracle, ref, config, name)


DYNAMIC = {
    "dynamic": dict(dynamic_img_size=True),
    "dynamic_dinov2_reg": dict(dynamic_img_size=True, reg_tokens=2, no_embed_class=True, init_values=0.5),
    "dynamic_siglip": dict(dynamic_img_size=True, class_token=False, global_pool="map"),
}


@pytest.mark.parametrize("name", list(DYNAMIC))
@pytest.mark.parametrize("grid", [(7, 3), (2, 5)])
def test_oracle_equals_timm_in_float64_on_images_of_another_size(name, grid):
    """dynamic_img_size: the 4x6 position grid resampled to the images' grid (up in one axis and
    down in the other), bicubic with antialiasing, by timm's resample_abs_pos_embed and by the
    oracle's matrices."""
    import timm.models.vision_transformer as tvt

    config = BASE.replace(**DYNAMIC[name])
    state = init_state(config, seed=3)
    model = timm_vit(config, state, dtype=torch.float64)
    x = S.make_images(config, 2, "ordinary", 0, grid)
    # timm resamples in float32 even in a float64 model (posemb.float()); here in the model's dtype,
    # so the comparison is float64 throughout (the resampling itself: the test below).
    float64_resample = lambda posemb, new_size, old_size=None, num_prefix_tokens=1, **kw: torch.from_numpy(  # noqa: E731
        resample_pos_embed(posemb.numpy(), old_size, new_size, num_prefix_tokens)
    )
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(tvt, "resample_abs_pos_embed", float64_resample)
        ref = timm_taps(model, x)
    oracle = factory("numpy")(config, state)(x)
    assert oracle["patch_embed"].shape[1] == grid[0] * grid[1]
    assert_oracle_equals_timm_in_float64(oracle, ref, config, name)


@pytest.mark.parametrize("ours", ["bicubic", "bilinear"])
@pytest.mark.parametrize("old, new", [((4, 6), (7, 3)), ((37, 37), (16, 16)), ((5, 3), (2, 9)), ((3, 3), (3, 3))])
def test_the_resampling_matrices_equal_torchs_antialiased_interpolation_in_float64(old, new, ours):
    """Torch's F.interpolate(bicubic or bilinear, antialias=True), which timm's resample_abs_pos_embed
    and NaFlexVit call: the oracle's (and the MLX and JAX ports') matrices agree to float64 rounding
    with the same mode; the other mode, or no antialiasing, does not (companion). The diagnosis's
    matrices without antialiasing agree with torch's without it."""
    import torch.nn.functional as F

    from conformance.diagnosis.position_classes import _plain_matrix
    from weights.resample import aa_matrix

    pos = np.random.default_rng(0).normal(size=(1, 1 + old[0] * old[1], 5))
    grid = torch.from_numpy(pos[:, 1:].reshape(1, *old, 5)).permute(0, 3, 1, 2)
    for mode, antialias in (("bicubic", True), ("bicubic", False), ("bilinear", True), ("bilinear", False)):
        theirs = F.interpolate(grid, size=new, mode=mode, antialias=antialias, align_corners=False)
        theirs = theirs.permute(0, 2, 3, 1).reshape(1, -1, 5).numpy()
        rel = error(resample_pos_embed(pos, old, new, 1, ours)[:, 1:], theirs)[1]
        assert (rel < 1e-14) == ((mode == ours and antialias) or old == new), (mode, antialias, rel)
        if not antialias:
            Rh, Rw = (_plain_matrix(o, n, mode) for o, n in zip(old, new))
            plain = np.einsum("ih,bhwd,jw->bijd", Rh, pos[:, 1:].reshape(1, *old, 5), Rw).reshape(1, -1, 5)
            assert error(plain, theirs)[1] < 1e-14, (mode, "without antialias")
    # align_corners=True (the zoo's flipped resize): its own matrices equal torch's, and differ from ours
    theirs = F.interpolate(grid, size=new, mode=ours, antialias=True, align_corners=True)
    theirs = theirs.permute(0, 2, 3, 1).reshape(1, -1, 5).numpy()
    Rh, Rw = (aa_matrix(o, n, ours, align_corners=True) for o, n in zip(old, new))
    cornered = np.einsum("ih,bhwd,jw->bijd", Rh, pos[:, 1:].reshape(1, *old, 5), Rw).reshape(1, -1, 5)
    assert error(cornered, theirs)[1] < 1e-14
    assert (error(resample_pos_embed(pos, old, new, 1, ours)[:, 1:], theirs)[1] < 1e-14) == (old == new)


@pytest.mark.parametrize("name", list(DYNAMIC) if heavy() else ["dynamic_dinov2_reg"])
def test_every_port_is_within_its_bound_on_images_of_another_size(name):
    """In ci one option set on one port (drawn dynamic-size configs run on all three in
    test_model); the thorough profile runs every set on every port."""
    config = BASE.replace(**DYNAMIC[name])
    for grid in ((7, 3), (2, 5)):
        images = S.ImageCase("ordinary", 1, 2, grid)
        case = P.ModelCase(config, init_state(config, seed=4), images.make(config), info={"images": images})
        for port in ("torch", "mlx", "jax") if heavy() else ("torch",):
            P.check_matches_oracle(port, factory(port), case)


def test_fixed_size_models_refuse_other_sizes_and_dynamic_ones_need_whole_patches():
    from impls import InputError

    config = BASE.replace(dynamic_img_size=True)
    with pytest.raises(InputError, match="divisible by 4 and a width by 4"):
        factory("torch")(config, init_state(config))(np.zeros((1, 3, 18, 24), np.float32))
    with pytest.raises(InputError, match="must be 16x24"):
        factory("mlx")(BASE, init_state(BASE))(np.zeros((1, 3, 28, 12), np.float32))


def test_the_timm_comparison_fails_when_an_option_is_dropped():
    """Companion: the oracle built without LayerScale, or with the position embedding over the
    prefix tokens, against timm with them."""
    for dropped, kept in (
        (dict(init_values=None), VARIANTS["deit3"]),
        (dict(no_embed_class=False, reg_tokens=0), dict(reg_tokens=0, no_embed_class=True)),
    ):
        config = BASE.replace(**kept)
        state = init_state(config, seed=3)
        ref = timm_taps(timm_vit(config, state, dtype=torch.float64), images(config))
        wrong = BASE.replace(**{**kept, **dropped})
        wrong_state = {k: v for k, v in state.items() if k in expected_shapes(wrong)}
        if wrong.embed_len != config.embed_len:  # loaded into a model that gives the class token a position:
            pos = state["pos_embed"]  # the first patch's entry copied in front, the bug of timm#1344's kind
            wrong_state["pos_embed"] = np.concatenate([pos[:, :1], pos], 1)
        oracle = factory("numpy")(wrong, wrong_state)(images(config))
        assert error(oracle["logits"], ref["logits"])[1] > 1e-6, dropped


@pytest.mark.parametrize(
    "options, message",
    [
        (dict(reg_tokens=-1), "reg_tokens must be an int >= 0"),
        (dict(act_layer="relu"), "act_layer must be one of"),
        (dict(init_values=0.0), "init_values must be None"),
        (dict(fc_norm="yes"), "fc_norm must be None"),
    ],
)
def test_invalid_family_options_raise_config_error_naming_them(options, message):
    with pytest.raises(ConfigError, match=message):
        BASE.replace(**options)


def test_a_port_of_the_original_vit_refuses_family_options_by_name():
    """impls.protocol.ORIGINAL_VIT is the supports declaration of a port written for the 2020 ViT."""
    from conformance.support import check_supported
    from impls.protocol import ORIGINAL_VIT

    check_supported(ORIGINAL_VIT, get_config("vit_test_avg_nocls"))
    for options, named in (
        (VARIANTS["dinov2_reg"], "reg_tokens=4"),
        (VARIANTS["siglip_map"], "global_pool='map'"),
        (dict(mlp_layer="swiglu"), "mlp_layer='swiglu'"),
    ):
        with pytest.raises(Unsupported, match=re.escape(named)):
            check_supported(ORIGINAL_VIT, BASE.replace(**options))


@pytest.mark.parametrize("write", ["hf.to_hf", "formats.to_npz"])
def test_original_vit_layouts_refuse_family_weights_rather_than_drop_them(write):
    import importlib

    from weights import WeightError

    module, _, name = write.partition(".")
    config = BASE.replace(init_values=0.1)
    with pytest.raises(WeightError, match="not init_values=0.1: writing it would drop"):
        getattr(importlib.import_module(f"weights.{module}"), name)(init_state(config), config)


# The family's presets and the timm model each is (name, and kwargs where timm has no name).
FAMILY_PRESETS = {
    **{
        name: (name, {})
        for name in (
            "vit_small_patch14_dinov2",
            "vit_small_patch14_reg4_dinov2",
            "vit_giant_patch14_dinov2",
            "vit_base_patch16_clip_224",
            "vit_base_patch16_clip_quickgelu_224",
            "vit_base_patch16_siglip_224",
            "vit_large_patch14_clip_336",
            "vit_large_patch14_clip_quickgelu_336",
            "vit_so400m_patch14_siglip_384",
            "vit_base_patch16_siglip_gap_224",
            "deit3_small_patch16_224",
            "deit_small_distilled_patch16_224",
            "vit_intern300m_patch14_448",
            "aimv2_large_patch14_224",
        )
    },
    "vit_small_patch16_qknorm_224": ("vit_small_patch16_224", {"qk_norm": True}),
}


def timm_named(name: str, **overrides):
    """timm.create_model for a family preset, random init, eval mode."""
    import timm

    timm_name, kwargs = FAMILY_PRESETS[name]
    return timm.create_model(timm_name, pretrained=False, **kwargs, **overrides).eval()


@pytest.mark.parametrize("name", list(FAMILY_PRESETS))
def test_family_preset_has_the_timm_models_keys_order_and_shapes(name):
    """On the meta device: no memory, no init; ViT-g/14's 1.1 billion parameters included."""
    with torch.device("meta"):
        model = timm_named(name)
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    assert list(shapes) == list(expected_shapes(get_config(name)))
    assert shapes == expected_shapes(get_config(name))


def timm_named_float64(name: str, **overrides):
    """The named timm model with its own (seeded) init, in float64, and its state as the
    float32 canonical tensors it holds exactly."""
    torch.manual_seed(0)
    model = timm_named(name, **overrides).to(torch.float64)
    state = {k: v.float().numpy() for k, v in model.state_dict().items()}
    model.load_state_dict({k: torch.from_numpy(v).double() for k, v in state.items()})
    return model, state


def reduced(name: str):
    """A family preset with one block of its heads at a width of 8 each on a 2x3 patch grid: the
    same options (its MLP's ratio to the width too), cheap to run; the timm model built with the
    same reductions."""
    config = get_config(name)
    (ph, pw) = config.patch_size
    small = dict(img_size=(2 * ph, 3 * pw), depth=1, embed_dim=8 * config.num_heads)
    return config.replace(**small), small


@pytest.mark.parametrize("name", [n for n in FAMILY_PRESETS if n != "vit_giant_patch14_dinov2"])
def test_oracle_equals_the_named_timm_model_in_float64_at_every_stage(name):
    """Options timm's model builder sets that the keys do not show (act_layer, norm eps) are
    checked here: a reduced preset's oracle against timm.create_model(name) with the same
    reductions, in float64, with the model's own random init."""
    config, overrides = reduced(name)
    model, state = timm_named_float64(name, **overrides)
    x = images(config)
    ref, oracle = timm_taps(model, x), factory("numpy")(config, state)(x)
    assert sorted(ref) == sorted(tap_names(config))
    assert_oracle_equals_timm_in_float64(oracle, ref, config, name)


@pytest.mark.parametrize(
    "name, wrong, stage",
    [
        ("vit_base_patch16_clip_quickgelu_224", dict(act_layer="gelu"), "blocks.0.mlp.act"),
        ("vit_base_patch16_clip_224", dict(norm_eps=1e-6), "norm_pre"),
    ],
)
def test_the_named_timm_comparison_fails_on_an_option_the_keys_do_not_show(name, wrong, stage):
    """Companion: GELU for QuickGELU (open_clip#771's bug), or the default eps for CLIP's 1e-5."""
    config, overrides = reduced(name)
    model, state = timm_named_float64(name, **overrides)
    x = images(config)
    ref, oracle = timm_taps(model, x), factory("numpy")(config.replace(**wrong), state)(x)
    first = next(s for s in tap_names(config) if error(oracle[s], ref[s])[1] > 1e-12)
    assert first == stage


# Full size in float64 on one image within the thorough profile's time: not the ViT-L and larger towers
# (their full-size verification is `python -m conformance bench --verify`'s, docs/performance.md).
RUNNABLE = [n for n in FAMILY_PRESETS if n != "vit_giant_patch14_dinov2" and "large" not in n and "so400m" not in n]


# In ci one preset of each kind, each on one framework port in turn (drawn family configs run
# on all three in test_model); the thorough profile runs every preset on every port.
CI_PRESETS = {
    "vit_small_patch14_reg4_dinov2": "torch",
    "vit_base_patch16_siglip_224": "mlx",
    "deit_small_distilled_patch16_224": "torch",
}


@pytest.mark.parametrize("name", RUNNABLE if heavy() else list(CI_PRESETS))
def test_every_port_is_within_its_bound_at_every_stage_of_a_family_preset(name):
    """Each reduced preset (one block, heads 8 wide, 2x3 patches) on trained-like weights; the full-size
    presets run in the thorough profile (test below)."""
    config, _ = reduced(name)
    weights = S.TrainedLike(5)
    case = P.ModelCase(config, weights.make(config), images(config), info={"weights": weights, "preset": name})
    for port in ("torch", "mlx", "jax") if heavy() else (CI_PRESETS[name],):
        P.check_matches_oracle(port, factory(port), case)


@pytest.mark.slow
@pytest.mark.skipif(
    not heavy(),
    reason="full-size presets (DINOv2 at 518: 1370 tokens): the thorough profile "
    "runs them (HYPOTHESIS_PROFILE=thorough)",
)
@pytest.mark.parametrize("name", RUNNABLE)
def test_full_size_family_preset_oracle_equals_timm_and_every_port_is_within_its_bound(name):
    """timm.create_model(name) with its own init, one image: the oracle against timm in float64
    at every stage, then each framework port against the oracle at every stage."""
    config = get_config(name)
    model, state = timm_named_float64(name)
    x = images(config)[:1]
    ref, oracle = timm_taps(model, x), factory("numpy")(config, state)(x)
    assert_oracle_equals_timm_in_float64(oracle, ref, config, name)
    del model, ref
    case = P.ModelCase(config, state, x, info={"weights": "timm init", "preset": name})
    for port in ("torch", "mlx", "jax"):
        P.check_matches_oracle(port, factory(port), case)


def test_an_image_size_with_a_remainder_reads_whole_patches_as_timm_does():
    """timm's stride-p convolution reads floor(H / p) patches (SigLIP so400m/14 at 384: 27 x 27
    of 378 pixels): the oracle equals timm at every stage, and the remainder's pixels change
    nothing, where a pixel inside the grid changes patch_embed (the companion)."""
    config = get_config("vit_test_token").replace(img_size=(18, 27))  # patch 4: remainders 2 and 3
    assert config.grid_size == (4, 6)
    state = init_state(config, seed=3)
    x = images(config)
    ref, oracle = timm_taps(timm_vit(config, state, dtype=torch.float64), x), factory("numpy")(config, state)(x)
    assert_oracle_equals_timm_in_float64(oracle, ref, config, "remainder")
    unread, read = x.copy(), x.copy()
    unread[:, :, 16:, :] += 1.0
    unread[:, :, :, 24:] += 1.0
    read[:, :, 15, 23] += 1.0
    run = factory("numpy")(config, state)
    assert run(unread)["logits"].tobytes() == oracle["logits"].tobytes()
    assert not np.array_equal(run(read)["patch_embed"], oracle["patch_embed"])
