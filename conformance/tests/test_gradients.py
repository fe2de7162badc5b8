"""Backward conformance: the float64 reference gradient equals central finite differences of
the NumPy oracle; every port's gradients of a scalar loss (cross-entropy, a linear functional of
the logits), at every tap, per parameter and for the images, are within the propagated rounding
of the reference (GradModel) times the calibrated tolerance, on drawn configs and weights
(trained-like ones included) and on the presets; backward mutants, whose forward is the correct
port's, are located at their stage and pass every forward check; one AdamW step of every port is
within a bound derived from the gradient's, and optimizer mutants are not."""

import dataclasses
from functools import cache, lru_cache

import pytest
from hypothesis import assume
from hypothesis import strategies as st

from conformance import strategies as S
from conformance.numerics.gradients import (
    GradModel,
    compare_gradients,
    compare_step,
    describe,
    draw_loss,
    step_bound,
)
from conformance.profiles import heavy
from conformance.tests.helpers import budget, drawn, grad_factory
from impls import FRAMEWORK_PORTS, AdamW, get_config
from impls import numpy_vit as N
from weights import init_state

THOROUGH = pytest.mark.skipif(not heavy(), reason="thorough profile: one more config for JAX to compile")
ONE_PRESET_IN_CI = pytest.mark.skipif(not heavy(), reason="thorough profile: one preset in ci")


def _case(name, batch=2, seed=1):
    config = get_config(name)
    return config, init_state(config, seed=seed), S.make_images(config, batch, "ordinary", seed)


@lru_cache(maxsize=16)  # the ci profile draws the same cases for every port
def _drawn_case(config, weights, batch, kind, dtype):
    state = weights.make(config)
    images = S.make_images(config, batch, "ordinary", weights.seed % 2**20)
    loss = draw_loss(config, batch, kind, weights.seed % 2**20)
    return state, images, GradModel(config, state, images, loss, dtype=dtype)


@drawn(
    budget(3),
    config=S.grad_configs(max_depth=2),
    weights=S.model_weights(),
    batch=st.integers(1, 3),
    kind=st.sampled_from(["cross_entropy", "linear"]),
)
def test_every_taps_and_parameters_gradient_and_the_images_match_the_reference(grad_port, config, weights, batch, kind):
    """Drawn configs, weights at every scale and offset and trained-like ones, in the run's
    dtype (--dtype bfloat16 too); a gradient factory that returns no tap cotangents is judged on
    its parameters' and the images'."""
    if grad_port == "jax" and not heavy():
        pytest.skip(
            "thorough profile: XLA compiles each drawn config's gradient (2 to 4 s); in ci the JAX port's "
            "gradients are checked on vit_test_token with trained-like weights, its AdamW step and a mutant"
        )
    dtype = S.current_dtype()
    if dtype == "float16":
        pytest.skip("float16 gradients are not checked: without loss scaling they underflow (docs/gradients.md)")
    state, images, model = _drawn_case(config, weights, batch, kind, dtype)
    assume(model.beyond_range() is None)
    factory = grad_factory(grad_port)
    got = (factory(config, state) if dtype == "float32" else factory(config, state, dtype=dtype))(images, model.loss)
    results = compare_gradients(got, model)
    if grad_port in FRAMEWORK_PORTS:
        assert {r.name for r in results if r.kind == "taps"} == set(model.reference["taps"])
    assert all(r.ok for r in results), (
        f"{grad_port}, {config}, {weights}, {model.loss.describe()}:\n{describe(results)}"
    )


CI_PRESETS = ("vit_test_token", "vit_test_dinov2", "vit_test_siglip")
PRESETS = [
    "vit_test_token",
    "vit_test_avg",
    "vit_test_avg_nocls",
    "vit_test_deep",
    "vit_test_dinov2",
    "vit_test_registers_avg",
    "vit_test_dynamic",
    "vit_test_clip",
    "vit_test_siglip",
    "vit_test_avg_100_tokens",
]


@cache
def _preset_model(name, trained=False):
    config = get_config(name)
    state = (S.TrainedLike(5) if trained else S.WeightCase(5, 1.0)).make(config)
    images = S.make_images(config, 2, "ordinary", 5)
    return config, state, images, GradModel(config, state, images, draw_loss(config, 2, "cross_entropy", 5))


