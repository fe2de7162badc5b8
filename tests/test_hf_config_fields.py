"""A transformers config.json with a missing or ill-typed field (issue 58): every importer (ViT,
a whole CLIP checkpoint's vision_config, SigLIP, Dinov2, DINOv3, BEiT, SigLIP 2) reads its
settings through weights/hf/fields.py, so convert answers exit 2 naming the field where the file
holds it and the value found, never a traceback; the untouched directory converts (exit 0)."""

from __future__ import annotations

import json
import shutil

import pytest

from impls import get_config
from weights import hf, init_state

SIGLIP2 = get_config("vit_test_naflex").replace(
    img_size=16, class_token=False, reg_tokens=0, global_pool="map", fc_norm=None, init_values=None,
    act_layer="gelu_tanh", num_classes=0, pos_embed_grid_size=4, pos_embed_interp_mode="bilinear",
)  # fmt: skip
DINOV3 = get_config("vit_small_patch16_dinov3").replace(
    img_size=16, patch_size=4, embed_dim=24, depth=2, num_heads=2, global_pool="token", fc_norm=None,
    qkv_fused=False, qkv_bias=True, k_bias=False,
)  # fmt: skip
MODELS = {
    "vit": get_config("vit_test_token"),
    "clip": get_config("vit_test_clip").replace(img_size=16, num_classes=0),  # written whole: vision_config
    "siglip": get_config("vit_test_siglip").replace(img_size=16, num_classes=0),
    "dinov2": get_config("vit_test_dinov2").replace(img_size=16, num_classes=0),
    "dinov3": DINOV3,
    "beit": get_config("vit_test_beit"),
    "siglip2": SIGLIP2,
}
# (model, field, value written or DELETE, what the one line says)
DELETE = object()
CASES = [
    ("dinov3", "hidden_size", DELETE, "config.json has no hidden_size: expected a positive int"),
    ("dinov3", "hidden_size", "32", "config.json's hidden_size is '32' (str): expected a positive int"),
    ("beit", "hidden_size", 0, "config.json's hidden_size is 0 (int): expected a positive int"),
    ("siglip2", "hidden_size", None, "config.json's hidden_size is None (null): expected a positive int"),
    ("vit", "hidden_size", True, "hidden_size is True (bool): expected a positive int"),
    ("clip", "hidden_size", "32", "config.json's vision_config.hidden_size is '32' (str)"),
    ("clip", "intermediate_size", None, "vision_config.intermediate_size is None (null): expected a positive int"),
    ("dinov3", "rope_theta", "abc", "config.json's rope_theta is 'abc' (str): expected a positive finite number"),
    ("siglip2", "num_patches", -16, "config.json's num_patches is -16 (int): expected a positive int"),
    ("siglip2", "num_patches", 1e300, "config.json's num_patches is 1e+300 (float): expected a positive int"),
    ("beit", "num_hidden_layers", 10**9, "num_hidden_layers is 1000000000 (int): expected a positive int of at most"),
    ("siglip", "num_hidden_layers", 1e9, "num_hidden_layers is 1000000000.0 (float)"),
    ("dinov2", "layer_norm_eps", "x", "layer_norm_eps is 'x' (str): expected a positive finite number"),
    ("dinov2", "qkv_bias", "yes", "qkv_bias is 'yes' (str): expected true or false"),
    ("beit", "image_size", "16", "image_size is '16' (str): expected a positive int or a list of two"),
    ("vit", "patch_size", [4], "patch_size is [4] (list): expected a positive int or a list of two"),
    ("vit", "id2label", 5, "id2label is 5 (int): expected an object of label names"),
    ("dinov3", "hidden_act", 3, "hidden_act is 3 (int): expected a string"),
    ("vit", "model_type", ["vit"], "model_type is ['vit'] (list): expected a string"),
]


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf")
    for name, config in MODELS.items():
        hf.write_hf(init_state(config), config, root / name)
        if name == "clip":  # a whole CLIP checkpoint: the tower's settings under vision_config
            tower = json.loads((root / name / "config.json").read_text())
            whole = {"model_type": "clip", "vision_config": {k: v for k, v in tower.items() if k != "model_type"}}
            (root / name / "config.json").write_text(json.dumps(whole))
    return root


def _edited(written, tmp_path, model: str, field: str, value):
    d = tmp_path / model
    shutil.copytree(written / model, d)
    config = json.loads((d / "config.json").read_text())
    settings = config["vision_config"] if "vision_config" in config and field != "model_type" else config
    settings.pop(field) if value is DELETE else settings.__setitem__(field, value)
    (d / "config.json").write_text(json.dumps(config))
    return d


@pytest.mark.parametrize(
    "model, field, value, message",
    CASES,
    ids=[f"{m}-{f}={'missing' if v is DELETE else repr(v)}" for m, f, v, _ in CASES],
)
def test_an_ill_typed_or_missing_config_field_is_exit_2_naming_it(cli, written, tmp_path, model, field, value, message):
    d = _edited(written, tmp_path, model, field, value)
    code, _, err = cli("convert", str(d), str(tmp_path / "o.safetensors"), "--to", "canonical")
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize("model", list(MODELS))
def test_the_untouched_config_converts(cli, written, tmp_path, model):
    """The companion: the same directories, their fields as transformers wrote them, are taken."""
    code, out, err = cli("convert", str(written / model), str(tmp_path / "o.safetensors"), "--to", "canonical")
    assert code == 0, err
