"""The error model's runs, streamed for a full-size case: the clean run and the noisy runs go in
step a stage at a time, in threads, the noisy runs following the clean step's contractions; what
they judge is what running them whole, one after another, judges."""

import numpy as np
import pytest

from conformance.numerics import error_model as E
from conformance.numerics.compare import compare_outputs
from conformance import strategies as S
from conformance.tests.helpers import factory
from impls import get_config


# ViT-Ti's widths on 50 tokens, two blocks: products large enough to be taped (error_model._LARGE)
TAPED = get_config("vit_tiny_patch16_224").replace(img_size=112, depth=2, name="vit_tiny at 112, 2 blocks")


def _case(preset="vit_test_dinov2", weights=S.TrainedLike(5), kind="ordinary"):
    config = TAPED if preset == "taped" else get_config(preset)
    return config, weights.make(config), S.make_images(config, 3, kind, 1)


def _spread_one_run_after_another(model: E.CaseModel) -> dict[str, float]:
    """The noisy runs as defined: each a whole run of the chain from the images, every stage's value
    from that run's own inputs in float64 (no tape) plus N(0, the clean bound²), the runs drawing
    one after another from one generator."""
    clean, bounds = {}, {}
    for name in model.names:
        clean[name], bound = model.evaluate(name, clean)
        bounds[name] = np.broadcast_to(bound, np.shape(clean[name]))
    rng, quiet = np.random.default_rng(model.seed), E.Precision(model.precision.dtype, bounds=False)
    spread = dict.fromkeys(model.names, 0.0)
    for _ in range(model._run().runs):
        noisy = {}
        for name in model.names:
            value = model.evaluate(name, noisy, quiet)[0]
            noisy[name] = value + rng.standard_normal(np.shape(value)) * bounds[name]
            spread[name] = max(spread[name], float(np.abs(noisy[name] - clean[name]).max()))
    return spread


@pytest.mark.parametrize(
    "preset,dtype",
    [("taped", "float32"), ("taped", "bfloat16"), ("vit_test_dinov2", "float32"), ("vit_test_siglip", "bfloat16")],
)
def test_streamed_noisy_runs_are_the_runs_one_after_another(preset, dtype, monkeypatch):
    """The same draws (run r's generator skipped to where run r - 1 stops) and, with the noisy
    runs' large contractions taken as the clean ones plus a float32 difference, the same spread to
    a few 1e-6 (float32's rounding of the difference) at every stage."""
    config, state, images = _case(preset)
    tapes = []
    init = E.Tape.__init__
    monkeypatch.setattr(E.Tape, "__init__", lambda self: init(self) or tapes.append(self))
    expected = _spread_one_run_after_another(E.CaseModel(config, state, images, dtype))
    streamed = E.CaseModel(config, state, images, dtype, stream=True)
    with E.parallel():
        got = {name: streamed.spread(name) for name in streamed.names}
    worst = max(abs(got[n] / expected[n] - 1) for n in streamed.names)
    assert worst < 1e-4, worst
    assert any(t.calls for t in tapes) == (preset == "taped")  # products taped where they are large
    # companion: other draws are another spread, by far more than that
    other = E.CaseModel(config, state, images, dtype, seed=1, stream=True)
    assert max(abs(other.spread(n) / expected[n] - 1) for n in other.names) > 1e-2


def test_a_streamed_case_judges_every_stage_as_a_held_one():
    """compare_outputs on a streamed model (threads, the oracle let go) gives the held model's
    results, ratio for ratio; the oracle is read in model order only."""
    config, state, images = _case()
    out = factory("torch")(config, state)(images)
    held = compare_outputs(out, E.CaseModel(config, state, images))
    streamed_model = E.CaseModel(config, state, images, stream=True)
    with E.parallel():
        streamed = compare_outputs(out, streamed_model)
    assert [(r.name, r.ratio, r.e2e_ratio, r.ok) for r in streamed] == [
        (r.name, r.ratio, r.e2e_ratio, r.ok) for r in held
    ]
    with pytest.raises(KeyError, match="let go"):  # what was judged is not held
        streamed_model.oracle["patch_embed"]


