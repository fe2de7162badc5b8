"""Every port against an implementation nobody here wrote: timm's VisionTransformer, built
locally with random weights, its stages read through hooks on its own modules."""

import numpy as np
import pytest
import torch

from conformance import properties as P
from conformance.numerics.error_model import CaseModel
from conformance.profiles import heavy
from conformance.references import timm_state, timm_taps, timm_vit
from conformance.tests.helpers import jax_runs_the_first, run
from impls import get_config, tap_names, tap_shapes
from weights import init_state

CONFIGS = [
    "vit_test_token",
    "vit_test_avg",
    "vit_test_avg_nocls",
    "vit_test_deep",
    "vit_test_embed_norm",
    "vit_test_aimv2",
    "vit_test_sam",
]


def disagreeing_stages(port, model: CaseModel, out, ref) -> list[str]:
    """The stages where a float32 port and float32 timm are further apart than twice the
    propagated bound (each is within one of the truth), in model order."""
    failing = []
    for stage in [s for s in tap_names(model.config) if s in out]:
        try:
            P.check_stage(
                port,
                f"{stage} vs timm",
                out[stage],
                ref[stage],
                model,
                stage,
            )
        except P.PropertyFailure:
            failing.append(stage)
    return failing


def images_for(config, batch=2, seed=0):
    return np.random.default_rng(seed).normal(size=(batch, config.in_chans, *config.img_size)).astype(np.float32)


@pytest.mark.parametrize(
    "name, weights",
    [(name, "project_init") for name in CONFIGS]
    + [("vit_test_token", "timm_init"), ("vit_test_avg_nocls", "timm_init")],
)
def test_port_equals_timm_at_every_stage(port, name, weights):
    """timm's own init (ones/zeros norms, zero biases) and the project's; timm's state_dict is
    fed to the port through the canonical format. Both run in float32, so each is within the
    tolerance of the truth and they are within twice that of each other."""
    jax_runs_the_first(port, name == CONFIGS[0], f"{CONFIGS[0]} (both inits: one program)")
    config = get_config(name)
    torch.manual_seed(3)
    model = timm_vit(config, None if weights == "timm_init" else init_state(config, seed=4))
    state = timm_state(model)
    x = images_for(config, seed=1)
    ref = timm_taps(model, x, tap_shapes(config, len(x)))  # timm's SAM holds its grids and windows NHWC
    out = run(port, config, state, x)
    out = out if isinstance(out, dict) else {"logits": out}
    assert "logits" in out, f"[{port}] returned no logits"
    assert disagreeing_stages(port, CaseModel(config, state, x), out, ref) == [], f"{name}, {weights}"


@pytest.mark.slow
@pytest.mark.skipif(not heavy(), reason="a full-size model: the thorough profile runs it (HYPOTHESIS_PROFILE=thorough)")
@pytest.mark.parametrize("name", ["vit_tiny_patch16_224"])
def test_port_logits_equal_timm_on_a_full_size_model(framework_port, name):
    """A real-size ViT with timm's own init: the max abs logit error is reported in the README."""
    import timm

    torch.manual_seed(0)
    model = timm.create_model(name, pretrained=False).eval()
    config = get_config(name)
    x = images_for(config, batch=2, seed=2)
    with torch.no_grad():
        ref = model(torch.from_numpy(x)).numpy()
    state = timm_state(model)
    out = run(framework_port, config, state, x, taps=False)
    model = CaseModel(config, state, x)
    P.check_stage(
        framework_port,
        "logits vs timm",
        out,
        ref,
        model,
        "logits",
    )


def test_timm_comparison_fails_on_a_port_fed_swapped_norms(framework_port):
    """Companion: the comparison above is not vacuous; norm1/norm2 swapped shows at blocks.0.norm1."""
    config = get_config("vit_test_token")
    model = timm_vit(config, init_state(config, seed=4))
    state = timm_state(model)
    for p in ("weight", "bias"):
        state[f"blocks.0.norm1.{p}"], state[f"blocks.0.norm2.{p}"] = (
            state[f"blocks.0.norm2.{p}"],
            state[f"blocks.0.norm1.{p}"],
        )
    x = images_for(config, seed=1)
    ref, out = timm_taps(model, x), run(framework_port, config, state, x)
    failing = disagreeing_stages(framework_port, CaseModel(config, state, x), out, ref)
    assert failing and failing[0] == "blocks.0.norm1"


@pytest.mark.parametrize("pool", ["avg", "token"])
def test_a_tower_without_a_final_norm_equals_timms_final_norm_false(port, pool):
    """InternViT's and Pixtral's towers end at the last block: timm's ``final_norm=False`` (no
    ``norm``, no ``fc_norm``), the patch tokens' mean or the class token pooled as they are.
    The companion: a port that keeps the final norm (its config's final_norm=True, a unit norm
    loaded) disagrees with timm first at the head's input."""
    jax_runs_the_first(port, pool == "avg", "global_pool='avg'")
    config = get_config("vit_test_token").replace(final_norm=False, global_pool=pool)
    model = timm_vit(config, init_state(config, seed=4))
    state, x = timm_state(model), images_for(config, seed=1)
    assert "norm.weight" not in state and "fc_norm.weight" not in state
    ref, out = timm_taps(model, x), run(port, config, state, x)
    assert disagreeing_stages(port, CaseModel(config, state, x), out, ref) == [], pool
    # the final norm a timm model of this pooling would have: fc_norm after the mean, norm before the token's
    normed = config.replace(final_norm=True)
    where = "fc_norm" if pool == "avg" else "norm"
    unit = {
        f"{where}.weight": np.ones(config.embed_dim, np.float32),
        f"{where}.bias": np.zeros(config.embed_dim, np.float32),
    }
    out = run(port, normed, {**state, **unit}, x)
    # (the reference has no norm stage to disagree at: the first stage after the norm is compared)
    assert disagreeing_stages(port, CaseModel(config, state, x), out, ref)[0] == "pooled"
