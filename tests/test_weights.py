"""The canonical format: conversions round-trip bitwise, the initialiser exposes bugs, and every
malformed state or file is refused with an error naming the key, the expectation and the finding."""

import numpy as np
import pytest
from hypothesis import given

from conformance import strategies as S
from impls import ViTConfig, get_config
from weights import (
    FRAMEWORKS,
    WeightError,
    expected_shapes,
    from_native,
    init_state,
    load_state,
    read_config,
    save_state,
    to_native,
    validate_state,
)
from weights.canonical import CONFIG_METADATA_KEY


@pytest.mark.parametrize("framework", FRAMEWORKS)
@given(config=S.configs(), weights=S.weight_cases())
def test_canonical_to_native_and_back_is_bitwise_identical(framework, config, weights):
    state = weights.make(config)
    back = from_native(to_native(state, framework), framework)
    assert list(back) == list(state)
    for key, value in state.items():
        assert back[key].dtype == np.float32 and back[key].shape == value.shape, key
        assert back[key].tobytes() == value.tobytes(), key


def test_native_layouts_are_the_frameworks_own():
    config = get_config("vit_test_token")
    state = init_state(config)
    w = state["patch_embed.proj.weight"]  # OIHW
    assert np.array_equal(to_native(state, "mlx")["patch_embed.proj.weight"], w.transpose(0, 2, 3, 1))
    flax = to_native(state, "jax")
    assert np.array_equal(flax["patch_embed.proj.kernel"], w.transpose(2, 3, 1, 0))
    assert np.array_equal(flax["blocks.0.attn.qkv.kernel"], state["blocks.0.attn.qkv.weight"].T)
    assert np.array_equal(flax["blocks.1.norm2.scale"], state["blocks.1.norm2.weight"])
    assert "blocks.0.norm1.weight" not in flax and "head.kernel" in flax
    assert to_native(state, "numpy")["pos_embed"].dtype == np.float64


def test_conv_layout_is_decided_by_name_even_when_shapes_are_ambiguous():
    # in_chans == patch size: an OIHW kernel (D, 4, 4, 4) could be read as OHWI by its shape.
    config = ViTConfig(img_size=8, patch_size=4, in_chans=4, embed_dim=4, depth=1, num_heads=1, num_classes=4)
    state = init_state(config)
    native = to_native(state, "mlx")["patch_embed.proj.weight"]
    assert np.array_equal(native, state["patch_embed.proj.weight"].transpose(0, 2, 3, 1))
    assert not np.array_equal(native, state["patch_embed.proj.weight"])


def test_unknown_framework_is_refused():
    with pytest.raises(ValueError, match="'tensorflow'"):
        to_native({}, "tensorflow")


@pytest.mark.parametrize("name", ["vit_tiny_patch16_224", "vit_test_dinov2", "vit_test_clip", "vit_test_siglip"])
def test_initialiser_draws_every_layernorm_distinct_and_away_from_identity(name):
    config = get_config(name)
    state = init_state(config, seed=3)
    norms = {k: v for k, v in state.items() if "norm" in k}
    weights_ = [v for k, v in norms.items() if k.endswith("weight")]
    biases = [v for k, v in norms.items() if k.endswith("bias")]
    assert all(np.abs(w - 1).min() >= 0.25 for w in weights_)
    assert all(np.abs(b).min() >= 0.05 for b in biases)
    for group in (weights_, biases):
        for i in range(len(group)):
            for j in range(i + 1, len(group)):
                assert not np.array_equal(group[i], group[j])
    # Linear biases are drawn, so a dropped qkv bias is visible.
    assert all(np.abs(v).max() > 0 for k, v in state.items() if k.endswith("bias"))


def test_initialiser_is_seeded_and_float32_and_scale_moves_the_matrices():
    config = get_config("vit_test_avg")
    a, b, c = init_state(config, seed=1), init_state(config, seed=1), init_state(config, seed=2)
    assert all(a[k].tobytes() == b[k].tobytes() for k in a)
    assert any(a[k].tobytes() != c[k].tobytes() for k in a)
    assert all(v.dtype == np.float32 for v in a.values())
    big = init_state(config, seed=1, scale=10.0)
    key = "blocks.0.attn.qkv.weight"
    assert 8 < big[key].std() / a[key].std() < 12
    assert np.array_equal(big["blocks.0.norm1.weight"], a["blocks.0.norm1.weight"])
    validate_state(a, config)


# ----------------------------------------------------------------------------- validation

CONFIG = get_config("vit_test_token")


def _broken(change):
    state = init_state(CONFIG)
    change(state)
    return state


