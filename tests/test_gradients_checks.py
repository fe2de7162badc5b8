"""The companions of conformance/tests/test_gradients.py: each of its properties fails on a deliberately
broken port (and the project's checks that take no port). Not shipped."""

import dataclasses
import json
from functools import cache
import numpy as np
import pytest

from conformance.tests.helpers import DATA_DIR
from conformance import properties as P
from conformance import strategies as S
from conformance.numerics.gradients import (
    GRAD_DTYPES,
    KINDS,
    GradModel,
    compare_gradients,
    compare_step,
    describe,
    draw_loss,
    first_failure,
    grad_tolerance,
)
from conformance.profiles import heavy
from conformance.verify.grad import load_grad_factory
from conformance.zoo import MUTANTS
from conformance.zoo.backward_mutants import OPTIMIZER_MUTANTS, forward_factory
from impls import get_config, load_factory
from impls import numpy_vit as N
from weights import init_state
from conformance.tests.test_gradients import HP, ONE_PRESET_IN_CI, PRESETS, _case, _preset_model, _step_case  # noqa: F401


FD_PRESETS = ["vit_test_token", "vit_test_dinov2", "vit_test_siglip", "vit_test_clip"]


# Five-point central differences of the float64 oracle, h = 1e-3 (times the entry's size above
# 1): truncation h^4/30 |L^(5)| near 1e-13. Rounding: each loss carries at most ~100 ulp of
# |L| (taken as the allowance), times the stencil's 18/12, over h. A difference is allowed
# FD_BOUND of the tensor's gradient scale plus that rounding; so a gradient 1e-7 of the loss
# (the MAP head's query weights) is judged on what the differences resolve. Measured over these
# presets: at most 1.4e-8 of the scale (the class token's, where truncation leads), so
# FD_BOUND leaves 7x; a reference with the tanh GELU's derivative is 49x the allowance off.
FD_STEP = 1e-3


FD_BOUND = 1e-7


FD_ROUNDING = 1.5 * 100 * np.finfo(np.float64).eps


def finite_difference_error(config, state, images, loss, reference, entries=2, h=FD_STEP, seed=0) -> tuple[float, str]:
    """Largest |FD - reference| over its allowance (above), at ``entries`` drawn entries of
    every parameter and of the images: at most 1 passes. The plain NumPy oracle, below its
    float32 input check, is differenced."""
    rng = np.random.default_rng(seed)
    model = N.VisionTransformer(config)
    N.load_state_dict(model, N.to_native(state, N.FRAMEWORK))
    x0 = images.astype(np.float64)
    value0 = N.loss_value(model.forward_head(model.forward_features(x0)), loss)

    def derivative(key, idx, step):
        def at(k):
            if key == "images":
                x = x0.copy()
                x[idx] += k * step
                return N.loss_value(model.forward_head(model.forward_features(x)), loss)
            saved = dict(model.named_parameters())[key]
            p = saved.copy()
            p[idx] += k * step
            model.set_parameter(key, p)
            try:
                return N.loss_value(model.forward_head(model.forward_features(x0)), loss)
            finally:
                model.set_parameter(key, saved)

        return (-at(2) + 8 * at(1) - 8 * at(-1) + at(-2)) / (12 * step)

    worst, where = 0.0, ""
    for key, value in [*state.items(), ("images", images)]:  # the oracle's keys are the canonical ones
        g = reference["images"] if key == "images" else reference["params"][key]
        for _ in range(entries):
            idx = tuple(int(rng.integers(n)) for n in value.shape)
            step = h * max(1.0, abs(float(value[idx])))
            allowance = FD_BOUND * float(np.max(np.abs(g))) + FD_ROUNDING * max(1.0, abs(value0)) / step
            err = abs(derivative(key, idx, step) - g[idx]) / allowance
            if err > worst:
                worst, where = err, f"{key}{list(idx)}"
    return worst, where


@cache
def _mutant_case():
    config, state, images = _case("vit_test_token")
    return config, state, images, GradModel(config, state, images, draw_loss(config, 2, "cross_entropy", 3))


BACKWARD = [m for m in MUTANTS.values() if m.level == "gradient"]


def _zero_cotangents(taps: dict) -> list[str]:
    return [k for k, g in taps.items() if not np.any(g)]


