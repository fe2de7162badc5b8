"""Blocks and the whole model: every tap of every port against the oracle, batch elements
independent, batch size irrelevant, two calls bitwise identical, each LayerNorm where it belongs."""

import dataclasses

import pytest

from conformance import properties as P
from conformance import strategies as S
from conformance.tests.helpers import budget, check_property, drawn, factory, jax_runs_the_first


HARD = S.hard_model_cases()


@drawn(None, examples=[dict(case=case) for case in HARD], case=S.model_cases())
def test_every_tap_of_every_port_matches_the_oracle(port, case):
    P.check_matches_oracle(port, factory(port), case)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_every_tap_matches_the_oracle_in_bfloat16_and_float16(framework_port, dtype):
    """The built-in ports in low precision, with softmax, LayerNorm statistics and the token mean
    in float32, within bounds that scale with the dtype's roundoff."""
    jax_runs_the_first(framework_port, dtype == "bfloat16", "bfloat16")
    _every_tap_in_low_precision(framework_port=framework_port, dtype=dtype)


@drawn(budget(5, minimum=1), examples=[dict(case=HARD[2]), dict(case=HARD[3])], case=S.model_cases())
def _every_tap_in_low_precision(framework_port, dtype, case):
    P.check_matches_oracle(framework_port, factory(framework_port), dataclasses.replace(case, dtype=dtype))


@drawn(budget(2), case=S.model_cases(min_batch=2), other=S.image_cases())
def test_a_batch_elements_output_does_not_depend_on_the_others(port, case, other):
    (ph, pw), (H, W) = case.config.patch_size, case.images.shape[2:]  # the case's own grid (dynamic_img_size)
    other_images = S.make_images(case.config, 3, other.kind, other.seed, (H // ph, W // pw))
    P.check_batch_elements_independent(port, factory(port), case, other_images)


@drawn(budget(2), case=S.model_cases(min_batch=2))
def test_batch_size_does_not_change_per_element_results(port, case):
    P.check_batch_size_invariant(port, factory(port), case)


@drawn(budget(2), case=S.model_cases())
def test_two_calls_give_bitwise_identical_results(port, case):
    P.check_deterministic(port, factory(port), case)


@drawn(budget(2), examples=[dict(case=HARD[0]), dict(case=HARD[2])], case=S.model_cases())
def test_each_layernorm_is_used_where_it_belongs(port, case):
    check_property(P.check_layernorms_in_place, port, factory(port), case)


# ----------------------------------------------------------------------------- companions
