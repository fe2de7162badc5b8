"""transformers' DINOv3 ViT layout (weights/hf/dinov3.py): its save_pretrained directory imports
with its config, the oracle and a port giving its pooler output; the canonical state exports to a
directory DINOv3ViTModel loads strictly; both directions bitwise; what the layout cannot hold is
refused by name."""

import json

import pytest
import torch

from conformance import properties as P
from conformance.numerics.error_model import CaseModel
from conformance.tests.helpers import factory
from conformance.tests.test_formats import images
from impls import get_config
from weights import WeightError, init_state
from weights.convert import detect, read, write

# (gated MLP, activation, key bias): DINOv3's ViT-S to ViT-L (GELU, k without bias), and the
# gated SiLU MLP of its larger models, here with a key bias
VARIANTS = {"gelu": (False, "gelu", False), "gated_silu_key_bias": (True, "silu", True)}


def hf_dinov3(gated: bool, act: str, key_bias: bool, seed: int = 0):
    from transformers import DINOv3ViTConfig, DINOv3ViTModel

    settings = dict(hidden_size=24, num_hidden_layers=2, num_attention_heads=2, intermediate_size=48)
    settings.update(image_size=16, patch_size=4, num_register_tokens=2, layer_norm_eps=1e-5)
    model = DINOv3ViTModel(DINOv3ViTConfig(**settings, use_gated_mlp=gated, hidden_act=act, key_bias=key_bias))
    torch.manual_seed(seed)
    with torch.no_grad():  # every parameter drawn: LayerScale at one or biases at zero would hide a swap
        for p in model.parameters():
            p.add_(torch.randn_like(p) * (0.3 if p.ndim == 1 else 0.05))
    return model.eval()


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_a_transformers_dinov3_checkpoint_imports_and_the_ports_give_its_pooler_output(variant, tmp_path):
    model = hf_dinov3(*VARIANTS[variant])
    model.save_pretrained(tmp_path / "hf")
    assert detect(str(tmp_path / "hf")) == "hf"
    config, state = read(str(tmp_path / "hf"), "hf")
    assert (config.rope_type, config.qkv_fused, config.reg_tokens) == ("dinov3", False, 2)
    x = images(config)
    with torch.no_grad():
        ref = model(pixel_values=torch.from_numpy(x)).pooler_output.numpy()
    errors = CaseModel(config, state, x)
    for name in ("numpy", "torch"):
        P.check_stage(
            name,
            "pooled vs transformers' DINOv3ViTModel",
            factory(name)(config, state)(x)["pooled"],
            ref,
            errors,
            "pooled",
        )
    # and back: every tensor it saved, bit for bit (mask_token, masked-image training's, as zeros)
    write(state, config, str(tmp_path / "back"), "hf")
    from transformers import DINOv3ViTModel

    again, info = DINOv3ViTModel.from_pretrained(tmp_path / "back", output_loading_info=True)
    assert not any(info.get(k) for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    theirs, ours = model.state_dict(), again.state_dict()
    assert theirs.keys() == ours.keys()
    assert all(torch.equal(theirs[k], ours[k]) for k in theirs if k != "embeddings.mask_token")
    assert not ours["embeddings.mask_token"].any()


def test_the_canonical_dinov3_state_round_trips_through_transformers_layout_bitwise(tmp_path):
    """timm's DINOv3 preset with q, k and v apart and DINOv3ViTModel's pooling (its pooler output,
    the normed class token, where timm's preset averages the patches)."""
    config = get_config("vit_small_patch16_dinov3").replace(
        img_size=16, patch_size=4, embed_dim=24, depth=2, num_heads=2, global_pool="token", fc_norm=None
    )
    config = config.replace(qkv_fused=False, qkv_bias=True, k_bias=False)
    state = init_state(config, seed=3)
    write(state, config, str(tmp_path / "hf"), "hf")
    back_config, back = read(str(tmp_path / "hf"), "hf")
    assert back_config == config
    assert list(back) == list(state) and all(back[k].tobytes() == state[k].tobytes() for k in state)


def test_what_the_dinov3_layout_cannot_hold_is_refused_by_name(tmp_path):
    """timm's DINOv3 fuses q, k and v (the layout has them apart); a model without LayerScale; q's
    and v's biases that differ (the canonical form has one qkv_bias)."""
    small = dict(img_size=16, patch_size=4, embed_dim=24, depth=1, num_heads=2)
    fused = get_config("vit_small_patch16_dinov3").replace(**small, global_pool="token", fc_norm=None)
    with pytest.raises(WeightError, match=r"dinov3_vit layout cannot hold qkv_fused=True"):
        write(init_state(fused, seed=0), fused, str(tmp_path / "a"), "hf")
    bare = fused.replace(qkv_fused=False, init_values=None)
    with pytest.raises(WeightError, match=r"init_values=None"):
        write(init_state(bare, seed=0), bare, str(tmp_path / "b"), "hf")
    hf_dinov3(False, "gelu", False).save_pretrained(tmp_path / "c")
    settings = json.loads((tmp_path / "c" / "config.json").read_text())
    (tmp_path / "c" / "config.json").write_text(json.dumps({**settings, "value_bias": False}))
    with pytest.raises(WeightError, match=r"query_bias=True, key_bias=False, value_bias=False"):
        read(str(tmp_path / "c"), "hf")