USER_PORTS = DATA_DIR / "user_ports.py"


@pytest.fixture(scope="module")
def user_ports():
    """The user's gradient factories, imported from outside the repository as verify does."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("user_grad_ports", USER_PORTS)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


SQUARE = dataclasses.replace(get_config("vit_test_token"), img_size=(16, 16), name=None)


DATA = DATA_DIR


def _model_port(spec):
    import importlib

    from conformance.support import build_config, supports_of

    module, _, attr = spec.partition(":")
    port = getattr(importlib.import_module(module), attr)
    return port, build_config(supports_of(port), SQUARE.to_dict() | {"name": None}) or SQUARE


@pytest.mark.parametrize(
    "kind",
    [
        "cross_entropy",
        pytest.param(
            "linear",
            marks=pytest.mark.skipif(not heavy(), reason="thorough profile: the linear loss (cross-entropy in ci)"),
        ),
    ],
)
@pytest.mark.parametrize("name", FD_PRESETS)
def test_reference_gradient_equals_central_finite_differences(name, kind):
    config, state, images = _case(name)
    loss = draw_loss(config, images.shape[0], kind, 3)
    reference = N.make_grad(config, state)(images, loss)
    worst, where = finite_difference_error(config, state, images, loss, reference)
    assert worst <= 1.0, (
        f"{name}: the reference differs from central differences by {worst:.3g}x the allowance at {where}"
    )


def test_the_finite_difference_check_fails_on_a_reference_with_another_activations_derivative():
    config, state, images = _case("vit_test_token")
    loss = draw_loss(config, 2, "cross_entropy", 3)
    wrong = N.make_grad(config.replace(act_layer="gelu_tanh"), state)(images, loss)
    worst, _ = finite_difference_error(config, state, images, loss, wrong)
    assert worst > 10, worst


def test_a_gross_backward_bug_is_caught_in_bfloat16_too():
    """Companion of the bfloat16 check: the frozen position embedding (a zero gradient) is found
    in bfloat16 on seeded weights (4 times its tolerance in verify; on trained-like weights not
    even that, and subtler mutants only in float32: docs/gradients.md)."""
    from conformance.zoo.torch_mutants import pos_embed_frozen as torch_pos_embed_frozen

    config, state, images = _case("vit_test_token")
    model = GradModel(config, state, images, draw_loss(config, 2, "cross_entropy", 3), dtype="bfloat16")
    failure = first_failure(
        compare_gradients(torch_pos_embed_frozen(config, state, dtype="bfloat16")(images, model.loss), model)
    )
    assert failure is not None and failure.name == "pos_embed"


def test_a_headless_models_gradient_weighs_its_features_and_a_frozen_table_is_found():
    """num_classes=0 (a tower: its pooled features are its output): the linear loss draws a weight
    per feature, (B, D), where one per class, (B, 0), made verify --grad exit 3. The built-in
    PyTorch port's gradients are within tolerance; the companion: the frozen position table's is not."""
    from conformance.zoo.torch_mutants import pos_embed_frozen

    config = get_config("vit_test_token").replace(num_classes=0)
    state, images = init_state(config, seed=1), S.make_images(config, 2, "ordinary", 1)
    model = GradModel(config, state, images, draw_loss(config, 2, "linear", 3))
    assert model.loss.weights.shape == (2, config.embed_dim)
    make_grad = load_factory("impls.torch_vit:make_grad")
    assert first_failure(compare_gradients(make_grad(config, state)(images, model.loss), model)) is None
    failure = first_failure(compare_gradients(pos_embed_frozen(config, state)(images, model.loss), model))
    assert failure is not None and failure.name == "pos_embed"


@pytest.mark.parametrize("mutant", BACKWARD, ids=lambda m: m.name)
def test_a_backward_mutant_passes_every_forward_check_and_is_located_by_the_gradient_check(mutant):
    """The zoo's meta-test locates each through verify --grad; here its forward is shown correct,
    which makes it a backward bug, and the property's own check finds it on one case."""
    make_grad = load_factory(mutant.factory)
    config, state, images, model = _mutant_case()
    if mutant.framework != "jax" or heavy():  # XLA compiles the mutant's forward: thorough (its forward is
        # jax.nn.softmax's, the kernel's custom_vjp changing only the backward)
        P.check_matches_oracle(mutant.name, forward_factory(make_grad), P.ModelCase(config, state, images))
    results = compare_gradients(make_grad(config, state)(images, model.loss), model)
    failure = first_failure(results)
    assert failure is not None and failure.name == mutant.first_divergence, describe(results)