@pytest.mark.parametrize(
    "change, words",
    [
        (lambda s: s.pop("blocks.1.norm2.bias"), ["missing key 'blocks.1.norm2.bias'", "(24,)"]),
        (
            lambda s: s.update({"blocks.0.attn.q.weight": np.zeros((24, 24), np.float32)}),
            ["unexpected key 'blocks.0.attn.q.weight'", "(24, 24)"],
        ),
        (
            lambda s: s.update({"blocks.0.attn.qkv.weight": np.zeros((24, 72), np.float32)}),
            ["'blocks.0.attn.qkv.weight'", "expected shape (72, 24)", "found (24, 72)"],
        ),
        (lambda s: s.update({"head.bias": np.zeros(7, np.int64)}), ["'head.bias'", "float", "int64"]),
        (lambda s: s["pos_embed"].__setitem__((0, 1, 2), np.nan), ["'pos_embed'", "finite", "1 NaN"]),
        (lambda s: s["cls_token"].__setitem__((0, 0, 0), np.inf), ["'cls_token'", "finite", "1 Inf"]),
        (lambda s: s.update({"norm.weight": [1.0] * 24}), ["'norm.weight'", "NumPy array", "list"]),
    ],
    ids=["missing", "unexpected", "shape", "dtype", "nan", "inf", "not-an-array"],
)
def test_bad_state_is_refused_naming_key_expectation_and_finding(change, words):
    with pytest.raises(WeightError) as info:
        validate_state(_broken(change), CONFIG)
    for word in words:
        assert word in str(info.value)


def test_every_problem_is_listed_in_one_error():
    state = _broken(lambda s: (s.pop("head.weight"), s.update({"extra": np.zeros(1, np.float32)})))
    with pytest.raises(WeightError) as info:
        validate_state(state, CONFIG)
    assert "2 problem(s)" in str(info.value) and "'head.weight'" in str(info.value) and "'extra'" in str(info.value)


@pytest.mark.parametrize("impl", ["numpy", "torch", "mlx", "jax"])
def test_every_port_refuses_a_bad_state_before_loading(impl):
    from conformance.tests.helpers import factory

    with pytest.raises(WeightError, match="missing key 'blocks.0.attn.qkv.bias'"):
        factory(impl)(CONFIG, _broken(lambda s: s.pop("blocks.0.attn.qkv.bias")))


@pytest.mark.parametrize("impl", ["numpy", "torch", "mlx", "jax"])
def test_every_port_loader_is_strict_on_native_tensors(impl):
    """Below validation, each framework's own loading path refuses a mis-converted state."""
    import importlib

    module = importlib.import_module(f"impls.{impl}_vit")
    native = to_native(init_state(CONFIG), module.FRAMEWORK)
    key = next(k for k in native if k.startswith("blocks.0.attn.qkv."))
    if impl == "jax":
        model = module.nnx.eval_shape(lambda: module.VisionTransformer(CONFIG, rngs=module.nnx.Rngs(0)))
    else:
        model = module.VisionTransformer(CONFIG)
    bad = dict(native, **{key: native[key].T.copy()})
    with pytest.raises(WeightError, match=f"'{key}'"):
        module.load_state_dict(model, bad)
    with pytest.raises(WeightError, match="missing key"):
        module.load_state_dict(model, {k: v for k, v in native.items() if k != key})


# ----------------------------------------------------------------------------- files


def test_safetensors_file_round_trips_with_its_config(tmp_path):
    state = init_state(CONFIG, seed=5)
    path = tmp_path / "w.safetensors"
    save_state(state, path, CONFIG)
    assert read_config(path) == CONFIG
    loaded = load_state(path)
    assert list(loaded) == list(state) and all(loaded[k].tobytes() == state[k].tobytes() for k in state)


def test_file_for_another_config_is_refused(tmp_path):
    path = tmp_path / "w.safetensors"
    save_state(init_state(CONFIG), path, CONFIG)
    with pytest.raises(WeightError, match=r"'blocks.0.norm1.weight': expected shape \(16,\), found \(24,\)"):
        load_state(path, get_config("vit_test_avg"))


def test_missing_unreadable_and_config_less_files_are_refused(tmp_path):
    from safetensors.numpy import save_file

    with pytest.raises(WeightError, match="does not exist"):
        load_state(tmp_path / "nope.safetensors", CONFIG)
    junk = tmp_path / "junk.safetensors"
    junk.write_bytes(b"\x00" * 64)
    with pytest.raises(WeightError, match="not a readable safetensors file"):
        load_state(junk, CONFIG)
    bare = tmp_path / "bare.safetensors"
    save_file(init_state(CONFIG), str(bare))
    with pytest.raises(WeightError, match=CONFIG_METADATA_KEY):
        load_state(bare)
    assert set(load_state(bare, CONFIG)) == set(expected_shapes(CONFIG))
