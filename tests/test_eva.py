"""timm's Eva block as EVA02 builds it, given unmodified: q's and v's biases without k's, q, k and v
from one projection or three, SwiGLU with and without its norm (weights/config.py's k_bias,
qkv_fused and scale_mlp), beside the rotary embedding. The float64 oracle against
timm.create_model is tests/test_rope.py's; the drawn configs of every port are test_model's."""

import pytest

from conformance.capture import ModelPort
from conformance.capture.expressible import NotExpressible
from conformance.profiles import heavy
from conformance.verify.forward import verify
from impls import get_config
from tests.data import position_scheme_ports as P

# two blocks of 2 heads on a 4x4 grid of 8x8 patches (rotary needs head_dim divisible by 4); the MLP's
# width as EVA02's ratio gives it (8/3 of the width, doubled in the packed SwiGLU's fc1)
CONFIG = get_config("vit_test_token").replace(img_size=(32, 32), patch_size=(8, 8), num_heads=2)
SIZES = {"eva02_tiny": (P.EVA02_TINY, 16 / 3), "eva02_base": (P.EVA02_BASE, 8 / 3)}
# the stages each must show judged: k from the base's own projection and its normed SwiGLU's norm;
# the tiny one's k inside its fused qkv (unseen, with the reason) and no norm in its MLP
JUDGED = {
    "eva02_base": {"blocks.0.attn.k", "blocks.0.attn.k_rope", "blocks.1.mlp.norm"},
    "eva02_tiny": {"blocks.0.attn.v", "blocks.0.attn.k_rope", "blocks.1.mlp"},
}


@pytest.mark.parametrize("name", ["eva02_base", "eva02_tiny"] if heavy() else ["eva02_base"])
def test_timms_eva02_unmodified_is_conformant_with_its_block_declared(name):
    """In ci the base one (three projections, k's without a bias, the normed SwiGLU); the tiny one's
    fused qkv with q_bias and v_bias in the thorough profile (its attention is drawn in test_model)."""
    options, ratio = SIZES[name]
    config = CONFIG.replace(mlp_ratio=ratio, **options)
    report = verify(getattr(P, name), config, port=name)
    assert report.conformant, report.failures[:2] or [s.name for s in report.stages if not s.ok]
    judged = {s.name for s in report.stages if s.ok}
    assert JUDGED[name] <= judged, sorted(judged)
    unseen = {f"blocks.{i}.attn.weights" for i in (0, 1)}  # inside the fused attention kernel
    if name == "eva02_tiny":
        unseen |= {f"blocks.{i}.attn.{s}" for i in (0, 1) for s in "qk"}  # inside the fused qkv, before the rotation
    assert set(report.unseen) == unseen


def test_eva02_declared_with_a_k_bias_is_told_it_has_none():
    """The companion: the same model under a config whose k projection has a bias is no finding
    about the port (a rotation makes a k bias matter, so no stage may pass it by): the config
    names the bias the model lacks and the option that says so."""
    config = CONFIG.replace(mlp_ratio=8 / 3, **dict(P.EVA02_BASE, k_bias=True))
    port = ModelPort(P.eva02_base.build, rename={}, supports={**P.eva02_base.supports, "k_bias": (True, False)})
    with pytest.raises(NotExpressible) as e:
        verify(port, config, port="eva02_base")
    assert "its key projection has no bias: k_bias=false expresses it (blocks.{i}.attn.k_proj.bias)" in str(e.value)