def test_the_gradient_check_locates_a_wrong_tap_before_the_parameters_behind_it():
    """Backward order: a cotangent wrong at blocks.1.mlp (the logits' side) is reported before
    the wrong parameter gradients it causes further back."""
    config, state, images, model = _mutant_case()
    got = N.make_grad(config, state)(images, model.loss)
    got["taps"]["blocks.1.mlp"] = got["taps"]["blocks.1.mlp"] * (1 + 1e-3)
    got["params"]["blocks.0.norm1.weight"] = got["params"]["blocks.0.norm1.weight"] * (1 + 1e-3)
    failure = first_failure(compare_gradients(got, model))
    assert (failure.kind, failure.name) == ("taps", "blocks.1.mlp")


def test_the_gradient_tolerances_are_the_margin_times_the_calibrated_largest_ratios():
    """Every tolerance (taps, parameters, images; float32 and bfloat16) comes from
    grad_calibration.json as committed."""
    from conformance.numerics.gradients import CALIBRATION, MARGIN

    calibration = json.loads(CALIBRATION.read_text())
    assert set(calibration) == set(GRAD_DTYPES)
    for dtype, record in calibration.items():
        assert record["cases"] >= 60
        for of in KINDS:
            assert set(record["by_port"][of]) == {"torch", "mlx", "jax"}
            assert grad_tolerance(dtype, of) == pytest.approx(MARGIN * max(record["by_port"][of].values()))


def test_every_taps_cotangent_lies_on_the_forwards_path():
    """A tap recorded beside the forward (the MAP head's weights once were: its perturbation
    reached nothing) has a zero cotangent; every tap of the reference has a nonzero one."""
    for name in PRESETS:
        config, _, _, model = _preset_model(name, trained=True)
        assert not _zero_cotangents(model.reference["taps"]), name


def test_the_path_check_fails_on_a_tap_recorded_beside_the_forward():
    """Companion: taps that record blocks.0.attn.weights without passing the perturbed value on."""
    from impls import Perturbed

    class Beside(Perturbed):
        def perturb(self, name, value):
            moved = super().perturb(name, value)
            return value if name == "blocks.0.attn.weights" else moved

    config, state, images = _case("vit_test_token")
    grads = N.make_grad(config, state)(images, draw_loss(config, 2, "cross_entropy", 3), perturbed=Beside)
    assert _zero_cotangents(grads["taps"]) == ["blocks.0.attn.weights"]


@pytest.mark.parametrize(
    "name",
    [
        "vit_test_siglip",
        pytest.param("vit_test_token", marks=ONE_PRESET_IN_CI),
        pytest.param("vit_test_dinov2", marks=ONE_PRESET_IN_CI),
    ],
)
def test_timms_vision_transformer_in_training_mode_matches_the_reference(name):
    """timm's own model, an independent gradient oracle, as fine-tuning runs it: model.train()
    with every dropout and drop-path rate 0, through verify --grad on trained-like weights (its
    taps' cotangents by retain_grad on what its modules emit)."""
    from conformance.references import timm_make_grad
    from conformance.verify.grad import format_grad_report, verify_grad

    config = get_config(name)
    report = verify_grad(timm_make_grad, config, port="timm", state=S.TrainedLike(6).make(config))
    assert report.conformant and report.taps, format_grad_report(report)


@pytest.mark.parametrize("rate", ["drop_rate", "attn_drop_rate", "drop_path_rate"])
def test_dropout_or_drop_path_active_in_training_mode_is_caught(rate):
    """Companion: the same model with one rate at 0.1 in training mode is not conformant."""
    from conformance.references import timm_make_grad

    config, state, images, model = _mutant_case()
    results = compare_gradients(timm_make_grad(config, state, **{rate: 0.1})(images, model.loss), model)
    failure = first_failure(results)
    assert failure is not None and failure.error > 100 * failure.tol, describe(results)


