"""Keras 3 models as their authors wrote them: keras-hub's ViTBackbone, unmodified, verified as a
ModelPort on the JAX and the PyTorch backend (conformance/examples/keras_hub_vit.py), each in a
process of its own as on the command line (Keras takes its backend once, at import)."""

import pytest


@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_keras_hub_vit_is_conformant_on_each_backend(cli, monkeypatch, backend):
    monkeypatch.setenv("KERAS_BACKEND", backend)
    code, out, err = cli(
        "verify", "conformance.examples.keras_hub_vit:port", "--preset", "vit_test_token", "--set", "num_classes=0"
    )
    assert code == 0, out + err
    assert "CONFORMANT: all 23 stages checked (2 unseen)" in out, out


def test_keras_hub_vit_with_a_bug_is_located_at_it(cli, monkeypatch):
    """The companion: the same model with LayerNorm eps 1e-3 (Keras's LayerNormalization default)."""
    monkeypatch.setenv("KERAS_BACKEND", "torch")
    code, out, err = cli(
        "verify",
        "conformance.examples.keras_hub_vit:eps_1e3_port",
        "--preset",
        "vit_test_token",
        "--set",
        "num_classes=0",
    )
    assert code == 1, out + err
    assert "NOT CONFORMANT: first divergent stage blocks.0.norm1" in out, out
