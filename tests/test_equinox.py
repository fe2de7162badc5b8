"""Equinox models as their authors wrote them: Equimo's VisionTransformer, unmodified, verified as a
ModelPort (conformance/examples/equimo_vit.py): an immutable pytree whose modules act on one image,
called under jax.vmap, each module read through a pure_callback under its own vmaps."""

from conformance.examples import equimo_vit
from conformance.profiles import heavy
from conformance.verify.forward import verify
from impls import get_config
from tests.capture_cases import quick_cases

CONFIG = get_config("vit_test_token_square")


def test_equimo_vit_is_conformant_at_every_stage():
    # ordinary and trained-like weights (JAX compiles each op eagerly: the offset case in thorough)
    report = verify(equimo_vit.port, CONFIG, port="equimo", cases=quick_cases(CONFIG)[: 3 if heavy() else 2])
    assert report.conformant, report.failures[:2] or [(s.name, s.ratio) for s in report.stages if not s.ok][:3]
    assert len([s for s in report.stages if s.ok]) == 25 and not report.unseen


def test_equimo_vit_with_its_default_gelu_is_located_and_named():
    """The companion, and a finding about Equimo for timm's weights: its "gelu" is jax.nn.gelu,
    the tanh approximation by default."""
    report = verify(equimo_vit.gelu_tanh_port, CONFIG, port="equimo, gelu", cases=quick_cases(CONFIG)[:1])
    assert report.located() == "blocks.0.mlp.act" and report.diagnosis.named == "gelu_tanh"
