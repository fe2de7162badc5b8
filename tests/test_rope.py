"""Rotary position embeddings' tables and rotation (impls/*_pos_embed.py) against timm's own
(timm.layers.pos_embed_sincos), built locally: the PyTorch port's tables are timm's bitwise, MLX's
and JAX's and the float64 oracle's within float32's rounding of timm's, for each of timm's kinds,
both coordinate orders, an offset grid and EVA's rescale onto a reference grid."""

import numpy as np
import pytest
import torch

from impls import jax_pos_embed, mlx_pos_embed, numpy_pos_embed, torch_pos_embed

U = 2.0**-24  # float32's unit roundoff
HD = 16  # head_dim: four bands per axis

# kind, temperature, grid, ref_feat_shape, offset, rotate_half: every kind on a non-square grid
# (rows and columns told apart), EVA02's rescale with an offset, DINOv3's and the rope ViTs' values
CASES = {
    "cat": ("cat", 10000.0, (3, 5), None, 0.0, False),
    "cat_ref_offset": ("cat", 100.0, (14, 12), (16, 16), 1.0, True),
    "dinov3": ("dinov3", 100.0, (6, 4), None, 0.0, True),
    "dinov3_offset": ("dinov3", 100.0, (5, 7), None, 1.0, False),
    "mixed": ("mixed", 10.0, (24, 32), None, 0.0, False),
}


