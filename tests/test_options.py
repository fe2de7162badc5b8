"""The options for ports as people write them, against the code that defines them: SimpleViT's
sin-cos table as vit-pytorch computes it, timm's refusal of what it has no keyword for, and the
flattened-patch layouts a rename lays the canonical weights out in."""

import numpy as np
import pytest
import torch

from conformance.capture.mapping import patch_layout, patches_to_canonical
from conformance.report import UsageError
from impls import get_config, jax_vit, mlx_vit, numpy_vit, torch_vit


@pytest.mark.parametrize("grid, dim", [((2, 3), 8), ((14, 14), 384)])
def test_every_ports_sincos_table_is_vit_pytorchs(grid, dim):
    """lucidrains' posemb_sincos_2d, unmodified, in float32: the PyTorch port's table is it
    bitwise, MLX's and JAX's within a few float32 roundings of sin and cos of angles up to the
    grid's size, and the float64 oracle's within float32's rounding of it."""
    from vit_pytorch.simple_vit import posemb_sincos_2d

    ref = posemb_sincos_2d(*grid, dim).numpy()[None]
    assert np.array_equal(torch_vit.sincos_2d_pos_embed(grid, dim).numpy(), ref)
    u, reach = 2.0**-24, max(grid)  # the largest angle
    for port in (mlx_vit, jax_vit):
        table = np.asarray(port.sincos_2d_pos_embed(grid, dim))
        assert np.abs(table - ref).max() <= 8 * u * reach, port.__name__
    assert np.abs(numpy_vit.sincos_2d_pos_embed(grid, dim) - ref).max() <= 8 * u * reach


def test_the_sincos_check_fails_on_maes_table():
    """Companion: MAE's table (frequencies over dim / 4, not dim / 4 - 1; y before x) is not
    SimpleViT's, and the comparison above sees it."""
    from vit_pytorch.simple_vit import posemb_sincos_2d

    grid, dim = (4, 4), 24
    n = np.arange(grid[0] * grid[1]).reshape(-1, 1)
    omega = 1.0 / 10000 ** (np.arange(dim // 4) / (dim // 4))
    x, y = (n % grid[1]) * omega, (n // grid[1]) * omega
    mae = np.concatenate([np.sin(y), np.cos(y), np.sin(x), np.cos(x)], 1)
    assert np.abs(mae - posemb_sincos_2d(*grid, dim).numpy()).max() > 0.1


def test_timm_is_not_asked_for_what_it_has_no_keyword_for():
    from conformance.references import NotInTimm, timm_vit

    config = get_config("vit_test_token")
    for options in ({"patch_norm": True}, {"pos_embed": "sincos"}, {"mlp_bias": False}):
        with pytest.raises(NotInTimm, match=next(iter(options))):
            timm_vit(config.replace(**options))
    timm_vit(config.replace(mlp_bias=True))  # timm's coupling spelled out: it builds


@pytest.mark.parametrize("order", ["p1 p2 c", "c p1 p2"])
def test_a_patch_layout_and_its_tap_are_inverse_and_match_the_models_flattening(order):
    """The conv kernel laid out for a Linear over patches flattened ``order`` gives the conv's
    output on those patches; the patch norm's weight laid out in ``order`` and a tap in ``order``
    brought back are the canonical ones."""
    from einops import rearrange

    config = get_config("vit_test_token")  # 3 channels, 4 x 4 patches: every order differs
    rng = np.random.default_rng(0)
    kernel = rng.normal(size=(config.embed_dim, 3, 4, 4)).astype(np.float32)
    images = rng.normal(size=(2, 3, *config.img_size)).astype(np.float32)
    linear = patch_layout("patch_embed.proj.weight", kernel, (config.embed_dim, 48), config, order)
    patches = rearrange(images, f"b c (h p1) (w p2) -> b (h w) ({order})", p1=4, p2=4)
    conv = torch.nn.functional.conv2d(torch.from_numpy(images), torch.from_numpy(kernel), stride=4)
    np.testing.assert_allclose(patches @ linear.T, conv.flatten(2).transpose(1, 2).numpy(), rtol=1e-5, atol=1e-5)
    canonical = numpy_vit.to_patches(images, config.patch_size)
    assert np.array_equal(patches_to_canonical(patches, config, order), canonical)
    weight = np.arange(48.0)  # canonical (c p1 p2): the model's weight must meet the same pixel
    laid = patch_layout("patch_embed.patch_norm.weight", weight, (48,), config, order)
    assert np.array_equal(patches_to_canonical(laid, config, order), weight)
    if order == "p1 p2 c":  # companion: laid out in the other order, the projection is not the conv's
        other = patch_layout("patch_embed.proj.weight", kernel, (config.embed_dim, 48), config, "c p1 p2")
        assert np.abs(patches @ other.T - conv.flatten(2).transpose(1, 2).numpy()).max() > 0.1


def test_a_linear_patch_embedding_without_its_order_is_a_usage_error_naming_patch_order():
    config = get_config("vit_test_token")
    kernel = np.zeros((config.embed_dim, 3, 4, 4), np.float32)
    with pytest.raises(UsageError, match="patch_order='p1 p2 c'"):
        patch_layout("patch_embed.proj.weight", kernel, (config.embed_dim, 48), config, None)


def test_a_linear_patch_embedding_without_its_order_is_exit_2_through_verify_not_a_finding():
    """The same raised inside the port's build as verify runs it: the port's declaration (passed
    through the port's call as CannotJudge, exit 2), not 'the port raised UsageError' at load, exit 1.
    The companion: vit-pytorch's ViT declaring its order is judged, and conformant."""
    from dataclasses import replace

    import conformance.examples.vit_pytorch_port as V
    from conformance.report import CannotJudge
    from conformance.verify import verify
    from tests.capture_cases import quick_cases

    config = get_config("vit_test_token").replace(**V.VIT_CLS)
    cases = quick_cases(config)[:1]
    with pytest.raises(CannotJudge, match="patch_order='p1 p2 c'"):
        verify(replace(V.vit_cls, patch_order=None), config, cases=cases)
    assert verify(V.vit_cls, config, cases=cases).conformant


def test_the_distillation_tokens_features_are_held_to_one_rounding():
    """pooled_dist is a selection: no correct port errs on it, so its tolerance is its bound itself
    (one rounding of its input), not a calibrated multiple of nothing. The built-in port passes
    on a distilled config; one that hands head_dist its token rounded to bfloat16 fails there."""
    from functools import partial

    from conformance.numerics.tolerances import tolerance
    from conformance.verify import verify

    assert all(tolerance("pooled_dist", d) == 1.0 for d in ("float32", "bfloat16", "float16"))

    class RoundedDistToken(torch_vit.VisionTransformer):
        def forward_head_distilled(self, x, taps=None):
            x = x.clone()
            x[:, 1] = x[:, 1].to(torch.bfloat16).float()
            return super().forward_head_distilled(x, taps)

    config = get_config("vit_test_distilled")
    assert verify(torch_vit.make, config, port="torch").conformant
    rounded = partial(torch_vit.make, model_cls=RoundedDistToken)
    rounded.supports = torch_vit.make.supports  # the family's options, as the built-in port's
    report = verify(rounded, config, port="rounded")
    assert report.first_divergence == "pooled_dist", report.failures[:2]
