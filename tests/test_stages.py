"""The stage table (impls/stages.py) is complete: every stage it defines has an error model, a
capture rule capture knows, a calibrated tolerance in every dtype, and a tap in every built-in
port, on configs that switch every option on; what docs/model.md's "Adding a stage" promises."""

import numpy as np
import pytest

from conformance.numerics.error_model import CaseModel
from conformance.references import timm_taps, timm_vit
from conformance.strategies import make_images
from conformance.numerics.tolerances import MODES, dtypes, tolerance
from impls import load_factory
from impls.protocol import get_config, tap_names
from impls.stages import STAGES, stage_of
from weights import init_state

# Every option a stage can need: pre_norm, qk_norm, LayerScale, the MAP head, the final norm, the
# patch norms, DeiT's distillation token, a rotary embedding (timm's Eva: no LayerScale module
# to hook), EVA02's block (q's and v's biases apart, its MLP's norm) and SAM's windows and
# decomposed relative positions.
CONFIGS = [
    get_config("vit_test_clip").replace(qk_norm=True, init_values=1e-5),
    get_config("vit_test_siglip").replace(pre_norm=True, qk_norm=True),
    get_config("vit_test_distilled").replace(patch_norm=True, embed_norm=True),
    get_config("vit_test_token").replace(rope_type="dinov3", rope_rotate_half=True, reg_tokens=2, pos_embed="none"),
    get_config("vit_test_eva"),
    get_config("vit_test_beit"),
    get_config("vit_test_sam").replace(qk_norm=True, init_values=1e-5),
]
RULES = ("out", "in", "attn", "block", "pool", "head", "return", "unseen")
TIMM_RULES = ("out", "in", "softmax", "typed", "values", "added", "return")


def incomplete(stages=STAGES, configs=CONFIGS) -> list[str]:
    """What the table's stages lack, one line each."""
    problems = []
    covered = {stage_of(name)[0] for c in configs for name in tap_names(c)}
    problems += [f"{s.kind}: no config here switches it on" for s in stages if s not in covered]
    for s in stages:
        for c in configs:
            if s.capture_rule(c).partition(":")[0] not in RULES:
                problems.append(f"{s.kind}: capture rule {s.capture_rule(c)!r} is not one of {RULES}")
        if s.timm_rule().partition(":")[0] not in TIMM_RULES:
            problems.append(f"{s.kind}: timm rule {s.timm_rule()!r} is not one of {TIMM_RULES}")
        for dtype in dtypes():
            for mode in MODES:
                try:
                    tolerance(s.kind, dtype, mode)
                except ValueError:
                    problems.append(f"{s.kind}: no calibrated {mode} tolerance in {dtype}")
    return sorted(set(problems))


def test_every_stage_has_a_capture_rule_and_a_calibrated_tolerance():
    assert incomplete() == []


def test_the_completeness_check_names_a_stage_without_its_parts():
    """The companion: an entry with an unknown capture rule and a kind never calibrated."""
    import dataclasses

    new = dataclasses.replace(STAGES[1], name="embed2", kind="embed2", capture="somewhere", timm="hook:x")
    problems = incomplete(STAGES + (new,))
    assert "embed2: no config here switches it on" in problems
    assert any(p.startswith("embed2: capture rule 'somewhere'") for p in problems)
    assert any(p.startswith("embed2: timm rule 'hook:x'") for p in problems)
    assert "embed2: no calibrated local tolerance in float32" in problems


@pytest.mark.parametrize(
    "config",
    CONFIGS,
    ids=["clip+qk+ls", "siglip+pre+qk", "deit+patch norms", "dinov3 rope", "eva block", "beit", "sam+qk+ls"],
)
def test_every_stage_has_an_error_model_and_a_tap_in_every_builtin_port(config):
    state = init_state(config, seed=0)
    images = make_images(config, 2, "ordinary", 0)
    model = CaseModel(config, state, images)
    for name in tap_names(config):
        value, bound = model.local(name, model.oracle)  # raises for a stage without its math
        assert np.shape(value) == np.shape(model.oracle[name]) and np.all(np.asarray(bound) >= 0), name
    for port in ("numpy", "torch", "mlx"):  # JAX's taps are checked by test_model on the same configs
        out = load_factory(port)(config, state)(images)
        assert sorted(set(tap_names(config)) - set(out)) == [], port
    # timm's hooks, read from the table's timm rules, show every stage and no other (timm has no
    # norm on the raw patches: that config without it)
    if config.patch_norm:
        config = config.replace(patch_norm=False)
        state = init_state(config, seed=0)
    # timm's Beit has no module where q and k, LayerScale (gamma_1) or the embedding show
    unread = {"embed", "attn.q", "attn.k", "ls1", "ls2"} if config.rel_pos_bias else set()
    expected = [n for n in tap_names(config) if stage_of(n)[0].kind not in unread]
    assert sorted(timm_taps(timm_vit(config, state), images)) == sorted(expected)