def _freqs(kind):
    """RoPE-Mixed's learned frequencies (2, depth, heads, head_dim / 2), drawn."""
    if kind != "mixed":
        return None
    return (np.random.default_rng(0).normal(size=(2, 2, 3, HD // 2)) * 0.5).astype(np.float32)


def timm_table(kind, temperature, grid, ref, offset, half, indexing, freqs=None) -> np.ndarray:
    """timm's concatenated [sin, cos] table, (N, 2 head_dim) (mixed: (depth, heads, N, 2 hd))."""
    from timm.layers import pos_embed_sincos as P

    shape = list(grid)
    axial = dict(dim=HD, temperature=temperature, feat_shape=shape, grid_offset=offset, grid_indexing=indexing)
    if kind == "cat":
        m = P.RotaryEmbeddingCat(**axial, in_pixels=False, ref_feat_shape=ref, rotate_half=half)
    elif kind == "dinov3":
        m = P.RotaryEmbeddingDinoV3(**axial, rotate_half=half)
    else:
        heads = freqs.shape[2]
        m = P.RotaryEmbeddingMixed(
            dim=HD * heads,
            depth=freqs.shape[1],
            num_heads=heads,
            temperature=temperature,
            feat_shape=shape,
            grid_indexing=indexing,
        )
        with torch.no_grad():
            m.freqs.copy_(torch.from_numpy(freqs))
    return m.get_embed().detach().numpy()


def table(port, kind, temperature, grid, ref, offset, half, indexing, freqs=None) -> np.ndarray:
    def embed(freqs):
        return port.rope_embed(port.rope_angles(grid, HD, kind, temperature, offset, indexing, ref, freqs), half)

    if port is jax_pos_embed:  # one program, as inside the JAX port's jitted forward (not one per op)
        import jax

        embed = jax.jit(embed)
    sin, cos = embed(freqs)
    return np.concatenate([np.asarray(sin), np.asarray(cos)], -1)


@pytest.mark.parametrize("indexing", ["ij", "xy"])
@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_every_ports_rope_table_is_timms(case, indexing):
    """The angle is a coordinate times a band: the band's power and division, the coordinate's
    offset, rescale or centring and the product round at most 8 times, each by u of the angle;
    sin and cos then round once more. Within u (8 |angle| + 1) of timm's float32 table."""
    kind, temperature, grid, ref, offset, half = case
    freqs = _freqs(kind)
    ref_table = timm_table(kind, temperature, grid, ref, offset, half, indexing, freqs)
    assert np.array_equal(
        table(torch_pos_embed, kind, temperature, grid, ref, offset, half, indexing, freqs), ref_table
    )
    reach = np.abs(numpy_pos_embed.rope_angles(grid, HD, kind, temperature, offset, indexing, ref, freqs)).max()
    for port in (mlx_pos_embed, jax_pos_embed, numpy_pos_embed):
        mine = table(port, kind, temperature, grid, ref, offset, half, indexing, freqs)
        assert mine.shape == ref_table.shape, port.__name__
        assert np.abs(mine - ref_table).max() <= U * (8 * reach + 1), port.__name__


@pytest.mark.parametrize(
    "wrong",
    [
        {"indexing": "xy"},  # the grid's x and y swapped
        {"half": True},  # the other layout
        {"offset": 0.5},  # an offset the model does not have
        {"kind": "dinov3"},  # DINOv3's coordinates and periods for EVA's
        {"ref": (6, 10)},  # EVA's rescale the model does not have
    ],
    ids=["xy_swapped", "rotate_half", "offset", "dinov3_for_cat", "rescaled"],
)
def test_the_table_check_fails_on_a_table_of_another_scheme(wrong):
    """Companion: each of the bugs the schemes invite gives a table the bound above refuses,
    by far (timm's 'cat' on a 3 x 5 grid, ij, interleaved, no offset)."""
    args = dict(kind="cat", temperature=100.0, grid=(3, 5), ref=None, offset=0.0, half=False, indexing="ij")
    ref_table = timm_table(**args)
    mine = table(numpy_pos_embed, **(args | wrong))
    assert mine.shape != ref_table.shape or np.abs(mine - ref_table).max() > 1e3 * U * (8 * 5 + 1)


@pytest.mark.parametrize("half", [False, True], ids=["interleaved", "rotate_half"])
def test_every_ports_rotation_is_timms(half):
    """q rotated by each port in float32 against timm's ``apply_rot_embed`` in float64 on the
    same tables: within float32's rounding of the two products and their sum (|x| (|cos| +
    |sin|) <= 2 |x|); the float64 oracle's is timm's exactly. The companion: the other layout's
    rotation is far off."""
    from timm.layers.pos_embed_sincos import apply_rot_embed

    import jax.numpy as jnp
    import mlx.core as mx

    rng = np.random.default_rng(1)
    x = rng.normal(size=(2, 3, 15, HD))
    sin, cos = numpy_pos_embed.rope_embed(numpy_pos_embed.rope_angles((3, 5), HD, "cat", 100.0), half)
    ref = apply_rot_embed(*(torch.from_numpy(a) for a in (x, sin, cos)), half=half).numpy()
    assert np.array_equal(numpy_pos_embed.apply_rope(x, sin, cos, half), ref)
    f32 = [a.astype(np.float32) for a in (x, sin, cos)]
    bound = 4 * U * 2 * np.abs(x).max()  # the rounding of x, sin, cos, then of the products and sum
    for port, array in ((torch_pos_embed, torch.from_numpy), (mlx_pos_embed, mx.array), (jax_pos_embed, jnp.asarray)):
        out = np.asarray(port.apply_rope(*(array(a) for a in f32), half))
        assert out.dtype == np.float32 and np.abs(out - ref).max() <= bound, port.__name__
    other = numpy_pos_embed.apply_rope(
        x, *numpy_pos_embed.rope_embed(numpy_pos_embed.rope_angles((3, 5), HD, "cat", 100.0), not half), not half
    )
    assert np.abs(other - ref).max() > 1e3 * bound


def test_an_unknown_kind_is_refused_naming_the_kinds():
    for port in (numpy_pos_embed, torch_pos_embed):
        with pytest.raises(ValueError, match="rope kind 'axial'.*'cat', 'dinov3', 'mixed'"):
            port.rope_angles((2, 2), HD, "axial")


# timm's Eva towers with rotary embeddings that the config expresses (weights/config.py)
ROPE_PRESETS = (
    "vit_small_patch16_dinov3",
    "vit_base_patch16_dinov3",
    "vit_large_patch16_dinov3",
    "vit_base_patch16_rope_224",
    "eva02_tiny_patch14_224",
    "eva02_base_patch14_224",
    "vit_base_patch16_rope_mixed_224",
    "vit_pe_core_tiny_patch16_384",
)


@pytest.mark.parametrize("name", ROPE_PRESETS)
def test_rope_preset_has_the_timm_models_keys_and_shapes(name):
    """On the meta device, timm.create_model(name) against the preset's canonical keys, timm's Eva's
    LayerScale (gamma_1, gamma_2) read as VisionTransformer's (ls1.gamma, ls2.gamma)."""
    import timm

    from conformance.references import timm_state_keys
    from impls import get_config
    from weights import expected_shapes

    with torch.device("meta"):
        model = timm.create_model(name, pretrained=False)
    assert timm_state_keys(model) == expected_shapes(get_config(name))


@pytest.mark.parametrize(
    "name",
    [
        "vit_small_patch16_dinov3",
        "vit_base_patch16_rope_224",
        "eva02_tiny_patch14_224",
        "eva02_base_patch14_224",
        "vit_base_patch16_rope_mixed_224",
        "vit_pe_core_tiny_patch16_384",
    ],
)
def test_oracle_equals_the_named_timm_rope_model_at_every_stage(name):
    """A reduced preset (one block, a 2 x 3 grid) against timm.create_model(name) with the same
    reductions and its own init, in float64: every stage timm shows (all but LayerScale, which
    Eva computes inline), within float64's rounding up to the rotation and within timm's float32
    rotary tables' rounding, u (8 |angle| + 1) of each value, from it on."""
    import timm

    from conformance.references import timm_state, timm_taps
    from impls import get_config, load_factory, tap_names

    config = get_config(name)
    img = (2 * config.patch_size[0], 3 * config.patch_size[1])
    config = config.replace(img_size=img, depth=1)
    torch.manual_seed(0)
    model = timm.create_model(name, pretrained=False, img_size=img, depth=1).double().eval()
    model.load_state_dict({k: v.float().double() for k, v in model.state_dict().items()})  # float32's values
    state = timm_state(model)
    x = np.random.default_rng(0).normal(size=(2, 3, *img)).astype(np.float32)
    ref, oracle = timm_taps(model, x), load_factory("numpy")(config, state)(x)
    inline = ["blocks.0.ls1", "blocks.0.ls2"] if config.init_values is not None else []
    assert sorted(set(tap_names(config)) - set(ref)) == inline
    freqs = state.get("rope.freqs")  # RoPE-Mixed's: |x fx| + |y fy| bounds its angle's rounding
    reach = np.abs(numpy_pos_embed.config_angles(config, (2, 3), None if freqs is None else np.abs(freqs))).max()
    rotated = False
    for stage in (s for s in tap_names(config) if s in ref):
        rotated = rotated or stage.endswith("q_rope")
        rel = np.abs(oracle[stage] - ref[stage]).max() / np.abs(ref[stage]).max()
        assert rel <= (U * (8 * reach + 1) if rotated else 1e-12), (stage, rel)
    # companion: the grid's axes swapped is seen at the rotation, by far
    swapped = config.replace(rope_grid_indexing="xy" if config.rope_grid_indexing == "ij" else "ij")
    wrong = load_factory("numpy")(swapped, state)(x)["blocks.0.attn.q_rope"]
    assert np.abs(wrong - ref["blocks.0.attn.q_rope"]).max() > 1e3 * U * (8 * reach + 1)


def test_pixtral_rotation_is_transformers_own():
    """rope_type='pixtral' (with rope_rotate_half) against transformers' PixtralVisionRotaryEmbedding
    at a 3 x 5 grid: the PyTorch port's tables bitwise (the same float32 ops), the oracle's within
    float32's rounding of the angles (|angle| <= 4: 8 u). The companion: timm's 'cat' bands (the
    column's the row's, not the odd ones) are another table."""
    from transformers import PixtralVisionConfig
    from transformers.models.pixtral.modeling_pixtral import PixtralVisionRotaryEmbedding

    from impls import numpy_pos_embed as N
    from impls import torch_pos_embed as T

    hd, theta, grid = 16, 10000.0, (3, 5)
    rope = {"rope_type": "axial", "rope_theta": theta}
    embedding = PixtralVisionRotaryEmbedding(
        PixtralVisionConfig(hidden_size=2 * hd, num_attention_heads=2, head_dim=hd, rope_parameters=rope)
    )
    rows, cols = torch.meshgrid(torch.arange(grid[0]), torch.arange(grid[1]), indexing="ij")
    cos, sin = embedding(torch.zeros(1), torch.stack([rows.flatten(), cols.flatten()], -1))
    t_sin, t_cos = T.rope_embed(T.rope_angles(grid, hd, "pixtral", theta), True)
    assert torch.equal(cos, t_cos) and torch.equal(sin, t_sin)
    n_sin, n_cos = N.rope_embed(N.rope_angles(grid, hd, "pixtral", theta), True)
    assert np.abs(cos.numpy() - n_cos).max() < 8 * 2**-24 * 4 and np.abs(sin.numpy() - n_sin).max() < 8 * 2**-24 * 4
    c_sin, c_cos = N.rope_embed(N.rope_angles(grid, hd, "cat", theta), True)
    assert np.abs(cos.numpy() - c_cos).max() > 0.1
