"""The whole model's properties and the ViT family's components, on a port factory."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np
from einops import rearrange

from conformance.diagnosis import diagnose
from conformance.numerics.compare import StageResult, compare_outputs, compare_stage, describe_failures
from conformance.numerics.tolerances import tolerance
from conformance.support import build
from impls.protocol import tap_names


from conformance.returned import as_taps
from conformance.properties.core import (
    check_sums_to_one_over_keys,
    PropertyFailure,
    NotApplicable,
    ModelCase,
    _fail,
    _call,
    run_model,
    _needs,
    check_close,
    within,
    local,
)


# ----------------------------------------------------------------------------- whole model


def _representable(case: ModelCase) -> None:
    """A drawn case no port can represent in its dtype (float16 overflows on huge images at a
    large weight scale) is discarded, not judged."""
    if case.dtype != "float32":
        from hypothesis import assume
        from hypothesis.control import currently_in_test_context

        beyond = case.error_model().beyond_range()
        if currently_in_test_context():
            assume(beyond is None)
        elif beyond:
            raise NotApplicable(beyond)


def check_matches_oracle(port: str, make: Callable, case: ModelCase) -> list:
    """Every stage the port emits (at least the logits) is within tolerance of the oracle."""
    _representable(case)
    out = run_model(port, make, case)
    model = case.error_model()
    results = compare_outputs(out, model, dtype=case.dtype)
    # A model port's findings (a module that holds a stage's weights and never ran, parameters
    # the checkpoint leaves unfilled) are failed stages in their place.
    names = tap_names(case.config)
    for stage, why in as_taps(out).findings:
        results.append(StageResult(stage, None, None, None, 0.0, False, why, "end-to-end"))
    results.sort(key=lambda r: names.index(r.name) if r.name in names else len(names))  # load last, as in verify
    if any(not r.ok for r in results):
        first = next(r.name for r in results if not r.ok)
        context = case.describe()
        if isinstance(out, Mapping) and first in out:
            context["diagnosis"] = diagnose(first, out, model, case.dtype).line()
        raise PropertyFailure(describe_failures(results, port, **context))
    return results


def check_stages_match_oracle(port: str, make: Callable, case: ModelCase, stages=("logits",)) -> None:
    """The named stages (the port must emit them) are within tolerance of the oracle's."""
    _representable(case)
    out = run_model(port, make, case)
    _needs(out, *stages)
    model = case.error_model()
    for name in stages:
        r = compare_stage(name, out[name], model, out, dtype=case.dtype)
        if not r.ok:
            raise _fail(port, f"{name} differs from the oracle", case, stage=name, error=r.reason)


# ----------------------------------------------------------------------------- the ViT family


def check_layerscale_scales_only_its_branch(port: str, make: Callable, case: ModelCase, channel: int) -> None:
    """One channel of block 0's ls2 gamma changed: the block's output moves in that channel
    only, by the change times the MLP branch (x + gamma * mlp, not (x + mlp) * gamma), and
    nothing before the MLP moves at all."""
    if case.config.init_values is None:
        raise NotApplicable("needs LayerScale (init_values)")
    out = run_model(port, make, case)
    _needs(out, "blocks.0", "blocks.0.mlp", "blocks.0.norm2")
    c = channel % case.config.embed_dim
    state = dict(case.state)
    gamma = state["blocks.0.ls2.gamma"].copy()
    old, gamma[c] = float(gamma[c]), gamma[c] + np.float32(0.5)
    state["blocks.0.ls2.gamma"] = gamma
    moved = run_model(port, make, case, state=state)
    if not np.array_equal(np.asarray(moved["blocks.0.norm2"]), np.asarray(out["blocks.0.norm2"])):
        raise _fail(
            port, "changing ls2's gamma moved norm2, which comes before the MLP branch", case, stage="blocks.0.ls2"
        )
    expected = np.asarray(out["blocks.0"], np.float64).copy()
    expected[..., c] += (float(gamma[c]) - old) * np.asarray(out["blocks.0.mlp"], np.float64)[..., c]
    within(
        port,
        f"changing channel {c} of ls2's gamma should move the block output by the change times the "
        "MLP branch in that channel only",
        case,
        "blocks.0",
        np.asarray(moved["blocks.0"]),
        expected,
    )


