"""The companions of conformance/tests/test_family_components.py: each of its properties fails on a deliberately
broken port (and the project's checks that take no port). Not shipped."""

from functools import partial
import numpy as np
import pytest
import torch
from conformance import properties as P
from conformance import strategies as S
from conformance.tests.helpers import expect_failure, factory, mutant
from impls import get_config
from impls import torch_vit as T


def _case(name, **options):
    config = get_config(name).replace(**options)
    return P.ModelCase(config, S.WeightCase(1, 1.0).make(config), S.make_images(config, 2, "ordinary", 1))


class AttentionNormOverEmbedDim(T.Attention):
    """q and k normalised over the whole embedding before the head split (head_dim weights tiled)."""

    def forward(self, x, taps=None, name="attn"):
        B, N, C = x.shape
        qkv = self.qkv(x).reshape(B, N, 3, C)
        q, k, v = (qkv[:, :, j] for j in range(3))
        q = torch.nn.functional.layer_norm(
            q, (C,), self.q_norm.weight.repeat(self.num_heads), self.q_norm.bias.repeat(self.num_heads), self.q_norm.eps
        )
        k = torch.nn.functional.layer_norm(
            k, (C,), self.k_norm.weight.repeat(self.num_heads), self.k_norm.bias.repeat(self.num_heads), self.k_norm.eps
        )
        heads = [t.reshape(B, N, self.num_heads, self.head_dim).transpose(1, 2) for t in (q, k, v)]
        T.record_tap(taps, f"{name}.q", heads[0])  # after the norm: the only q this port has
        T.record_tap(taps, f"{name}.k", heads[1])
        T.record_tap(taps, f"{name}.v", heads[2])
        T.record_tap(taps, f"{name}.q_norm", heads[0])
        T.record_tap(taps, f"{name}.k_norm", heads[1])
        attn = (heads[0] * self.scale @ heads[1].transpose(-2, -1)).softmax(-1)
        T.record_tap(taps, f"{name}.weights", attn)
        x = self.proj(T.merge_heads(attn @ heads[2]))
        T.record_tap(taps, name, x)
        return x


class PoolQueryFromTheMeanToken(T.AttentionPoolLatent):
    """The MAP head's query taken from the mean token (a port that mistook the latent for a pooled token)."""

    def forward(self, x, taps=None, name="attn_pool"):
        saved = self.latent
        self.latent = torch.nn.Parameter(x.mean(1, keepdim=True)[:1])
        try:
            return super().forward(x, taps, name)
        finally:
            self.latent = saved


class VisionTransformerMeanQueryPool(T.VisionTransformer):
    def __init__(self, config, *args, **kwargs):
        super().__init__(config, *args, **kwargs)
        self.attn_pool.__class__ = PoolQueryFromTheMeanToken


def _torch(**layers):
    """The torch port with a module of its own swapped in, declaring every config the port takes (a
    bare partial declares none, and the plugin would skip the companion as unsupported)."""
    make = partial(T.make, **layers)
    make.supports = T.make.supports
    return make


# Each family property, the broken port that must fail it, the case and the stage its failure names
COMPANIONS = {
    "layerscale_fails_on_gammas_left_unloaded": (
        P.check_layerscale_scales_only_its_branch,
        "mlx_layerscale_not_loaded",
        mutant("mlx_layerscale_not_loaded"),
        ("vit_test_dinov2", {}, 5),
        "blocks.0",
    ),
    "prefix_tokens_fail_on_registers_in_the_patch_mean": (
        P.check_prefix_tokens_as_timm,
        "torch_registers_in_patch_mean",
        mutant("torch_registers_in_patch_mean"),
        ("vit_test_registers_avg", {}),
        "pooled",
    ),
    "qk_norm_fails_on_a_norm_over_the_embedding": (
        P.check_qk_norm_per_head,
        "qk_norm_over_embed_dim",
        _torch(attn_layer=AttentionNormOverEmbedDim),
        ("vit_test_token", {"qk_norm": True}),
        "attn.q_norm",
    ),
    "map_head_fails_on_a_query_that_is_not_the_latent": (
        P.check_map_head_queries_with_the_latent,
        "mean_token_query",
        _torch(model_cls=VisionTransformerMeanQueryPool),
        ("vit_test_siglip", {}),
        "attn_pool.q",
    ),
    "activation_fails_on_gelu_for_quick_gelu": (
        P.check_activation_is_the_named_one,
        "torch_gelu_for_quick_gelu",
        mutant("torch_gelu_for_quick_gelu"),
        ("vit_test_clip", {}),
        "mlp.act",
    ),
}


@pytest.mark.parametrize("companion", COMPANIONS)
def test_each_family_property_fails_on_its_broken_port(companion):
    check, name, make, (preset, options, *args), stage = COMPANIONS[companion]
    expect_failure(check, name, make, _case(preset, **options), *args, match=stage)


def test_family_properties_do_not_apply_without_their_option():
    case = _case("vit_test_token")
    for check in (
        P.check_layerscale_scales_only_its_branch,
        P.check_qk_norm_per_head,
        P.check_map_head_queries_with_the_latent,
        P.check_prefix_tokens_as_timm,
    ):
        args = (0,) if check is P.check_layerscale_scales_only_its_branch else ()
        try:
            check("torch", factory("torch"), case, *args)
        except P.NotApplicable:
            continue
        raise AssertionError(f"{check.__name__} applied to a config without its option")
    assert np.isfinite(factory("torch")(case.config, case.state)(case.images)["logits"]).all()


def test_a_companion_whose_broken_port_does_not_take_its_case_fails_and_is_not_skipped():
    """The two companions above were once skips: a bare partial declares no supports, the original ViT."""
    bare = partial(T.make, attn_layer=AttentionNormOverEmbedDim)
    with pytest.raises(AssertionError, match="does not take the companion's case: .*qk_norm=True"):
        expect_failure(P.check_qk_norm_per_head, "bare", bare, _case("vit_test_token", qk_norm=True))
