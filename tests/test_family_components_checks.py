"""The companions of conformance/tests/test_family_components.py: each of its properties fails on a deliberately
broken port (and the project's checks that take no port). Not shipped."""

from functools import partial
import numpy as np
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


def test_layerscale_check_fails_on_gammas_left_unloaded():
    expect_failure(
        P.check_layerscale_scales_only_its_branch,
        "mlx_layerscale_not_loaded",
        mutant("mlx_layerscale_not_loaded"),
        _case("vit_test_dinov2"),
        5,
        match="blocks.0",
    )


def test_prefix_token_check_fails_on_registers_in_the_patch_mean():
    expect_failure(
        P.check_prefix_tokens_as_timm,
        "torch_registers_in_patch_mean",
        mutant("torch_registers_in_patch_mean"),
        _case("vit_test_registers_avg"),
        match="pooled",
    )


def test_qk_norm_check_fails_on_a_norm_over_the_embedding():
    expect_failure(
        P.check_qk_norm_per_head,
        "qk_norm_over_embed_dim",
        partial(T.make, attn_layer=AttentionNormOverEmbedDim),
        _case("vit_test_token", qk_norm=True),
        match="attn.q_norm",
    )


def test_map_head_check_fails_on_a_query_that_is_not_the_latent():
    expect_failure(
        P.check_map_head_queries_with_the_latent,
        "mean_token_query",
        partial(T.make, model_cls=VisionTransformerMeanQueryPool),
        _case("vit_test_siglip"),
        match="attn_pool.q",
    )


def test_activation_check_fails_on_gelu_for_quick_gelu():
    expect_failure(
        P.check_activation_is_the_named_one,
        "torch_gelu_for_quick_gelu",
        mutant("torch_gelu_for_quick_gelu"),
        _case("vit_test_clip"),
        match="mlp.act",
    )


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