def check_prefix_tokens_as_timm(port: str, make: Callable, case: ModelCase) -> None:
    """Register and class tokens: position entries only where the config gives them (none with
    no_embed_class), and never pooled (the mean, max or MAP head reads the patch tokens only);
    each judged from the port's own inputs to it."""
    c = case.config
    if not c.reg_tokens and not c.no_embed_class:
        raise NotApplicable("needs register tokens or no_embed_class")
    out = run_model(port, make, case)
    local(port, "the prefix tokens and position embedding are not assembled as timm's", case, out, "embed")
    if c.global_pool in ("avg", "avgmax", "max"):
        local(port, "the pooled tokens are not the patch tokens alone", case, out, "pooled")
    elif c.global_pool == "map":
        local(port, "the attention pool's keys are not the patch tokens alone", case, out, "attn_pool.k")


def check_qk_norm_per_head(port: str, make: Callable, case: ModelCase) -> None:
    """q_norm and k_norm are LayerNorms over head_dim, per head, of the port's own q and k."""
    if not case.config.qk_norm:
        raise NotApplicable("needs qk_norm")
    out = run_model(port, make, case)
    for i in range(case.config.depth):
        for part in ("q_norm", "k_norm"):
            local(
                port, f"attn.{part} is not a LayerNorm over head_dim of each head", case, out, f"blocks.{i}.attn.{part}"
            )


def check_map_head_queries_with_the_latent(port: str, make: Callable, case: ModelCase) -> None:
    """The MAP head's query is the learned latent's alone (the same for every image), and its
    weights are the softmax of that query against the patch tokens' keys."""
    if case.config.global_pool != "map":
        raise NotApplicable("needs global_pool='map'")
    out = run_model(port, make, case)
    _needs(out, "attn_pool.q")
    local(port, "the attention pool's query is not q(latent)", case, out, "attn_pool.q")
    local(
        port,
        "the attention pool's weights are not softmax(q k^T) over the patch tokens",
        case,
        out,
        "attn_pool.weights",
    )


def check_activation_is_the_named_one(port: str, make: Callable, case: ModelCase) -> None:
    """Each MLP's activation is the config's act_layer (exact or tanh GELU, QuickGELU, SiLU;
    SwiGLU's gated product) applied to the port's own fc1 input."""
    out = run_model(port, make, case)
    stages = [f"blocks.{i}.mlp.act" for i in range(case.config.depth)]
    stages += ["attn_pool.mlp.act"] if case.config.global_pool == "map" else []
    for stage in stages:
        local(port, f"the MLP's activation is not {case.config.act_layer}", case, out, stage)


def check_batch_elements_independent(port: str, make: Callable, case: ModelCase, other_images: np.ndarray) -> None:
    """Element 0's outputs do not depend on the other elements of the batch."""
    if case.images.shape[0] < 2:
        raise NotApplicable("needs a batch of 2 or more")
    a = run_model(port, make, case)
    changed = case.images.copy()
    changed[1:] = other_images[: changed.shape[0] - 1]
    b = run_model(port, make, case, images=changed)
    for name in a:
        if name in b:
            within(
                port,
                "element 0 changed when the other batch elements changed",
                case,
                name,
                np.asarray(b[name])[:1],
                np.asarray(a[name])[:1],
            )


def check_batch_size_invariant(port: str, make: Callable, case: ModelCase) -> None:
    """Each element alone gives what it gives inside the batch."""
    full = run_model(port, make, case)
    for i in range(case.images.shape[0]):
        alone = run_model(port, make, case, images=case.images[i : i + 1])
        for name in full:
            if name in alone:
                within(
                    port,
                    f"element {i} run alone differs from element {i} in a batch of {case.images.shape[0]}",
                    case,
                    name,
                    np.asarray(alone[name]),
                    np.asarray(full[name])[i : i + 1],
                )


def check_deterministic(port: str, make: Callable, case: ModelCase) -> None:
    """Two calls give bitwise-identical outputs (no dropout or other randomness at inference)."""
    forward = _call(port, build, make, case.config, case.state, case.dtype, case=case)
    first = _call(port, forward, case.images, case=case)
    second = _call(port, forward, case.images, case=case)
    first = first if isinstance(first, Mapping) else {"logits": first}
    second = second if isinstance(second, Mapping) else {"logits": second}
    for name in first:
        a, b = np.asarray(first[name]), np.asarray(second[name])
        if a.shape != b.shape or a.tobytes() != b.tobytes():
            diff = float(np.abs(a - b).max()) if a.shape == b.shape else "shape changed"
            raise _fail(port, "two calls on the same input differ", case, stage=name, max_abs_diff=diff)


