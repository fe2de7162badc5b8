"""The error model's runs, streamed for a full-size case: the clean run and the noisy runs go in
step a stage at a time, in threads, the noisy runs following the clean step's contractions; what
they judge is what running them whole, one after another, judges."""

import sys

import numpy as np
import pytest

from conformance.numerics import error_model as E
from conformance.numerics import tape
from conformance.numerics.kinds import activation, attention
from conformance.numerics.compare import compare_outputs
from conformance import strategies as S
from conformance.profiles import heavy
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
    [
        ("taped", "float32"),
        pytest.param(
            "taped",
            "bfloat16",
            marks=pytest.mark.skipif(
                not heavy(),
                reason="thorough profile: in ci the taped products in float32 (the same float32 "
                "difference) and bfloat16's noisy runs on vit_test_siglip",
            ),
        ),
        ("vit_test_dinov2", "float32"),
        ("vit_test_siglip", "bfloat16"),
    ],
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


@pytest.mark.parametrize("preset", ["vit_test_token", "vit_test_beit", "vit_test_siglip"])
def test_held_noisy_runs_stacked_side_by_side_are_the_runs_one_after_another(preset, monkeypatch):
    """A small case's noisy runs go through each stage at once, stacked along the batch axis
    (``Chain.evaluate_runs``): the same draws and, in float64, the same spread at every stage
    (but the last bits of a product of another shape)."""
    config, state, images = _case(preset)
    expected = _spread_one_run_after_another(E.CaseModel(config, state, images, "bfloat16"))
    calls = []
    stacked = E.CaseModel.evaluate_runs
    monkeypatch.setattr(E.CaseModel, "evaluate_runs", lambda self, *a: calls.append(a[2]) or stacked(self, *a))
    held = E.CaseModel(config, state, images, "bfloat16")
    got = {name: held.spread(name) for name in held.names}
    assert len(calls) == len(held.names) and set(calls) == {8}  # every stage, its eight runs at once
    assert max(abs(got[n] / expected[n] - 1) for n in held.names) < 1e-9

    # companion: runs stacked out of step (every run reading the first run's inputs) move the spread
    def first(v):
        return np.concatenate([v[: len(v) // 8]] * 8)

    monkeypatch.setattr(
        E.CaseModel, "evaluate_runs", lambda self, n, t, *a: stacked(self, n, {k: first(v) for k, v in t.items()}, *a)
    )
    wrong = E.CaseModel(config, state, images, "bfloat16")
    assert max(abs(wrong.spread(n) / expected[n] - 1) for n in wrong.names) > 1e-2


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


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_streamed_local_check_following_the_clean_step_judges_as_one_computed_afresh(dtype):
    """Products large enough to be taped: the streamed local checks follow the clean step (the
    clean value plus a float32 product of the input's difference, the clean magnitudes plus what
    the difference can add, the activation's clean value plus its slope's share), each local ratio
    within ``NEARBY`` of the held model's computed afresh (the bound at most that much looser), the
    end-to-end ones the same; a stage off by 3x its tolerance fails both ways."""
    config, state, images = _case("taped", S.WeightCase(3, 4.0))
    out = {k: np.asarray(v) for k, v in factory("torch")(config, state)(images).items()}
    if dtype == "bfloat16":  # the port's stages rounded to the dtype, as a bfloat16 port emits them
        import ml_dtypes

        out = {k: v.astype(ml_dtypes.bfloat16).astype(np.float32) for k, v in out.items()}
    followed = []
    local = E.Chain.local
    E.Chain.local = lambda self, *a, **k: followed.append(a[-1] is not None) or local(self, *a, **k)
    try:

        def both(out):
            held = compare_outputs(out, E.CaseModel(config, state, images, dtype), dtype=dtype)
            with E.parallel():
                streamed = compare_outputs(out, E.CaseModel(config, state, images, dtype, stream=True), dtype=dtype)
            return held, streamed

        held, streamed = both(out)
    finally:
        E.Chain.local = local
    assert any(followed)
    for h, s in zip(held, streamed, strict=True):
        # the end-to-end oracle is the same computation, but OpenBLAS may split a float64 matmul
        # across its threads differently inside E.parallel() (one BLAS thread per worker): its
        # last bit, which the error |port - oracle| (~1e-8 of the values) magnifies to ~1e-8 here
        assert h.name == s.name and s.e2e_ratio == pytest.approx(h.e2e_ratio, rel=1e-6, abs=1e-12)
        assert h.ratio / (1 + E.NEARBY) - E.NEARBY <= s.ratio <= h.ratio + E.NEARBY, (h.name, h.ratio, s.ratio)
    # companion: an MLP's activation off by 3x its tolerance, judged afresh or following, fails
    name = "blocks.1.mlp.act"
    r = next(r for r in held if r.name == name)
    _, bound = E.CaseModel(config, state, images, dtype).local(name, out)
    broken = dict(out)
    broken[name] = out[name] + np.float32(3 * r.tol) * np.broadcast_to(bound, out[name].shape).astype(np.float32)
    held, streamed = both(broken)
    assert not next(r for r in held if r.name == name).ok
    assert not next(r for r in streamed if r.name == name).ok


def test_nearby_magnitudes_bound_those_computed_afresh():
    """m₀ + ‖d‖ max|w| is at least the magnitudes √((x₀ + d)²(w²)ᵀ) computed afresh, and within
    NEARBY of m₀ where it is kept; past that, None (computed afresh)."""
    rng = np.random.default_rng(0)
    x0, w = rng.normal(size=(3, 20, 64)), rng.normal(size=(48, 64))
    m0 = np.sqrt(E.squares(x0, w))
    for size in (1e-7, 1e-3):
        d = rng.normal(size=x0.shape) * size
        near = tape.nearby_bound(m0, d, w)
        assert near is not None and np.all(near >= np.sqrt(E.squares(x0 + d, w)))
        assert np.all(near <= (1 + E.NEARBY) * m0)
    # companion: a difference of a tenth of the input is not near
    assert tape.nearby_bound(m0, rng.normal(size=x0.shape) * 0.1, w) is None


@pytest.mark.parametrize("name", ["gelu", "gelu_tanh", "quick_gelu", "silu"])
def test_an_activation_near_the_clean_one_is_its_value_to_a_share_of_the_rounding(name):
    """CURVATURE bounds |act''| (finite differences on [-12, 12]); the clean value plus the slope's
    share is within NEARBY u (|a| + |h|) of the activation, the slope bound at least |act'|; an
    element far from the clean one is computed afresh."""
    h = np.linspace(-12, 12, 200001)
    _, slope = E.activation(name, h)
    curvature = np.abs(np.diff(slope) / np.diff(h)).max()
    assert 0.4 < curvature <= E.CURVATURE  # companion: half of it would not bound any of them
    p = E.Precision("float32")
    rng = np.random.default_rng(0)
    h0 = rng.normal(size=4096) * 3
    a0, s0 = E.activation(name, h0)
    entry = (h0, a0, s0, np.abs(a0) + np.abs(h0))
    h1 = h0 + rng.normal(size=h0.shape) * 1e-5 * np.abs(h0)
    h1[:8] += 1.0  # far: computed afresh
    a, bound = activation._activation_near(name, h1, entry, p)
    exact, exact_slope = E.activation(name, h1)
    assert np.all(np.abs(a - exact) <= E.NEARBY * p.storage * (np.abs(exact) + np.abs(h1)) * 1.01)
    assert np.all(bound >= np.abs(exact_slope)) and np.array_equal(a[:8], exact[:8])
    # companion: the clean value alone (no slope's share) is off by far more than that
    assert np.any(np.abs(a0[8:] - exact[8:]) > 1e3 * E.NEARBY * p.storage * (np.abs(exact[8:]) + np.abs(h1[8:])))


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


def _rss_file() -> int:
    """This process's resident pages mapped from files, in bytes (Linux)."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("RssFile:"))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status (Linux)")
@pytest.mark.parametrize("released", [True, False])
def test_a_mapped_output_is_let_go_once_read(tmp_path, released):
    """A port's outputs are read mapped from the files its process wrote (``wire.Reader(mmap=True)``)
    and ``mapped.let_go`` gives each one's pages back once read: 64 MB read leave this process's
    file-backed resident memory where it was, and read again they hold the same values. The
    companion (not let go) keeps the 64 MB resident."""
    from conformance.numerics.mapped import let_go
    from conformance.sandbox import wire

    values = np.arange(16 << 20, dtype=np.float32)
    tree = wire.Writer(tmp_path, 1).encode({"attn": values})
    a = wire.Reader(tmp_path, mmap=True).decode(tree)["attn"]
    before = _rss_file()
    assert float(a.sum(dtype=np.float64)) == float(values.sum(dtype=np.float64))
    if released:
        let_go(a)
    grown = _rss_file() - before
    assert grown < 8e6 if released else grown > 60e6, grown
    assert np.array_equal(a, values)
    let_go(values)  # an array in memory: nothing happens to it
    assert np.array_equal(values[:3], [0, 1, 2])


@pytest.mark.parametrize("held", [False, True])
def test_a_large_drawn_state_is_given_back_to_the_os_before_the_port_runs(monkeypatch, held):
    """verify's heap keeps freed memory (``heap.keep_freed_memory``): once a large weight set is
    written for the port's process and mapped back in its place, the heap is trimmed before the
    port is asked, with the drawn arrays already freed (at ViT-g/14 they were 4.5 GB held through
    the port's forward, the run's peak). The companion: a drawn array still referenced elsewhere
    is seen alive at the trim."""
    import weakref

    import conformance.sandbox.isolated as I
    from conformance.verify.cases import Case

    monkeypatch.setattr(I, "MAP_BACK", 0)  # every state is "large"
    config = get_config("vit_test_token")
    state = S.WeightCase(1, 1.0).make(config)
    probe = weakref.ref(state["blocks.0.mlp.fc1.weight"])
    kept = state["blocks.0.mlp.fc1.weight"] if held else None
    asked, at_trim = [], []
    monkeypatch.setattr(I, "return_freed_memory", lambda: at_trim.append((probe() is None, list(asked))))
    case = Case("c", S.make_images(config, 1, "ordinary", 0), state)
    del state
    with I.Isolated("forward", "mlx") as side:
        ask = side._ask
        monkeypatch.setattr(side, "_ask", lambda message: asked.append(message["op"]) or ask(message))
        out, findings = side.forward(case, config, "float32")
    assert findings == [] and out["logits"].shape == (1, config.num_classes)
    assert at_trim == [(not held, ["hello"])], at_trim  # before the forward request, after the hello
    del kept


def test_a_large_batch_is_cut_to_one_image_where_two_would_not_fit():
    """``budget.case_batch``: a full-size plan's cases hold FULL_SIZE_BATCH (2) images where the
    estimate at 2 fits the memory, else 1 (each name says the batch it has); the companion, memory
    enough, keeps 2."""
    from conformance.verify.budget import case_batch, estimate
    from conformance.verify.cases import FULL_SIZE, FULL_SIZE_BATCH, case_plan, images_of, verify_plan

    config = get_config("vit_base_patch16_224")
    tight = estimate(config, FULL_SIZE_BATCH) - 1
    assert case_batch(config, tight) == 1 and case_batch(config, tight + 1) == FULL_SIZE_BATCH == 2
    assert estimate(config, 1) < estimate(config, 2)
    one = [name for name, _ in case_plan(config, full_size=True, max_batch=1)]
    two = [name for name, _ in case_plan(config, full_size=True, max_batch=2)]
    assert len(one) == len(two) == len(FULL_SIZE) and images_of(two) == 9 and images_of(one) == 6
    assert all("(batch 1)" in name for name in one)
    assert [n for n, _ in verify_plan(config, batch=None)] in (one, two)
    case = dict(case_plan(get_config("vit_test_token"), max_batch=1))["ordinary images (batch 1), weights x4"]()
    assert case.images.shape[0] == 1


def test_verify_plans_for_the_memory_it_is_given(monkeypatch):
    """``$VIT_CONFORMANCE_MEMORY`` (a CI runner's share, a smaller machine's) lowers the memory
    verify plans for: ViT-B's cases of two images become one-image cases below its estimate at
    2, and a config over it is refused; the companion, no variable, plans for the machine. A value
    that is not a number of bytes is an error naming the variable."""
    from conformance.verify.budget import MEMORY_ENV, case_batch, estimate, machine_memory, too_large

    config = get_config("vit_base_patch16_224")
    monkeypatch.delenv(MEMORY_ENV, raising=False)
    machine = machine_memory()
    assert case_batch(config) == 2 and too_large(config) is None
    monkeypatch.setenv(MEMORY_ENV, str(int(estimate(config, 2) - 1)))
    assert machine_memory() < machine and case_batch(config) == 1 and too_large(config) is None
    monkeypatch.setenv(MEMORY_ENV, "1e8")
    assert "more than this machine's 0.1 GB" in too_large(config)
    monkeypatch.setenv(MEMORY_ENV, "24GB")
    with pytest.raises(ValueError, match=r"\$VIT_CONFORMANCE_MEMORY must be a number of bytes, got '24GB'"):
        machine_memory()


@pytest.mark.parametrize("limit", [0, None])
def test_a_large_state_is_read_back_mapped_and_judged_alike(monkeypatch, limit):
    """verify maps a state it wrote for the port's process (above ``isolated.MAP_BACK`` bytes)
    back in place of its own arrays, one copy of the weights for both processes: every weight
    (of at least ``wire.MAP_AT_LEAST`` bytes: all of them here) is then the file's, and every
    stage judged as with the state held. The companion (below the limit) keeps verify's own
    arrays."""
    from conformance.sandbox import isolated, wire
    from conformance.verify import verify
    from conformance.verify.cases import default_cases
    from tests.data.hostile_ports import _correct

    config = get_config("vit_test_token")
    held = verify(_correct, config, cases=default_cases(config)[:2])
    if limit is not None:
        monkeypatch.setattr(isolated, "MAP_BACK", limit)
        monkeypatch.setattr(wire, "MAP_AT_LEAST", 0)  # vit_test_token's weights are all small
    cases = default_cases(config)[:2]
    with isolated.Isolated("forward", "tests.data.hostile_ports:_correct") as side:
        report = verify(side, config, cases=cases)
    mapped = [isinstance(v, np.memmap) for case in cases for v in case.state.values()]
    assert all(mapped) if limit is not None else not any(mapped)
    assert report.conformant and [(s.name, s.ratio) for s in report.stages] == [(s.name, s.ratio) for s in held.stages]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_large_attention_weights_are_computed_a_few_heads_at_a_time_alike(monkeypatch, dtype):
    """The attention weights and P v, with their bounds, computed a few heads at a time where they
    are large (``error_model._HEADS_AT_ONCE``: ViT-g/14's are 45 M elements an image, and each
    of their temporaries as many) are the whole computation's, bit for bit. The companion: a chunk
    written to the wrong heads (each chunk's heads reversed) is seen."""
    rng = np.random.default_rng(3)
    q, k, v = (rng.normal(0, 2, (2, 5, 13, 8)) for _ in range(3))
    p = E.Precision(dtype)
    whole = E.softmax_weights(q, k, 8**-0.5, p)
    whole_out = E.attend(*whole, v, p)
    monkeypatch.setattr(attention, "_HEADS_AT_ONCE", 3 * 13 * 13)  # three heads at a time: 10 rows in 4 chunks
    chunked = E.softmax_weights(q, k, 8**-0.5, p)
    chunked_out = E.attend(*chunked, v, p)
    for got, expected in zip((*chunked, *chunked_out), (*whole, *whole_out)):
        assert got.shape == expected.shape and np.array_equal(got, expected)
    reversed_ = attention._by_heads(
        lambda a, b: attention._softmax_weights(a[::-1], b[::-1], 8**-0.5, p), (2, 5, 13, 13), q, k
    )
    assert reversed_[0].shape == whole[0].shape and not np.array_equal(reversed_[0], whole[0])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status (Linux)")
@pytest.mark.parametrize("released", [True, False])
def test_the_error_model_lets_go_of_a_mapped_weight_once_read(tmp_path, monkeypatch, released):
    """The error model reads a full-size state a weight at a time in float64 (``_Float64``); a weight
    mapped from the file verify wrote for the port is let go once copied, so 64 MB of weights
    read leave this process's file-backed resident memory where it was. The companion (``let_go``
    a no-op) keeps them resident."""
    from conformance.sandbox import wire

    state = {f"blocks.{i}.mlp.fc1.weight": np.full((2048, 1024), i, np.float32) for i in range(8)}
    mapped = wire.Reader(tmp_path, mmap=True).decode(wire.Writer(tmp_path, 1).encode(state))
    if not released:
        monkeypatch.setattr(E, "let_go", lambda *arrays: None)
    before = _rss_file()
    weights = E._Float64(mapped)
    assert all(weights[k][0, 0] == state[k][0, 0] for k in state)
    grown = _rss_file() - before
    assert grown < 8e6 if released else grown > 60e6, grown


def test_a_streamed_plan_reruns_its_last_case_for_determinism(monkeypatch):
    """A plan streamed case by case (a given state) re-runs the port twice on its last case, still
    at hand, for the determinism check: no case is made again (at full size, a weight set drawn
    and written anew); a port random at inference is found there. The companion: a correct port
    on the same plan passes it."""
    import conformance.verify.cases as C
    from conformance.verify import verify
    from impls import load_factory

    config = get_config("vit_test_token")
    state = S.WeightCase(3, 1.0).make(config)
    made = []
    make_images = C.make_images  # what verify's plan draws its images with
    monkeypatch.setattr(C, "make_images", lambda *a, **k: made.append(1) or make_images(*a, **k))
    plan = [name for name, _ in C.verify_plan(config, state)]
    report = verify(load_factory("conformance.zoo.torch_mutants:fused_attention_dropout"), config, state=state)
    assert [(f["case"], f["reason"]) for f in report.failures] == [
        (plan[-1], "two calls on the same input differ (randomness at inference)")
    ]
    assert len(made) == len(plan) == len(report.cases)
    assert verify(factory("torch"), config, state=state).conformant
