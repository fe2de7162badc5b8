"""Equinox models as their authors wrote them: Equimo's VisionTransformer, unmodified, verified as a
ModelPort (conformance/examples/equimo_vit.py): an immutable pytree whose modules act on one image,
called under jax.vmap, each module read through a pure_callback under its own vmaps."""

import pytest

from conformance.examples import equimo_vit
from conformance.profiles import heavy
from conformance.verify.forward import verify
from impls import get_config
from tests.capture_cases import quick_cases

CONFIG = get_config("vit_test_token_square")
HEAVY = (
    "thorough profile: JAX compiles each op of Equimo's eager forward anew; in ci the eqx.nn.MultiheadAttention "
    "ViT below reads every stage through the same Equinox adapter and its eps-1e-5 companion is located"
)


@pytest.mark.skipif(not heavy(), reason=HEAVY)
def test_equimo_vit_is_conformant_at_every_stage():
    report = verify(equimo_vit.port, CONFIG, port="equimo", cases=quick_cases(CONFIG))
    assert report.conformant, report.failures[:2] or [(s.name, s.ratio) for s in report.stages if not s.ok][:3]
    assert len([s for s in report.stages if s.ok]) == 25 and not report.unseen


@pytest.mark.skipif(not heavy(), reason=HEAVY)
def test_equimo_vit_with_its_default_gelu_is_located_and_named():
    """The companion, and a finding about Equimo for timm's weights: its "gelu" is jax.nn.gelu,
    the tanh approximation by default. Located at blocks.0.mlp.act, every stage before it read and
    within its tolerance."""
    report = verify(equimo_vit.gelu_tanh_port, CONFIG, port="equimo, gelu", cases=quick_cases(CONFIG)[:1])
    assert report.located() == "blocks.0.mlp.act" and report.diagnosis.named == "gelu_tanh"
    before = report.stages[: [s.name for s in report.stages].index("blocks.0.mlp.act")]
    assert len(before) == 9 and all(s.ok for s in before) and not report.unseen


@pytest.mark.long
def test_eqx_multihead_attention_is_read_whole_under_its_vmap_over_heads():
    """eqx.nn.MultiheadAttention vmaps its attention over heads and scales q before q kᵀ: its q
    (unscaled), k, v and weights are read as the batched arrays a pure_callback is handed."""
    from conformance.examples import eqx_mha_vit

    report = verify(eqx_mha_vit.port, CONFIG, port="eqx MHA", cases=quick_cases(CONFIG)[:1])
    assert report.conformant and len(report.stages) == 25 and not report.unseen, report.unseen
    assert report.sources["blocks.0.attn.weights"] == "the softmax over keys"
    # the companion: the same model with its LayerNorms at eps 1e-5
    bug = verify(eqx_mha_vit.eps_1e5_port, CONFIG, port="eqx MHA, eps 1e-5", cases=quick_cases(CONFIG)[:1])
    assert bug.located() == "blocks.0.norm1"