def test_a_streamed_case_beyond_the_dtypes_range_is_found_as_it_runs():
    """float16, huge images on weights at 64x timm's spread: the oracle leaves float16's range; the
    held model says so before any port runs, the streamed one raises BeyondRange when it gets there."""
    config, state, images = _case("vit_test_token", S.WeightCase(4, 64.0), "huge")
    assert E.CaseModel(config, state, images, "float16").beyond_range()
    streamed = E.CaseModel(config, state, images, "float16", stream=True)
    assert streamed.beyond_range() is None
    with pytest.raises(E.BeyondRange, match="float16"):
        streamed.settle()
    # companion: in float32 the same case is within range, streamed to its end
    E.CaseModel(config, state, images, "float32", stream=True).settle()


@pytest.mark.parametrize("scale", [1e-30, 1.0, 1e20])
def test_contraction_magnitudes_in_float32_hold_at_any_scale(scale):
    """(x²)(w²)ᵀ on row-scaled float32 operands equals float64's to float32's rounding, exact zeros
    kept, at scales whose squares leave float32's range."""
    rng = np.random.default_rng(0)
    x, w = rng.normal(size=(2, 6, 40)) * scale, rng.normal(size=(9, 40)) / scale
    x[0, 2] = 0.0
    exact, got = (x * x) @ (w * w).T, E.squares(x, w)
    nonzero = exact != 0
    assert np.all(got[~nonzero] == 0) and np.abs(got[nonzero] / exact[nonzero] - 1).max() < 1e-5
    # companion: the unscaled float32 squares fail at the extremes (what the scaling is for)
    with np.errstate(over="ignore", invalid="ignore"):
        naive = (x.astype(np.float32) ** 2) @ (w.astype(np.float32) ** 2).T
    assert (scale == 1.0) == bool(np.all(np.abs(naive[nonzero] / exact[nonzero] - 1) < 1e-5))


def _made_while_held(plan_iter, plan) -> tuple[list, int]:
    """The cases a plan's iterator yields (name, images, state), and the most cases made but not yet
    let go by the consumer at any time (it holds one case at a time)."""
    asked = [0]  # cases the consumer has asked for
    most = [0]

    def logged(make, i):
        def made():
            most[0] = max(most[0], i + 1 - max(asked[0] - 1, 0))  # made, less those handed out
            return make()

        made.uses_base, made.memo = make.uses_base, make.memo
        return made

    logged_plan = [(name, logged(make, i)) for i, (name, make) in enumerate(plan)]
    out = []
    it = plan_iter(logged_plan)
    while True:
        asked[0] += 1
        try:
            case = next(it)
        except StopIteration:
            return out, most[0]
        out.append((case.name, case.images, case.state))
        del case


@pytest.mark.parametrize("ahead", [False, True])
def test_cases_made_ahead_are_the_cases_made_one_by_one(ahead):
    """verify makes the next case in a thread while it judges the last (``iter_plan(ahead=True)``):
    the same cases, bit for bit, in the same order, and never more than two held at once (one at a
    time without it; whether the thread is ahead of the consumer is the benchmark's figure)."""
    from conformance.verify.cases import case_plan, iter_plan

    config = get_config("vit_test_token")
    expected = [(c.name, c.images, c.state) for c in iter_plan(case_plan(config))]
    got, most = _made_while_held(lambda plan: iter_plan(plan, ahead), case_plan(config))
    assert [g[0] for g in got] == [e[0] for e in expected]
    for (_, images, state), (_, images0, state0) in zip(got, expected):
        assert np.array_equal(images, images0) and state.keys() == state0.keys()
        assert all(np.array_equal(state[k], state0[k]) for k in state)
    assert most <= 2 if ahead else most == 1


def test_held_cases_are_counted():
    """The companion: an iterator that makes every case before handing out the first is seen to hold
    them all."""
    from conformance.verify.cases import case_plan

    plan = case_plan(get_config("vit_test_token"))
    _, most = _made_while_held(lambda p: iter([make() for _, make in p]), plan)
    assert most == len(plan)


def test_a_case_is_made_ahead_where_two_weight_sets_fit():
    """``budget.ahead``: the estimate plus one more float32 weight set within the machine's memory."""
    from conformance.verify.budget import ahead, estimate, sizes

    config = get_config("vit_base_patch16_224")
    need = estimate(config) + 4.0 * sizes(config)[1]
    assert ahead(config, memory=need) and not ahead(config, memory=need - 1)
    assert ahead(config, memory=24e9) and not ahead(get_config("vit_giant_patch14_dinov2"), memory=24e9)