@pytest.mark.parametrize("trained", [False, True], ids=["seeded", "trained_like"])
@pytest.mark.parametrize("name", PRESETS)
def test_every_presets_gradients_match_the_reference(framework_port, name, trained):
    """The test presets (timm's options, small), seeded and trained-like."""
    import importlib

    if not heavy() and (
        not trained or name not in CI_PRESETS or (framework_port == "jax" and name != "vit_test_token")
    ):
        pytest.skip(
            "thorough profile: in ci trained-like weights on three presets (JAX on one); the drawn "
            "property covers the options"
        )
    config, state, images, model = _preset_model(name, trained)
    got = importlib.import_module(f"impls.{framework_port}_vit").make_grad(config, state)(images, model.loss)
    results = compare_gradients(got, model)
    assert all(r.ok for r in results), f"{framework_port}, {name}:\n{describe(results)}"


@pytest.mark.parametrize("name", ["vit_test_token", pytest.param("vit_test_siglip", marks=ONE_PRESET_IN_CI)])
def test_every_ports_bfloat16_gradients_match_the_reference(framework_port, name):
    """bfloat16, as mixed-precision fine-tuning computes: the same propagated bound with
    bfloat16's storage rounding, and bfloat16's own calibrated tolerance (JAX's in thorough)."""
    import importlib

    if framework_port == "jax" and not heavy():
        pytest.skip("thorough profile: one more program for XLA to compile")
    config = get_config(name)
    state, images = S.TrainedLike(5).make(config), S.make_images(config, 2, "ordinary", 5)
    model = GradModel(config, state, images, draw_loss(config, 2, "cross_entropy", 5), dtype="bfloat16")
    got = importlib.import_module(f"impls.{framework_port}_vit").make_grad(config, state, dtype="bfloat16")(
        images, model.loss
    )
    results = compare_gradients(got, model)
    assert all(r.ok for r in results), f"{framework_port}, {name}:\n{describe(results)}"


@pytest.mark.skipif(not heavy(), reason="thorough profile: a full-size model's float64 gradient")
def test_a_full_size_presets_gradients_match_the_reference(framework_port):
    import importlib

    config = get_config("vit_tiny_patch16_224")
    state = S.TrainedLike(3).make(config)
    images = S.make_images(config, 1, "ordinary", 3)
    model = GradModel(config, state, images, draw_loss(config, 1, "cross_entropy", 3))
    got = importlib.import_module(f"impls.{framework_port}_vit").make_grad(config, state)(images, model.loss)
    results = compare_gradients(got, model)
    assert all(r.ok for r in results), describe(results)


# ----------------------------------------------------------------------------- train mode


# ----------------------------------------------------------------------------- verify --grad


# ----------------------------------------------------------------------------- unmodified models


# ----------------------------------------------------------------------------- one AdamW step

HP = AdamW()


@cache  # the reference step is computed once per preset, rule and worker
def _step_case(name="vit_test_token", decay="all"):
    config, state, images = _case(name)
    loss = draw_loss(config, 2, "cross_entropy", 3)
    hp = dataclasses.replace(HP, decay=decay)
    reference, _ = N.adamw_step(config, state, images, loss, hp)
    return config, state, images, loss, hp, reference, step_bound(state, GradModel(config, state, images, loss), hp)


@pytest.mark.parametrize(
    "name, decay",
    [("vit_test_token", "all"), ("vit_test_token", "timm"), pytest.param("vit_test_dinov2", "timm", marks=THOROUGH)],
)
def test_one_adamw_step_of_every_port_matches_the_reference(framework_port, name, decay):
    """Decay on every parameter, and timm's rule (no decay on norms, biases, LayerScale gammas
    and the embeddings), each framework's way: param groups, MultiOptimizer, optax's mask."""
    import importlib

    config, state, images, loss, hp, reference, bounds = _step_case(name, decay)
    got = importlib.import_module(f"impls.{framework_port}_vit").adamw_step(config, state, images, loss, hp)
    results = compare_step(got, reference, bounds)
    assert all(r.ok for r in results), describe(results)
