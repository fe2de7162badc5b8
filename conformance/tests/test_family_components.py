"""The ViT family's components, each as the property its name states, on drawn configs with the
option (and the rest of the family drawn around it), every port; each with a companion that
fails on a port with the public bug."""

import pytest
from hypothesis import strategies as st

from conformance import properties as P
from conformance import strategies as S
from conformance.profiles import heavy
from conformance.tests.helpers import budget, check_property, drawn, factory
from weights.options import ACT_LAYERS


def cases(**fixed):
    return S.model_cases(S.family_configs(**fixed), weights=S.weight_cases(S.SCALES[:4], offsets=False))


def _budget(port):
    """JAX compiles every drawn family config (1 to 3 s each): in ci its family configs run in
    test_model's every-tap check, which holds these stages locally; thorough runs all here."""
    if port == "jax" and not heavy():
        pytest.skip("ci budget: the JAX port's family configs run in test_model; thorough runs these properties")


@drawn(budget(5, minimum=1), case=cases(init_values=1e-5), channel=st.integers(0, 63))
def test_layerscale_scales_each_channel_of_its_branch_only(port, case, channel):
    _budget(port)
    check_property(P.check_layerscale_scales_only_its_branch, port, factory(port), case, channel)


@drawn(budget(5, minimum=1), case=cases(reg_tokens=2, global_pool="avg"))
def test_register_tokens_get_position_entries_as_timm_and_are_never_pooled(port, case):
    _budget(port)
    check_property(P.check_prefix_tokens_as_timm, port, factory(port), case)


@drawn(budget(5, minimum=1), case=cases(qk_norm=True))
def test_qk_norm_normalises_each_head_over_head_dim(port, case):
    _budget(port)
    check_property(P.check_qk_norm_per_head, port, factory(port), case)


@drawn(budget(5, minimum=1), case=cases(global_pool="map"))
def test_the_map_head_is_attention_of_the_learned_latent_over_the_patch_tokens(port, case):
    _budget(port)
    check_property(P.check_map_head_queries_with_the_latent, port, factory(port), case)


@drawn(
    budget(5, minimum=1),
    case=cases(act_layer=ACT_LAYERS[1]) | cases(act_layer=ACT_LAYERS[2]) | cases(mlp_layer="swiglu"),
)
def test_each_activation_is_what_its_name_says(port, case):
    _budget(port)
    check_property(P.check_activation_is_the_named_one, port, factory(port), case)


# ----------------------------------------------------------------------------- companions