def check_layernorms_in_place(port: str, make: Callable, case: ModelCase) -> None:
    """In every block, norm1 normalises the block input with norm1's weights and norm2 the
    residual after attention with norm2's; computed from the port's own taps."""
    out = run_model(port, make, case)
    for i in range(case.config.depth):
        b = f"blocks.{i}"
        local(port, "norm1 is not LayerNorm(block input; norm1 weights)", case, out, f"{b}.norm1")
        local(port, "norm2 is not LayerNorm(x + attn; norm2 weights)", case, out, f"{b}.norm2")


def check_attention_weights_are_softmax_over_keys(port: str, make: Callable, case: ModelCase) -> None:
    """weights = softmax(q k^T * head_dim^-0.5) over the key axis, from the port's own q and k;
    so every row sums to 1 over keys (and, in general, not over queries)."""
    out = run_model(port, make, case)
    model = case.error_model()
    for i in range(case.config.depth):
        b = f"blocks.{i}.attn"
        _needs(out, f"{b}.q", f"{b}.k", f"{b}.weights")
        _, bound = model.local(f"{b}.weights", out)
        where = dict(dtype=case.dtype, case=case, stage=f"{b}.weights")
        check_sums_to_one_over_keys(port, out[f"{b}.weights"], bound.sum(-1), "attn.weights", **where)
        local(port, "attention weights are not softmax(q k^T / sqrt(head_dim)) over keys", case, out, f"{b}.weights")


def check_heads_merge_head_major(port: str, make: Callable, case: ModelCase, head: int) -> None:
    """With block 0's proj set to the identity, perturbing head ``head``'s value rows (of the fused
    qkv weight, or of v_proj where q, k and v are projected apart) changes only that head's slice
    [head*hd, (head+1)*hd) of the merged output: heads merge head-major, as timm's proj weights
    expect."""
    cfg = case.config
    D, hd = cfg.embed_dim, cfg.head_dim
    head = head % cfg.num_heads
    state = dict(case.state)
    state["blocks.0.attn.proj.weight"] = np.eye(D, dtype=np.float32)
    if "blocks.0.attn.proj.bias" in state:  # proj_bias=False models have none
        state["blocks.0.attn.proj.bias"] = np.zeros(D, np.float32)
    base = run_model(port, make, case, state=state)
    _needs(base, "blocks.0.attn")
    key, v = ("blocks.0.attn.qkv.weight", 2 * D) if cfg.qkv_fused else ("blocks.0.attn.v_proj.weight", 0)
    w = state[key].copy()
    rows = slice(v + head * hd, v + (head + 1) * hd)  # (qkv=v, head, head_dim)
    w[rows] += np.random.default_rng(head).normal(0.0, 0.5, w[rows].shape).astype(np.float32)
    perturbed = run_model(port, make, case, state=dict(state, **{key: w}))
    a = np.asarray(base["blocks.0.attn"], np.float64)
    b = np.asarray(perturbed["blocks.0.attn"], np.float64)
    inside = np.zeros(D, bool)
    inside[head * hd : (head + 1) * hd] = True
    model = case.error_model(state=state)
    within(
        port,
        f"perturbing head {head}'s value weights changed other heads' slices of the merged output",
        case,
        "blocks.0.attn",
        b[..., ~inside],
        a[..., ~inside],
        model,
    )
    if np.abs(b[..., inside] - a[..., inside]).max() <= 2 * tolerance("attn", case.dtype, "end-to-end") * model.spread(
        "blocks.0.attn"
    ):
        raise _fail(
            port, f"perturbing head {head}'s value weights did not change its own slice", case, stage="blocks.0.attn"
        )


def _grid(case: ModelCase) -> tuple[int, int]:
    """The patch grid of the case's images (another than the config's under dynamic_img_size)."""
    (ph, pw) = case.config.patch_size
    return case.images.shape[2] // ph, case.images.shape[3] // pw