def test_a_train_mode_switch_at_rate_0_gives_eval_numerics_bitwise():
    """Each framework's dropout and drop-path at rate 0 in training mode, forward and backward,
    is the identity, bitwise: torch's nn.Dropout, F.scaled_dot_product_attention's dropout_p,
    timm's DropPath, mlx.nn.Dropout, flax.nnx.Dropout; and timm's whole model in train() mode
    gives its eval() gradients."""
    import jax
    import mlx.core as mx
    import mlx.nn as mnn
    import torch
    from flax import nnx
    from timm.layers import DropPath

    from conformance.references import timm_make_grad

    x = np.random.default_rng(0).standard_normal((2, 3, 5, 4)).astype(np.float32)
    g = np.random.default_rng(1).standard_normal(x.shape).astype(np.float32)
    for layer in (torch.nn.Dropout(0.0), DropPath(0.0)):
        t = torch.tensor(x, requires_grad=True)
        out = layer.train()(t)
        out.backward(torch.tensor(g))
        assert np.array_equal(out.detach().numpy(), x) and np.array_equal(t.grad.numpy(), g), type(layer).__name__
    q, k, v = (torch.tensor(x[:, :, :, :]) for _ in range(3))
    assert torch.equal(
        torch.nn.functional.scaled_dot_product_attention(q, k, v, dropout_p=0.0),
        torch.nn.functional.scaled_dot_product_attention(q, k, v),
    )
    drop = mnn.Dropout(0.0)
    drop.train()
    out, (dx,) = mx.vjp(drop, [mx.array(x)], [mx.array(g)])
    assert np.array_equal(np.array(out[0]), x) and np.array_equal(np.array(dx), g)
    drop = nnx.Dropout(0.0, deterministic=False, rngs=nnx.Rngs(0))
    out, vjp = jax.vjp(drop, x)
    assert np.array_equal(np.asarray(out), x) and np.array_equal(np.asarray(vjp(g)[0]), g)
    config, state, images = _case("vit_test_token")
    loss = draw_loss(config, 2, "cross_entropy", 3)
    train, evaluate = (timm_make_grad(config, state, train=mode)(images, loss) for mode in (True, False))
    assert all(np.array_equal(train["params"][k], evaluate["params"][k]) for k in train["params"])
    assert np.array_equal(train["images"], evaluate["images"])


def test_verify_grad_locates_a_backward_mutant_on_a_weights_file_and_writes_its_report(cli, tmp_path):
    """The zoo's meta-test runs every mutant on the seeded cases; here the command as typed, on
    the user's weights (two cases)."""
    from weights import save_state

    config = get_config("vit_test_token")
    save_state(init_state(config, seed=4), tmp_path / "w.safetensors", config)
    code, out, err = cli(
        "verify",
        "--grad",
        "conformance.zoo.torch_mutants:attn_residual_detached",
        "--weights",
        str(tmp_path / "w.safetensors"),
        "--json",
        str(tmp_path / "r.json"),
    )
    assert code == 1, out + err
    assert "NOT CONFORMANT: first divergence in backward order: the cotangent of tap blocks.1.attn" in out, out
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["first_divergence"]["name"] == "blocks.1.attn" and not report["conformant"]
    assert report["taps"] and len(report["cases"]) == 2


def test_verify_grad_judges_a_factory_without_taps_on_its_parameters(user_ports):
    from conformance.verify.grad import format_grad_report, verify_grad

    config = get_config("vit_test_token")
    report = verify_grad(user_ports.grad_params_only, config, state=init_state(config, seed=2))
    assert report.conformant and not report.taps, format_grad_report(report)
    assert "no tap cotangents" in format_grad_report(report)
    assert {r.kind for r in report.results} == {"params", "images", "loss"}


@pytest.mark.parametrize(
    "factory, reason",
    [
        ("grad_nan", "params['head.bias'] is not finite"),
        ("grad_no_images", "must return a mapping with 'loss', 'params' and 'images'"),
        ("grad_shared_norm_mapping", "the port changed the state it was handed: replaced 'blocks.0.norm2.weight'"),
    ],
)
def test_verify_grad_names_what_is_wrong_with_a_broken_factory_in_one_line(user_ports, factory, reason):
    from conformance.verify.grad import format_grad_report, verify_grad

    config = get_config("vit_test_token")
    report = verify_grad(getattr(user_ports, factory), config, state=init_state(config, seed=2))
    assert not report.conformant
    assert reason in report.failures[0]["reason"], report.failures
    assert "FAIL backward (batch 3, cross-entropy): " in format_grad_report(report)


