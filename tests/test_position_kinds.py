"""Position embeddings of another kind (issue 45): the Transformer paper's 1-D sinusoidal table as an
option of the config (pos_embed='sinusoid'), the oracle's table equal to the Annotated Transformer's
PositionalEncoding, every port CONFORMANT with it, and seed post 004's port, declared with it,
CONFORMANT where on a learned table it is named as the bug it then is. The classes that name the
other kinds at ``embed`` are tests/test_diagnosis.py's; their zoo mutants tests/test_zoo.py's."""

import math

import numpy as np
import pytest
import torch

from conformance.profiles import heavy
from conformance.tests.helpers import factory
from conformance.verify.forward import verify
from impls import VIT_FAMILY, get_config
from impls.numpy_vit import sincos_2d_pos_embed, sinusoid_1d_pos_embed

SINUSOID = get_config("vit_test_token").replace(pos_embed="sinusoid")


def annotated_transformer(n: int, d: int) -> np.ndarray:
    """The Annotated Transformer's PositionalEncoding, in float64."""
    position = torch.arange(n, dtype=torch.float64).unsqueeze(1)
    div_term = torch.exp(torch.arange(0, d, 2, dtype=torch.float64) * (-math.log(10000.0) / d))
    pe = torch.zeros(n, d, dtype=torch.float64)
    pe[:, 0::2], pe[:, 1::2] = torch.sin(position * div_term), torch.cos(position * div_term)
    return pe.numpy()[None]


@pytest.mark.parametrize("n, d", [(25, 24), (197, 768), (7, 2)])
def test_the_oracles_1d_table_is_the_transformer_papers(n, d):
    assert np.abs(sinusoid_1d_pos_embed(n, d) - annotated_transformer(n, d)).max() < 1e-12
    if d >= 8:  # the companion: SimpleViT's 2-D table over a grid of as many patches is another
        assert np.abs(sincos_2d_pos_embed((1, n), d) - annotated_transformer(n, d)).max() > 0.1


RUNS = (
    [(p, d) for p in ("torch", "mlx", "jax") for d in ("float32", "bfloat16", "float16")]
    if heavy()
    else [("mlx", "bfloat16")]
)


@pytest.mark.parametrize("runner, dtype", RUNS)
def test_every_port_is_conformant_with_the_1d_sinusoidal_table(runner, dtype):
    report = verify(factory(runner), SINUSOID, port=f"{runner}, 1-D sinusoid", dtype=dtype)
    assert report.conformant, report.failures[:2] or [(s.name, s.ratio) for s in report.stages if not s.ok][:3]


def test_seed_post_004s_encoding_is_conformant_where_the_config_says_it_and_named_where_not():
    from conformance.zoo.position_mutants import pos_embed_sinusoid_1d

    def port(config, state, dtype="float32"):  # the zoo's mutant, declared for what it computes
        return pos_embed_sinusoid_1d(config, state, **({} if dtype == "float32" else {"dtype": dtype}))

    port.supports = VIT_FAMILY
    report = verify(port, SINUSOID, port="the Transformer paper's encoding, declared")
    assert report.conformant, report.failures[:2] or [(s.name, s.ratio) for s in report.stages if not s.ok][:3]
    learned = verify(port, SINUSOID.replace(pos_embed="learn"), port="the same on a learned table")
    assert not learned.conformant and learned.located() == "embed"
    assert learned.diagnosis.named == "pos_embed_sinusoidal_1d", learned.diagnosis.line()
