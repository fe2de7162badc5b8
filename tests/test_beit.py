"""BEiT's relative position bias (rel_pos_bias): the index as timm builds it, the presets' keys as
timm.create_model(name) holds them, the oracle equal to timm's Beit in float64 at every stage,
and transformers' BeitForImageClassification, unmodified, verified with its bias read from each
layer's own module. The shrunk presets under verify, timm's model and every port in every dtype,
are tests/test_towers.py's (thorough profile)."""

import numpy as np
import pytest

from conformance.profiles import heavy
from conformance.references import timm_state_keys, timm_taps, timm_vit
from conformance.strategies import make_images
from conformance.tests.helpers import factory
from conformance.verify.forward import verify
from impls import get_config
from impls.relative_position import relative_position_index
from weights import expected_shapes, init_state
from tests.capture_cases import quick_cases

BEIT = get_config("vit_test_beit")


@pytest.mark.parametrize("grid", [(1, 1), (2, 3), (3, 2), (4, 4)])
def test_the_relative_position_index_is_timms(grid):
    from timm.models.beit import gen_relative_position_index

    timm_index = gen_relative_position_index(grid).numpy()
    assert np.array_equal(relative_position_index(grid), timm_index)
    if grid != (1, 1):  # the companion: key minus query (the index transposed) is another table
        assert not np.array_equal(relative_position_index(grid).T, timm_index)


@pytest.mark.parametrize("name", ["beit_base_patch16_224", "beitv2_base_patch16_224"])
def test_a_beit_preset_has_the_keys_and_shapes_of_timms_model(name):
    import timm
    import torch

    with torch.device("meta"):  # keys and shapes only
        model = timm.create_model(name, pretrained=False)
    assert timm_state_keys(model) == expected_shapes(get_config(name))
    assert model.blocks[0].gamma_1.shape == (768,) and model.pos_embed is None


THOROUGH = pytest.mark.skipif(not heavy(), reason="thorough profile: ci compares timm's Beit on BEiT's own options")


@pytest.mark.parametrize(
    "changes",
    [
        {},
        pytest.param({"global_pool": "token", "pos_embed": "learn"}, marks=THOROUGH),
        pytest.param({"qkv_bias": False, "k_bias": True, "init_values": None}, marks=THOROUGH),
    ],
    ids=["beit", "token+table", "no biases"],
)
def test_the_oracle_is_timms_beit_at_every_stage_in_float64(changes):
    import torch

    config = BEIT.replace(**changes)
    state, x = init_state(config, seed=3), make_images(config, 2, "ordinary", 1)
    model = timm_vit(config, state, dtype=torch.float64)
    ref, oracle = timm_taps(model, x), factory("numpy")(config, state)(x)
    assert {f"blocks.{i}.attn.rel_pos_bias" for i in range(config.depth)} <= set(ref)
    for name in ref:
        scale = np.abs(oracle[name]).max()
        assert np.abs(ref[name] - oracle[name]).max() <= 1e-12 * max(scale, 1.0), name
    # the companion: timm's model reading its table through the transposed index differs at the bias
    for block in model.blocks:
        block.attn.relative_position_index = block.attn.relative_position_index.T.contiguous()
    wrong = timm_taps(model, x)
    first = next(n for n in oracle if n in wrong and np.abs(wrong[n] - oracle[n]).max() > 1e-6)
    assert first == "blocks.0.attn.rel_pos_bias"


def test_transformers_beit_with_its_relative_bias_is_conformant_unmodified():
    from tests.data.hf_beit_port import relative_port as port

    config = BEIT.replace(img_size=16)  # transformers' BEiT takes square images
    report = verify(port, config, port="transformers BEiT", cases=quick_cases(config))
    assert report.conformant, report.failures[:2] or [(s.name, s.ratio) for s in report.stages if not s.ok][:3]
    checked = [s.name for s in report.stages if s.ok]
    assert "blocks.0.attn.rel_pos_bias" in checked and len(checked) >= 20, checked


def test_timms_beit_unmodified_is_conformant_declared_its_bias_read_from_the_fused_attention():
    """timm's Beit as a user gives it (the rename its gamma_1 needs): its bias is no module's output
    but the float mask of its fused attention, read there; the companion, a config whose grid order
    is another (the table read transposed), is located at the bias."""
    from conformance.capture import ModelPort
    from tests.data import position_scheme_ports as P

    config = get_config("vit_test_token").replace(img_size=(16, 16), **P.BEIT_ON)
    report = verify(P.beit_declared, config, port="timm Beit", cases=quick_cases(config))
    assert report.conformant, report.failures[:2] or [(s.name, s.ratio) for s in report.stages if not s.ok][:3]
    assert "blocks.0.attn.rel_pos_bias" in [s.name for s in report.stages if s.ok]
    taps = P.beit_declared(config, init_state(config))(make_images(config, 2, "ordinary", 0))
    assert "mask" in taps.sources["blocks.0.attn.rel_pos_bias"], taps.sources["blocks.0.attn.rel_pos_bias"]

    def transposed(c):
        model = P.beit_declared.build(c)
        for block in model.blocks:
            block.attn.relative_position_index = block.attn.relative_position_index.T.contiguous()
        return model

    wrong = ModelPort(transposed, rename=P.GAMMAS, supports=P.beit_declared.supports)
    report = verify(wrong, config, port="timm Beit, index transposed", cases=quick_cases(config)[:1])
    assert not report.conformant and report.located() == "blocks.0.attn.rel_pos_bias", report.located()
