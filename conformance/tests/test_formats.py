"""Real checkpoint layouts, checked against the libraries that define them, all offline:
timm and transformers build and save their own models with random weights here."""

import numpy as np
import pytest
import torch

from conformance.references import timm_vit
from conformance.tests.helpers import factory, jax_runs_the_first
from conformance import properties as P
from conformance.numerics.error_model import CaseModel
from impls import get_config
from weights.convert import detect, read
from weights.hf.common import sizes_to_hf

TIMM_CONFIGS = ["vit_test_token", "vit_test_avg", "vit_test_avg_nocls", "vit_test_deep"]


def images(config, batch=2, seed=0):
    return np.random.default_rng(seed).normal(size=(batch, config.in_chans, *config.img_size)).astype(np.float32)


def assert_logits_close(port, config, state, x, ref, what):
    """A float32 port and a float32 reference are each within the propagated bound of the truth."""
    out = factory(port)(config, state, taps=False)(x)
    model = CaseModel(config, state, x)
    P.check_stage(port, what, out, ref, model, "logits")


# ----------------------------------------------------------------------------- timm


@pytest.mark.parametrize("name, suffix", [(name, ".safetensors") for name in TIMM_CONFIGS] + [("vit_test_avg", ".pth")])
def test_timm_checkpoint_imports_and_every_port_matches_timms_forward(framework_port, name, suffix, tmp_path):
    jax_runs_the_first(framework_port, name == TIMM_CONFIGS[0], TIMM_CONFIGS[0])
    config = get_config(name)
    torch.manual_seed(1)
    model = timm_vit(config)
    path = tmp_path / f"m{suffix}"
    if suffix == ".pth":
        torch.save(model.state_dict(), path)
    else:
        from safetensors.torch import save_file

        save_file(model.state_dict(), str(path))
    assert detect(str(path)) == "timm"
    got_config, state = read(str(path), "timm", num_heads=config.num_heads, img_size=config.img_size)
    assert got_config == config
    x = images(config)
    with torch.no_grad():
        ref = model(torch.from_numpy(x)).numpy()
    assert_logits_close(framework_port, config, state, x, ref, f"timm {name} {suffix}")


# ----------------------------------------------------------------------------- Hugging Face


def hf_model(eps, seed=0):
    from transformers import ViTConfig as HFConfig, ViTForImageClassification

    torch.manual_seed(seed)
    sizes = sizes_to_hf(get_config("vit_test_token").replace(img_size=(16, 16), norm_eps=eps))
    cfg = HFConfig(**sizes, num_labels=5, qkv_bias=True)
    model = ViTForImageClassification(cfg).eval()
    with torch.no_grad():  # transformers' init leaves norms at ones/zeros and biases at zero: draw them
        for name, p in model.named_parameters():
            if "layernorm" in name or name.endswith("bias"):
                p.add_(torch.randn_like(p) * 0.3)
    return model


@pytest.mark.parametrize("eps", [1e-12, 1e-6])
def test_hf_checkpoint_imports_with_its_config_and_every_port_matches_transformers(framework_port, eps, tmp_path):
    jax_runs_the_first(framework_port, eps == 1e-12, "transformers' default eps, 1e-12")
    model = hf_model(eps)
    model.save_pretrained(tmp_path)
    assert detect(str(tmp_path)) == "hf"
    config, state = read(str(tmp_path), "hf")
    assert config.norm_eps == eps and config.num_heads == 3 and config.num_classes == 5
    x = images(config)
    with torch.no_grad():
        ref = model(pixel_values=torch.from_numpy(x)).logits.numpy()
    assert_logits_close(framework_port, config, state, x, ref, f"transformers eps={eps}")


# ----------------------------------------------------------------------------- Hugging Face: the ViT family


# ----------------------------------------------------------------------------- open_clip


# ----------------------------------------------------------------------------- big_vision / original ViT


# ----------------------------------------------------------------------------- round trips and the command


# ----------------------------------------------------------------------------- resampling
