"""A small config's given cases hold their error models by content (conformance/verify/cases.py,
``held_models``): the same weights and images verified again reuse the oracle and its noisy runs;
weights that differ in one element, another dtype, or arrays changed after the fact never do."""

import ml_dtypes
import numpy as np

from conformance.verify.cases import Case, held_models
from conformance.verify.forward import verify
from impls import get_config, torch_vit
from tests.capture_cases import quick_cases

CONFIG = get_config("vit_test_token")


def _changed(case: Case, key: str = "blocks.0.attn.qkv.weight") -> Case:
    state = {k: np.array(v) for k, v in case.state.items()}
    state[key].flat[7] = np.nextafter(state[key].flat[7], np.inf, dtype=state[key].dtype)
    return Case(case.name, np.array(case.images), state)


def test_a_case_of_equal_content_reuses_its_model_and_any_other_does_not():
    case = quick_cases(CONFIG)[0]
    ((_, model),) = held_models(CONFIG, [case], "float32")
    equal = Case(case.name, np.array(case.images), {k: np.array(v) for k, v in case.state.items()})
    assert held_models(CONFIG, [equal], "float32")[0][1] is model
    assert held_models(CONFIG, [_changed(case)], "float32")[0][1] is not model  # one ulp of one weight
    assert held_models(CONFIG, [case], "bfloat16")[0][1] is not model
    # weights stored in bfloat16 (ml_dtypes: NumPy refuses them a buffer) are keyed by their bytes too
    low = Case(case.name, case.images, {k: v.astype(ml_dtypes.bfloat16) for k, v in case.state.items()})
    low_model = held_models(CONFIG, [low], "bfloat16")[0][1]
    assert low_model is not held_models(CONFIG, [case], "bfloat16")[0][1]
    assert held_models(CONFIG, [Case(low.name, low.images, dict(low.state))], "bfloat16")[0][1] is low_model
    case.images[0, 0, 0, 0] += 1.0  # the caller's array changed after the fact: a case of its own
    assert held_models(CONFIG, [case], "float32")[0][1] is not model
    assert not model.images.flags.writeable and model.images[0, 0, 0, 0] != case.images[0, 0, 0, 0]


def test_a_port_verified_on_other_weights_is_judged_on_those_not_on_a_model_held_before():
    """The same names and images, other weights: a port computing on the weights it is handed is
    conformant on both; the companion, a port that kept the first weights, is not on the second."""
    first = quick_cases(CONFIG)[:1]
    second = [_changed(first[0], "head.weight")]
    second[0].state["head.weight"] *= 1.5
    assert verify(torch_vit.make, CONFIG, cases=first).conformant
    assert verify(torch_vit.make, CONFIG, cases=second).conformant
    stale = verify(lambda config, state: torch_vit.make(config, first[0].state), CONFIG, cases=second)
    assert not stale.conformant and stale.first_divergence == "logits"


def test_a_given_case_larger_than_a_seeded_one_is_streamed_not_held():
    """A batch above the seeded cases' (3) is streamed as before, its oracle let go as it is read;
    the companion, the same images three at a time, is held."""
    from conformance.verify import cases as C

    case = quick_cases(CONFIG, seed=5)[0]
    images = np.concatenate([case.images, case.images[:2]])  # 5 images
    large = Case("five images", images, case.state)
    C._HELD.clear()
    assert verify(torch_vit.make, CONFIG, cases=[large]).conformant and not C._HELD
    assert verify(torch_vit.make, CONFIG, cases=[case]).conformant and len(C._HELD) == 1