def _without_patch_bias(case: ModelCase) -> dict:
    """The case's state with a zero patch bias (pre_norm models have none)."""
    if "patch_embed.proj.bias" not in case.state:
        return dict(case.state)
    return dict(case.state, **{"patch_embed.proj.bias": np.zeros(case.config.embed_dim, np.float32)})


def check_patch_embed_is_rearrange_then_linear(port: str, make: Callable, case: ModelCase) -> None:
    """The conv formulation equals the einops one: rearrange 'b c (h p1) (w p2) -> b (h w)
    (c p1 p2)', then a linear layer whose weight is the conv kernel flattened (c, p1, p2)."""
    out = run_model(port, make, case)
    _needs(out, "patch_embed")
    ph, pw = case.config.patch_size
    patches = rearrange(case.images.astype(np.float64), "b c (h p1) (w p2) -> b (h w) (c p1 p2)", p1=ph, p2=pw)
    w = case.state["patch_embed.proj.weight"].astype(np.float64)
    expected = patches @ w.reshape(w.shape[0], -1).T + case.state.get("patch_embed.proj.bias", 0.0)
    _, bound = case.error_model().local("patch_embed", out)
    check_close(
        port,
        "patch_embed differs from rearrange + linear",
        out["patch_embed"],
        expected,
        bound,
        "patch_embed",
        dtype=case.dtype,
        case=case,
        stage="patch_embed",
    )


def check_patch_shift_shifts_tokens(port: str, make: Callable, case: ModelCase) -> None:
    """With a zero patch bias, an image shifted right (down) by one patch gives the token grid
    shifted right (down) by one, zeros entering: tokens are row-major over a (gh, gw) grid."""
    cfg = case.config
    (gh, gw), (ph, pw) = _grid(case), cfg.patch_size
    state = _without_patch_bias(case)
    base = run_model(port, make, case, state=state)
    _needs(base, "patch_embed")
    grid = np.asarray(base["patch_embed"], np.float64).reshape(-1, gh, gw, cfg.embed_dim)
    for axis, p, name in ((3, pw, "right"), (2, ph, "down")):
        shifted = np.zeros_like(case.images)
        if axis == 3:
            shifted[..., pw:] = case.images[..., :-pw]
            expected = np.concatenate([np.zeros_like(grid[:, :, :1]), grid[:, :, :-1]], axis=2)
        else:
            shifted[..., ph:, :] = case.images[..., :-ph, :]
            expected = np.concatenate([np.zeros_like(grid[:, :1]), grid[:, :-1]], axis=1)
        out = run_model(port, make, case, images=shifted, state=state)
        _, bound = case.error_model(images=shifted, state=state).local("patch_embed", out)
        check_close(
            port,
            f"shifting the image {name} by one patch did not shift the token grid {name} by one",
            out["patch_embed"],
            expected.reshape(grid.shape[0], -1, cfg.embed_dim),
            bound,
            "patch_embed",
            pair=True,
            dtype=case.dtype,
            case=case,
            stage="patch_embed",
        )


def check_tokens_row_major(port: str, make: Callable, case: ModelCase, patch: tuple[int, int]) -> None:
    """An image that is zero but for patch (i, j) lights only token i * gw + j (zero bias)."""
    cfg = case.config
    (gh, gw), (ph, pw) = _grid(case), cfg.patch_size
    i, j = patch[0] % gh, patch[1] % gw
    if gh > 1 and gw > 1 and i * gw + j == j * gh + i:  # a patch where row- and column-major orders differ
        i = (i + 1) % gh
    images = np.zeros_like(case.images)
    images[:, :, i * ph : (i + 1) * ph, j * pw : (j + 1) * pw] = case.images[
        :, :, i * ph : (i + 1) * ph, j * pw : (j + 1) * pw
    ]
    state = _without_patch_bias(case)
    out = run_model(port, make, case, images=images, state=state)
    _needs(out, "patch_embed")
    tokens = np.asarray(out["patch_embed"], np.float64)
    lit = np.flatnonzero(np.abs(tokens).max(axis=(0, 2)) > 0)
    if list(lit) != [i * gw + j] and not (lit.size == 0 and not images.any()):
        raise _fail(
            port,
            f"patch ({i}, {j}) of a {gh}x{gw} grid should light token {i * gw + j} only",
            case,
            stage="patch_embed",
            lit_tokens=list(lit),
        )