@pytest.mark.parametrize(
    "args, message",
    [
        (("torch", "--grad", "torch"), "alone"),
        (("--grad", "torch", "--dtype", "float16"), "float16 gradients are not checked: without loss scaling"),
        (("--grad", "no_such_module:make_grad"), "cannot load gradient factory"),
    ],
)
def test_verify_grad_usage_errors_exit_2_with_the_reason(cli, args, message):
    code, out, err = cli("verify", *args)
    assert code == 2 and message in err, out + err


@pytest.mark.parametrize(
    "spec",
    [
        "conformance.examples.timm_vit:port",
        "my_port:port",
        "conformance.examples.hf_vit:port",
        pytest.param(
            "conformance.examples.nnx_vit:port",
            marks=pytest.mark.skipif(not heavy(), reason="thorough profile: XLA compiles the NNX model's gradient"),
        ),
    ],
)
def test_an_unmodified_models_gradients_come_back_through_its_mapping(spec, monkeypatch):
    """A ModelPort's gradients (verify --grad my_port:port): timm's model (PyTorch, names only),
    the README's MLX model (a rename), a Flax NNX ViT and transformers' ViT (convert functions,
    HF's split q, k, v): each parameter's gradient is brought back through the mapping."""
    from conformance.verify.grad import format_grad_report, verify_grad

    monkeypatch.syspath_prepend(str(DATA))
    _, config = _model_port(spec) if not spec.startswith("my_port") else (None, SQUARE)
    report = verify_grad(load_grad_factory(spec), config, port=spec, state=init_state(config, seed=3))
    assert report.conformant, format_grad_report(report)


def test_a_forward_bug_in_an_unmodified_model_shows_in_its_gradients_from_the_head_back():
    """Companion: the Chinese seed post's einops ViT (its (h d qkv) split, located by verify at
    blocks.0.attn.q) is not conformant in its gradients either: the first wrong one in backward
    order is the logits' cotangent, the logits being already wrong (verify locates the forward)."""
    from conformance.verify.grad import verify_grad

    port, config = _model_port("conformance.examples.seed_einops_vit:port")
    report = verify_grad(port.make_grad, config, port="seed", state=init_state(config, seed=3))
    assert not report.conformant and report.first_divergence.name == "logits"


def test_an_unmodified_pytorch_models_backward_bug_is_located_at_its_stage():
    """timm's model with the attention branch detached after the attention module (an
    activation-checkpointing slip): the forward is bitwise timm's, and the cotangent read at
    the attention module's output, blocks.1.attn, is the first wrong one in backward order."""
    from conformance.capture import ModelPort
    from conformance.examples.timm_vit import build
    from conformance.verify.grad import verify_grad

    def detached(config):
        model = build(config)
        model.blocks[1].ls1.forward = lambda x: x.detach()  # ls1 is an Identity without LayerScale
        return model

    config = SQUARE
    report = verify_grad(ModelPort(detached, rename={}).make_grad, config, state=init_state(config, seed=3))
    assert report.taps and report.first_divergence.name == "blocks.1.attn", report.first_divergence


def test_an_unmodified_mlx_models_backward_bug_is_located_at_its_stage(monkeypatch):
    """The README's MLX model with mx.stop_gradient inside its second block's output projection
    (a frozen layer carried into fine-tuning): its forward is unchanged, the cotangent read at
    that projection's output is right, and its weight's gradient is the first wrong one."""
    import mlx.core as mx
    import mlx.nn as nn

    from conformance.verify.grad import verify_grad

    monkeypatch.syspath_prepend(str(DATA))
    import my_port

    class Frozen(nn.Linear):
        def __call__(self, x):
            return mx.stop_gradient(super().__call__(x))

    def build(config):
        model = my_port.MyViT(config)
        model.layers[1].to_out.__class__ = Frozen
        return model

    port = dataclasses.replace(my_port.port, build=build)
    report = verify_grad(port.make_grad, SQUARE, state=init_state(SQUARE, seed=3))
    assert report.taps and report.first_divergence.name == "blocks.1.attn.proj.weight", report.first_divergence


