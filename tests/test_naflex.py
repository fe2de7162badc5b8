"""timm's NaFlexVit on images (issue: the position schemes of today's towers, NaFlex): its presets'
keys and shapes as timm.create_model(name) holds them, its layout (``embeds``: a Linear over each
patch flattened (ph, pw, C), a (1, Gh, Gw, D) table) read and written bitwise both ways, the
oracle equal to timm's model at every stage in float64 on the table's own grid and on others, and
timm's model, built narrow with a table of its own grid, CONFORMANT under verify as the built-in
ports are (conformance.references.timm_vit builds timm's NaFlexVit for a config with a table of its
own grid). The shrunk presets under verify in every port and dtype are tests/test_towers.py's."""

import numpy as np
import pytest
import torch

from conformance.profiles import heavy
from conformance.references import timm_state_keys, timm_taps, timm_vit
from conformance.strategies import make_images
from conformance.tests.helpers import factory
from conformance.verify.forward import verify
from impls import VIT_FAMILY, get_config
from weights import expected_shapes, init_state
from weights.canonical import WeightError
from weights.layouts import naflex

PRESETS = ("naflexvit_base_patch16_gap", "naflexvit_base_patch16_map", "naflexvit_so150m2_patch16_reg1_gap")
PRESETS += ("naflexvit_base_patch16_siglip", "naflexvit_so400m_patch16_siglip")
SMALL = get_config("vit_test_naflex")  # a 3 x 5 table, images on a 4 x 6 grid


@pytest.mark.parametrize("name", PRESETS)
def test_a_naflex_preset_has_the_keys_and_shapes_of_timms_model(name):
    import timm

    config = get_config(name)
    with torch.device("meta"):  # keys and shapes only
        model = timm.create_model(name, pretrained=False)
    zeros = {k: np.zeros(shape, np.float32) for k, shape in expected_shapes(config).items()}
    held = {k: v.shape for k, v in naflex.from_canonical(zeros, config).items()}
    assert list(held.items()) == [(k, tuple(v.shape)) for k, v in model.state_dict().items()]
    assert list(timm_state_keys(model).items()) == list(expected_shapes(config).items())  # and back


def test_the_naflex_layout_round_trips_timms_own_state_bitwise_and_infers_its_config():
    config = get_config("naflexvit_base_patch16_gap").replace(embed_dim=48, num_heads=4, depth=2, num_classes=5)
    timm_state = {k: v.numpy() for k, v in timm_vit(config, init_state(config, seed=1)).state_dict().items()}
    for v in timm_state.values():  # every entry drawn: a transposed patch layout would move values
        v[...] = np.random.default_rng(v.size).normal(size=v.shape)
    canonical = naflex.to_canonical(timm_state, config.patch_size, config.in_chans)
    assert list(canonical) == list(expected_shapes(config))
    back = naflex.from_canonical(canonical, config)
    assert list(back) == list(timm_state) and all(back[k].tobytes() == timm_state[k].tobytes() for k in back)
    assert naflex.infer_config(timm_state, num_heads=4, img_size=config.img_size) == config  # (not in the shapes)


def test_the_naflex_layout_refuses_what_it_cannot_hold_by_name():
    state = naflex.from_canonical(init_state(SMALL), SMALL)
    wrong = dict(state, **{"embeds.proj.weight": state["embeds.proj.weight"][:, :-1]})
    with pytest.raises(WeightError, match=r"embeds.proj.weight has shape \(24, 47\): expected \(embed_dim, 48\)"):
        naflex.to_canonical(wrong, SMALL.patch_size, SMALL.in_chans)
    with pytest.raises(WeightError, match="no_embed_class=True"):
        naflex.from_canonical(init_state(get_config("vit_test_token")), get_config("vit_test_token"))


@pytest.mark.parametrize("mode", ["bicubic", "bilinear"])
@pytest.mark.parametrize("img_size", [(12, 20), (16, 24), (8, 32)], ids=["table's grid", "up", "down and up"])
def test_the_oracle_is_timms_naflexvit_at_every_stage_in_float64(img_size, mode):
    config = SMALL.replace(pos_embed_interp_mode=mode)
    state = init_state(config, seed=3)
    model = timm_vit(config, state, dtype=torch.float64)
    assert model.embeds.pos_embed_interp_mode == mode
    x = make_images(config.at_img_size(img_size), 2, "ordinary", 1)
    ref, oracle = timm_taps(model, x), factory("numpy")(config, state)(x)
    assert set(oracle) == set(ref)
    # timm resamples its table in float32 even in a float64 model: off the table's grid, the embedding
    # differs by float32's rounding of the resampled table (|pos| < 1 here), and what follows with it
    tol = 1e-12 if img_size == (12, 20) else 2e-6
    for name in ref:
        assert np.abs(ref[name] - oracle[name]).max() <= tol * max(np.abs(oracle[name]).max(), 1.0), name
    # the companion: timm's model resampling without antialiasing differs from the embedding on
    model.embeds.pos_embed_antialias = False
    x = make_images(config.at_img_size((8, 12)), 2, "ordinary", 1)
    wrong, right = timm_taps(model, x), factory("numpy")(config, state)(x)
    first = next(n for n in right if np.abs(wrong[n] - right[n]).max() > 1e-4)
    assert first == "embed"


