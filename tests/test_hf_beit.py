"""transformers' BEiT layout (weights/hf/beit.py): its save_pretrained directory imports with its
config and the oracle gives its logits; the canonical state exports to a directory
BeitForImageClassification (or BeitModel) loads strictly; both directions bitwise; what the layout
cannot hold is refused by name."""

import json

import numpy as np
import pytest
import torch

from conformance.profiles import heavy
from conformance.tests.helpers import factory
from conformance.tests.test_formats import images
from impls import get_config
from weights import WeightError, init_state
from weights.convert import detect, read, write


def hf_beit(seed: int = 0, **settings):
    from transformers import BeitConfig, BeitForImageClassification

    base = dict(image_size=16, patch_size=4, hidden_size=24, num_hidden_layers=2, num_attention_heads=3)
    base.update(intermediate_size=48, num_labels=5, use_relative_position_bias=True, layer_norm_eps=1e-6)
    model = BeitForImageClassification(BeitConfig(**{**base, **settings}))
    torch.manual_seed(seed)
    with torch.no_grad():  # every parameter drawn: zero tables or LayerScale at one would hide a swap
        for name, p in model.named_parameters():
            p.add_(torch.randn_like(p) * (0.3 if p.ndim == 1 or "relative_position" in name else 0.05))
    return model.eval()


@pytest.mark.parametrize(
    "settings",
    [
        {},
        pytest.param(
            {"use_mean_pooling": False, "use_absolute_position_embeddings": True},
            marks=pytest.mark.skipif(not heavy(), reason="thorough profile: ci round-trips the same layout below"),
        ),
    ],
    ids=["beit (mean pooled)", "class token and a table"],
)
def test_a_transformers_beit_checkpoint_imports_and_the_oracle_gives_its_logits(settings, tmp_path):
    model = hf_beit(**settings)
    model.save_pretrained(tmp_path / "hf")
    assert detect(str(tmp_path / "hf")) == "hf"
    config, state = read(str(tmp_path / "hf"), "hf")
    assert (config.rel_pos_bias, config.k_bias, config.init_values) == (True, False, 0.1)
    assert config.global_pool == ("avg" if not settings else "token")
    x = images(config)
    with torch.no_grad():
        ref = model(pixel_values=torch.from_numpy(x)).logits.numpy()
    oracle = factory("numpy")(config, state)(x)["logits"]
    assert np.abs(oracle - ref).max() <= 1e-5 * np.abs(ref).max()
    # the companion: the table's heads read in another order is another model
    rolled = {k: (np.roll(v, 1, axis=1) if k.endswith("relative_position_bias_table") else v) for k, v in state.items()}
    assert np.abs(factory("numpy")(config, rolled)(x)["logits"] - ref).max() > 1e-3 * np.abs(ref).max()
    # and back: every tensor it saved, bit for bit
    write(state, config, str(tmp_path / "back"), "hf")
    from transformers import BeitForImageClassification

    again, info = BeitForImageClassification.from_pretrained(tmp_path / "back", output_loading_info=True)
    assert not any(info.get(k) for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    theirs, ours = model.state_dict(), again.state_dict()
    assert theirs.keys() == ours.keys() and all(torch.equal(theirs[k], ours[k]) for k in theirs)


def test_the_canonical_beit_state_round_trips_through_transformers_layout_bitwise(tmp_path):
    """timm's BEiT preset shrunk, and headless (BeitModel's names, no ``beit.`` prefix)."""
    for config in (
        get_config("vit_test_beit").replace(img_size=16),
        get_config("vit_test_beit").replace(img_size=16, global_pool="token", pos_embed="learn", name="token_table"),
        get_config("beit_base_patch16_224").replace(img_size=32, embed_dim=24, depth=2, num_heads=3, num_classes=0),
    ):
        state = init_state(config, seed=3)
        write(state, config, str(tmp_path / config.name), "hf")
        back_config, back = read(str(tmp_path / config.name), "hf")
        assert back_config.replace(name=config.name) == config
        assert list(back) == list(state) and all(back[k].tobytes() == state[k].tobytes() for k in state)


def test_what_the_beit_layout_cannot_hold_is_refused_by_name(tmp_path):
    """A fused k bias (BEiT's k has none), registers, and one table shared by every layer."""
    beit = get_config("vit_test_beit").replace(img_size=16)
    for wrong, match in (({"k_bias": True}, r"beit layout cannot hold k_bias=True"), ({"global_pool": "map"}, "map")):
        config = beit.replace(**wrong)
        with pytest.raises(WeightError, match=match):
            write(init_state(config, seed=0), config, str(tmp_path / "a"), "hf")
    hf_beit().save_pretrained(tmp_path / "c")
    settings = json.loads((tmp_path / "c" / "config.json").read_text())
    (tmp_path / "c" / "config.json").write_text(json.dumps({**settings, "use_shared_relative_position_bias": True}))
    with pytest.raises(WeightError, match=r"use_shared_relative_position_bias=true .* not expressible"):
        read(str(tmp_path / "c"), "hf")