def test_gradients_of_a_model_whose_mapping_they_cannot_pass_back_are_refused_with_the_reason():
    from conformance.capture import ModelPort
    from conformance.capture.expressible import NotExpressible
    from conformance.examples.linen_vit import port as linen_port
    from conformance.examples.timm_vit import build
    from conformance.support import Unsupported

    with pytest.raises(Unsupported, match="gradients of a flax.linen model are not supported"):
        linen_port.make_grad(_model_port("conformance.examples.linen_vit:port")[1], init_state(SQUARE, seed=3))
    scaled = ModelPort(build, convert=lambda state: {k: 2 * v for k, v in state.items()})
    with pytest.raises(NotExpressible, match="nowhere to go"):  # the forward's strict load: the probe finds no key
        scaled.make_grad(SQUARE, init_state(SQUARE, seed=3))


def test_the_reference_adamw_step_is_torchs_adamw_in_float64():
    """The oracle's step, written from the definition, against torch.optim.AdamW run in float64
    on the same (reference) gradients: the same to float64 rounding."""
    import torch

    config, state, images = _case("vit_test_token")
    loss = draw_loss(config, 2, "cross_entropy", 3)
    reference, grads = N.adamw_step(config, state, images, loss, HP)  # not _step_case: grads needed
    params = {k: torch.tensor(v, dtype=torch.float64, requires_grad=True) for k, v in state.items()}
    for k, p in params.items():
        p.grad = torch.tensor(grads["params"][k], dtype=torch.float64)
    torch.optim.AdamW(params.values(), lr=HP.lr, betas=HP.betas, eps=HP.eps, weight_decay=HP.weight_decay).step()
    worst = max(float(np.max(np.abs(p.detach().numpy() - reference[k]))) for k, p in params.items())
    assert worst <= 8 * np.finfo(np.float64).eps * (1 + HP.lr), worst


def test_timms_rule_exempts_what_timms_param_groups_exempt():
    import timm
    import torch
    from timm.optim import param_groups_weight_decay

    with torch.device("meta"):
        model = timm.create_model("vit_small_patch14_reg4_dinov2", pretrained=False)
    groups = param_groups_weight_decay(model, 0.05, no_weight_decay_list=model.no_weight_decay())
    name = {id(p): k for k, p in model.named_parameters()}
    exempt = {name[id(p)] for g in groups if g["weight_decay"] == 0.0 for p in g["params"]}
    hp = dataclasses.replace(HP, decay="timm")
    assert exempt == {k for k, p in model.named_parameters() if not hp.decays(k, p.ndim)}
    assert {"pos_embed", "cls_token", "reg_token", "blocks.0.ls1.gamma", "norm.weight"} <= exempt


@pytest.mark.parametrize("name", sorted(OPTIMIZER_MUTANTS))
def test_an_optimizer_mutant_is_caught_after_one_step(name):
    step, _, decay = OPTIMIZER_MUTANTS[name]
    config, state, images, loss, hp, reference, bounds = _step_case(decay=decay)
    results = compare_step(step(config, state, images, loss, hp), reference, bounds)
    assert max(r.error for r in results) > 10, describe(results)


@pytest.mark.parametrize(
    "config",
    [get_config("vit_test_token").replace(patch_norm=True, embed_norm=True), get_config("vit_test_beit")],
    ids=["the norms around the patch embedding", "BEiT's relative position bias"],
)
def test_the_reference_gradient_takes_every_transposed_operand(config):
    """The float64 reference traces the patch norm's patches and BEiT's bias table with autograd (a
    transpose given its axes as one tuple: autograd's ArrayBox takes no others); the PyTorch port's
    gradients meet it. The ci profile's drawn configs reached neither; the dev profile's did."""
    from conformance.verify.grad import format_grad_report, verify_grad
    from impls.torch_vit import make_grad

    report = verify_grad(make_grad, config, port="torch", state=init_state(config, seed=3))
    assert report.conformant, format_grad_report(report)