@pytest.mark.parametrize("runner, mode", [("timm", "bicubic"), ("timm", "bilinear"), ("mlx", "bicubic")])
def test_naflexvit_is_conformant_with_its_table_resampled_to_every_grid(runner, mode):
    def timm_port(config, state, dtype="float32"):
        model = timm_vit(config, state, dtype={"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype])
        return lambda images: timm_taps(model, np.asarray(images))

    timm_port.supports = VIT_FAMILY  # timm's NaFlexVit: the config says its options
    config = SMALL.replace(pos_embed_interp_mode=mode)
    report = verify(timm_port if runner == "timm" else factory(runner), config, port=f"{runner} NaFlexVit")
    assert report.conformant, report.failures[:2] or [(s.name, s.ratio) for s in report.stages if not s.ok][:3]
    assert any("patch grid" in c for c in report.cases)  # images off the table's grid among the cases


@pytest.mark.parametrize("mode", ["bicubic", "bilinear"])
def test_naflexvit_resampling_without_antialias_is_located_at_embed_and_named(mode):
    """The companion of the test above, and NaFlex's own bug: timm's model with its table resampled
    without antialiasing (``embeds.pos_embed_antialias = False``), in either mode."""

    def timm_port(config, state, dtype="float32"):
        model = timm_vit(config, state)
        model.embeds.pos_embed_antialias = False
        return lambda images: timm_taps(model, np.asarray(images))

    timm_port.supports = VIT_FAMILY
    report = verify(timm_port, SMALL.replace(pos_embed_interp_mode=mode), port="timm NaFlexVit without antialias")
    assert not report.conformant and report.located() == "embed"
    assert report.diagnosis.named == "pos_embed_resampled_without_antialias", report.diagnosis


def test_a_packed_batch_holds_each_image_as_timm_patchifies_it_and_gives_it_back():
    from timm.models.naflexvit import batch_patchify

    from conformance.verify.packed import pack, patchify, unpatchify

    rng = np.random.default_rng(0)
    images = [rng.normal(size=(3, 4 * gh, 4 * gw)).astype(np.float32) for gh, gw in ((4, 6), (5, 5), (3, 8))]
    patches, coord, valid = pack(images, (4, 4))
    assert patches.shape == (3, 25 + 3, 48) and valid.sum(1).tolist() == [24, 25, 24]  # padded past the longest
    for i, image in enumerate(images):
        theirs, grid = batch_patchify(torch.from_numpy(image)[None], (4, 4))
        n = grid[0] * grid[1]
        assert np.array_equal(patches[i, :n], theirs[0].numpy()) and not patches[i, n:].any()
        assert coord[i, n - 1].tolist() == [grid[0] - 1, grid[1] - 1]  # (row, column), row-major
        assert np.array_equal(unpatchify(patches[i, :n], grid, (4, 4)), image)
    # the companion: a patch flattened (C, ph, pw), channels first, is not timm's layout
    first = images[0][:, :4, :4].reshape(-1)
    assert not np.array_equal(patchify(images[0], (4, 4))[0][0], first)


def test_timms_naflexvit_is_conformant_on_packed_batches_of_three_grids():
    from conformance.examples.naflex_ports import port

    report = verify(port, SMALL, port="timm NaFlexVit, packed")
    assert report.conformant, report.failures[:2] or [(s.name, s.ratio) for s in report.stages if not s.ok][:3]
    assert all("packed: grids 4x6, 5x5, 3x8" in case for case in report.cases)
    assert any("trained-like" in case for case in report.cases)


THOROUGH = pytest.mark.skipif(
    not heavy(), reason="thorough profile: in ci the zoo's packed mutants (the PyTorch port's) are named as these"
)


@pytest.mark.parametrize(
    "mutant, stage, named",
    [
        ("padding_attended", "blocks.0.attn.weights", "padding_attended"),
        pytest.param("grid_swapped", "embed", "pos_embed_grid_swapped", marks=THOROUGH),
        pytest.param("no_antialias", "embed", "pos_embed_resampled_without_antialias", marks=THOROUGH),
    ],
)
def test_naflexs_classic_bugs_on_packed_batches_are_located_and_named(mutant, stage, named):
    import conformance.examples.naflex_ports as ports

    report = verify(getattr(ports, mutant), SMALL, port=f"timm NaFlexVit, {mutant}")
    assert not report.conformant and report.located() == stage
    assert report.diagnosis.named == named, report.diagnosis.line()


def test_a_packed_port_is_told_the_shape_it_must_return_and_needs_a_config_of_any_image_size():
    from conformance.support import Unsupported

    def unpadded(config, state, dtype="float32"):  # the taps of the valid patches alone
        forward = port(config, state, dtype)
        return lambda batch: {k: v[:, : 2 + 24] if v.ndim == 3 else v for k, v in forward(batch).items()}

    from conformance.examples.naflex_ports import port

    unpadded.supports, unpadded.inputs = VIT_FAMILY, "naflex"
    report = verify(unpadded, SMALL, port="unpadded")
    assert not report.conformant
    assert "expected (3, 30, 24): a packed batch of 3 rows of 28 patches, padding included" in str(report.failures)
    with pytest.raises(Unsupported, match="dynamic_img_size=True"):
        verify(unpadded, SMALL.replace(dynamic_img_size=False), port="declares the family, packed")


def test_the_command_line_verifies_a_port_of_packed_batches_in_its_own_process(cli):
    code, out, err = cli("verify", "impls.torch_vit:make_naflex", "--preset", "vit_test_naflex")
    assert code == 0, out + err
    assert "CONFORMANT" in out and "packed" in out  # (the mutants' findings: in this process, above)


def test_nan_only_in_a_packed_ports_padding_is_a_finding_that_says_where():
    """Every image's own tokens are right; the padding tokens of each block's output are NaN."""
    from tests.data.naflex_ports import nan_in_padding

    report = verify(nan_in_padding, SMALL, port="NaN in padding", cases=None)
    assert not report.conformant and report.located() == "blocks.0", report.located()
    said = [f["reason"] for f in report.failures if f["stage"] == "blocks.0"]
    assert said and "non-finite value(s)" in said[0] and "padding" in said[0], said[:1]
    assert "row 0" in said[0] or "B 0" in said[0], said[0]


def test_the_port_process_sizes_a_packed_batchs_stages_by_its_padded_rows():
    """The port's process bounds each output by its stage's shape: a packed batch's by its padded
    row's length (``packed_shape``), not by an image of (L, ph pw C) pixels. On vit_test_naflex at
    16x12 a row is 18 patches long, no whole number of 4-pixel patches: the command line was exit 3
    (ConfigError in the port's process) on NaFlexVit, which is correct. The companion: an image
    case keeps its image's stage shapes."""
    from conformance.verify.cases import Case
    from conformance.verify.packed import packed_plan, packed_shape
    from conformance.sandbox.portable import OutputLimits
    from impls import tap_shapes

    config = get_config("vit_test_naflex").replace(img_size=(16, 12))
    case = packed_plan(config)[0][1]()
    assert case.images.shape[1] == 18
    limits = OutputLimits(case, config)
    assert limits.expected["blocks.0.attn.weights"] == packed_shape("blocks.0.attn.weights", config, 3, 18)
    images = Case("images", make_images(config, 3, "ordinary", 0), case.state)
    assert OutputLimits(images, config).expected == tap_shapes(config, 3, (16, 12))


@pytest.mark.parametrize("pool, fc_norm", [("avgmax", True), ("max", True), ("avg", True), ("token", False)])
def test_timms_naflexvit_is_built_with_the_configs_fc_norm_for_every_pool(pool, fc_norm):
    """fc_norm=None is timm's ViT's default: fc_norm for every reducing pool; NaFlexVit's own None
    is 'avg' alone, so the reference passes the resolved choice (the property suite drew 'avgmax':
    NaFlexVit held norm where the state has fc_norm, a load failure blamed on a correct port)."""
    from conformance.references import timm_naflexvit

    config = get_config("vit_test_naflex").replace(global_pool=pool, fc_norm=None, class_token=pool == "token")
    model = timm_naflexvit(config, init_state(config))
    assert isinstance(model.fc_norm, torch.nn.LayerNorm) == fc_norm
    assert isinstance(model.norm, torch.nn.LayerNorm) != fc_norm
