"""transformers' AIMv2, InternViT and Pixtral towers (issue 60): their layouts read and written bitwise both
ways through weights.hf (save_pretrained's own directories read, configs inferred), timm's fused
q, k and v on the canonical side; what no option expresses refused by name."""

import numpy as np
import pytest

from impls import get_config
from tests.data import hf_towers
from tests.test_vlm_towers import AIMV2, INTERNVIT, PIXTRAL
from weights import hf, init_state
from weights.canonical import WeightError
from weights.hf import towers


def _theirs(model_type, config):
    """transformers' own model for the config.json this project writes, every parameter drawn."""
    import torch

    model = hf_towers.tower(config, model_type)
    with torch.no_grad():
        for i, p in enumerate(model.parameters()):
            p.copy_(torch.from_numpy(np.random.default_rng(i).normal(size=p.shape).astype(np.float32)))
    return model.eval()


@pytest.mark.parametrize(
    "model_type, config",
    [
        (towers.AIMV2, AIMV2),
        (towers.INTERNVL, INTERNVIT),
        (towers.INTERNVL, INTERNVIT.replace(qkv_bias=True, norm_layer="rmsnorm")),
        (towers.PIXTRAL, PIXTRAL),
    ],
)
def test_a_towers_save_pretrained_directory_is_read_and_written_back_bitwise(tmp_path, model_type, config):
    """transformers' own directory (its config.json, every field it writes) read as the config (q, k
    and v fused, as timm holds them) and its tensors; written back, the same tensors, bitwise."""
    model = _theirs(model_type, config)
    model.save_pretrained(tmp_path / "theirs", safe_serialization=True)
    state, read = hf.read_hf(tmp_path / "theirs")
    assert read == config.replace(qkv_fused=True)
    hf.write_hf(state, read, tmp_path / "ours")
    theirs = {k: v.numpy() for k, v in model.state_dict().items()}
    again, _ = hf.read_hf(tmp_path / "ours")
    ours = towers.to_tower(again, read, model_type)
    assert sorted(ours) == sorted(theirs) and all(ours[k].tobytes() == theirs[k].tobytes() for k in theirs)


@pytest.mark.parametrize("name", ["aimv2_large_patch14_224", "vit_intern300m_patch14_448"])
def test_timms_towers_round_trip_through_transformers_layouts(tmp_path, name):
    """timm's own AIMv2 and InternViT-300M presets (fused q, k, v; two blocks): written as
    transformers holds them and read back, the config and every tensor unchanged."""
    config = get_config(name).replace(depth=2, dynamic_img_size=False)
    state = init_state(config, seed=1)
    hf.write_hf(state, config, tmp_path)
    back, read = hf.read_hf(tmp_path)
    assert read == config and all(back[k].tobytes() == state[k].tobytes() for k in state)


def test_what_the_tower_layouts_cannot_hold_is_refused_by_name(tmp_path):
    """The companions: each refusal names the setting; a tensor no option places is named."""
    aimv2 = towers.vit_config_to_tower(AIMV2, towers.AIMV2)
    for key, words in (("use_head", "attention-pooling head"), ("is_native", "native-resolution")):
        with pytest.raises(WeightError, match=f"{key}=true .*{words}"):
            towers.tower_config_to_vit({**aimv2, key: True})
    internvl = towers.vit_config_to_tower(INTERNVIT, towers.INTERNVL)
    with pytest.raises(WeightError, match="use_qk_norm=true .*over the whole width"):
        towers.tower_config_to_vit({**internvl, "use_qk_norm": True})
    with pytest.raises(
        WeightError, match="aimv2_vision_model layout cannot hold global_pool='token', class_token=True"
    ):
        towers.vit_config_to_tower(AIMV2.replace(class_token=True, global_pool="token"), towers.AIMV2)
    with pytest.raises(WeightError, match="no LayerScale"):
        towers.vit_config_to_tower(INTERNVIT.replace(init_values=None), towers.INTERNVL)
    with pytest.raises(WeightError, match="pixtral layout cannot hold norm_eps=1e-06"):
        towers.vit_config_to_tower(PIXTRAL.replace(norm_eps=1e-6), towers.PIXTRAL)
    pixtral = towers.vit_config_to_tower(PIXTRAL, towers.PIXTRAL)
    with pytest.raises(WeightError, match="head_dim 8 is not hidden_size / num_attention_heads"):
        towers.tower_config_to_vit({**pixtral, "head_dim": 8})
    theirs = towers.to_tower(init_state(AIMV2), AIMV2, towers.AIMV2)
    with pytest.raises(WeightError, match="'head.k_proj.weight' has no canonical place"):
        towers.from_tower({**theirs, "head.k_proj.weight": np.zeros((24, 24), np.float32)}, AIMV2, towers.AIMV2)
