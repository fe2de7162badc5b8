"""The companions of conformance/tests/test_formats.py: each of its properties fails on a deliberately
broken port (and the project's checks that take no port). Not shipped."""

import json
import subprocess
import sys
import numpy as np
import pytest
import torch
from conformance.profiles import heavy
from conformance.references import timm_state, timm_vit
from conformance.tests.helpers import factory
from conformance import properties as P
from conformance.numerics.error_model import CaseModel
from impls import get_config
from weights import WeightError, init_state
from weights import formats, hf
from weights.convert import LAYOUTS, detect, read, write
from weights.resample import resample_abs_pos_embed, resample_state
from conformance.tests.test_formats import assert_logits_close, images  # noqa: F401


def _drawn(model, seed=0):
    """transformers' init leaves norms at ones/zeros, biases at zero and Dinov2's LayerScale at
    one (ls1 and ls2 then look alike): draw every parameter around its init."""
    torch.manual_seed(seed)
    with torch.no_grad():
        for _, p in model.named_parameters():
            p.add_(torch.randn_like(p) * (0.3 if p.ndim == 1 else 0.02))
    return model.eval()


def hf_family_model(kind: str):
    import transformers as tf

    small = dict(hidden_size=24, num_hidden_layers=2, num_attention_heads=3, image_size=16, patch_size=4)
    if kind == "dinov2":
        return _drawn(tf.Dinov2Model(tf.Dinov2Config(**small)))
    if kind == "dinov2_swiglu":
        return _drawn(tf.Dinov2Model(tf.Dinov2Config(**small, use_swiglu_ffn=True)))
    if kind == "dinov2_with_registers":
        return _drawn(tf.Dinov2WithRegistersModel(tf.Dinov2WithRegistersConfig(**small, num_register_tokens=2)))
    if kind == "clip":
        return _drawn(
            tf.CLIPVisionModelWithProjection(tf.CLIPVisionConfig(**small, intermediate_size=48, projection_dim=8))
        )
    return _drawn(tf.SiglipVisionModel(tf.SiglipVisionConfig(**small, intermediate_size=48)))


# What each model's outputs are in the tap protocol.
HF_OUTPUTS = {
    "dinov2": ("last_hidden_state", "norm"),
    "dinov2_swiglu": ("last_hidden_state", "norm"),
    "dinov2_with_registers": ("last_hidden_state", "norm"),
    "clip": ("image_embeds", "logits"),
    "siglip": ("pooler_output", "pooled"),
}


FAMILY_ROUND_TRIPS = [("vit_test_dinov2", "hf", ()), ("vit_test_siglip", "big_vision", ("--npz-flavour", "big_vision"))]


FAMILY_ROUND_TRIPS_THOROUGH = [("vit_test_clip", "hf", ()), ("vit_test_siglip", "hf", ())]


def _npz(d, arrays):
    np.savez(d / "w.npz", **arrays)
    return d / "w.npz"


def _safetensors(d, arrays):
    from safetensors.numpy import save_file

    save_file(arrays, str(d / "w.safetensors"))
    return d / "w.safetensors"


def test_a_pth_holding_arbitrary_objects_is_refused_not_unpickled(tmp_path):
    path = tmp_path / "evil.pth"
    torch.save({"patch_embed.proj.weight": torch.zeros(1), "note": object()}, path)
    with pytest.raises(WeightError, match="refusing to unpickle"):
        formats.read_timm(path)


def exported_to_transformers(preset: str, model_cls, directory):
    """A preset's seeded state written as Hugging Face's layout to ``directory``, loaded there
    by ``model_cls.from_pretrained``: (config, state, images, its logits)."""
    config = get_config(preset).replace(img_size=16)
    state = init_state(config, seed=2)
    write(state, config, str(directory), "hf")
    model = model_cls.from_pretrained(directory).eval()
    x = images(config)
    with torch.no_grad():
        return config, state, x, model(pixel_values=torch.from_numpy(x)).logits.numpy()


def test_hf_export_loads_in_transformers_and_gives_the_ports_logits(tmp_path):
    from transformers import ViTForImageClassification

    config, state, x, ref = exported_to_transformers("vit_test_token", ViTForImageClassification, tmp_path / "hf")
    assert_logits_close("torch", config, state, x, ref, "our hf export in transformers")


def test_hf_vit_state_in_transformers_5_s_own_names_loads_strictly_and_reads_back_bitwise():
    """transformers 5 holds its ViT as layers.{i}.attention.q_proj ... (its files keep the 4.x
    names): ``in_memory_names`` is what its ``load_state_dict`` takes, strictly, giving the ports'
    logits, and its own state_dict reads back to the canonical state bit for bit. The companion:
    the file names alone do not load into the module."""
    from transformers import ViTConfig, ViTForImageClassification

    config = get_config("vit_test_token").replace(img_size=16)
    state = init_state(config, seed=2)
    model = ViTForImageClassification(ViTConfig(**hf.vit_config_to_hf(config))).eval()
    tensors = {k: torch.from_numpy(np.array(v)) for k, v in hf.in_memory_names(hf.to_hf(state, config)).items()}
    model.load_state_dict(tensors, strict=True)
    x = images(config)
    with torch.no_grad():
        ref = model(pixel_values=torch.from_numpy(x)).logits.numpy()
    assert_logits_close("torch", config, state, x, ref, "transformers 5's ViT loaded with in_memory_names")
    own = {k: v.numpy() for k, v in model.state_dict().items()}
    back = hf.from_hf(own, config)
    assert back.keys() == state.keys() and all(np.array_equal(back[k], state[k]) for k in state)
    files = {k: torch.from_numpy(np.array(v)) for k, v in hf.to_hf(state, config).items()}
    with pytest.raises(RuntimeError, match="Missing key"):
        model.load_state_dict(files, strict=True)


def test_hf_config_settings_are_taken_not_assumed():
    settings = hf.vit_config_to_hf(get_config("vit_test_token"))
    assert hf.hf_config_to_vit(settings) == get_config("vit_test_token")
    with pytest.raises(WeightError, match="gelu_new"):
        hf.hf_config_to_vit({**settings, "hidden_act": "gelu_new"})
    with pytest.raises(WeightError, match="avg"):
        hf.vit_config_to_hf(get_config("vit_test_avg"))


@pytest.mark.parametrize("kind", list(HF_OUTPUTS))
def test_hf_family_checkpoint_imports_and_the_oracle_and_a_port_match_transformers(kind, tmp_path):
    """The checkpoint transformers writes, read with its config.json; the float64 oracle and a
    framework port (in turn) against transformers' float32 forward at the output it returns."""
    model = hf_family_model(kind)
    model.save_pretrained(tmp_path)
    config, state = read(str(tmp_path), "hf")
    x = images(config)
    with torch.no_grad():
        out = model(pixel_values=torch.from_numpy(x))
    attr, stage = HF_OUTPUTS[kind]
    ref = getattr(out, attr).numpy()
    port = ("torch", "mlx")[list(HF_OUTPUTS).index(kind) % 2]  # JAX compiles each config: test_model runs it
    errors = CaseModel(config, state, x)
    for name in ("numpy", port):
        got = factory(name)(config, state)(x)[stage]
        P.check_stage(
            name,
            f"{stage} vs transformers {kind}",
            got,
            ref,
            errors,
            stage,
        )


@pytest.mark.parametrize("preset", ["vit_test_dinov2", "vit_test_clip", "vit_test_siglip"])
def test_hf_family_export_loads_strictly_in_transformers_and_round_trips_bitwise(preset, tmp_path):
    import transformers as tf

    config = get_config(preset).replace(img_size=16, num_classes=0 if preset != "vit_test_clip" else 7)
    state = init_state(config, seed=6)
    if preset == "vit_test_clip":
        state["head.bias"][:] = 0.0  # CLIP's visual_projection has no bias
    write(state, config, str(tmp_path / "hf"), "hf")
    back_config, back = read(str(tmp_path / "hf"), "hf")
    assert back_config.replace(init_values=config.init_values) == config
    assert list(back) == list(state) and all(back[k].tobytes() == state[k].tobytes() for k in state)
    cls = {
        "vit_test_dinov2": tf.Dinov2WithRegistersModel,
        "vit_test_clip": tf.CLIPVisionModelWithProjection,
        "vit_test_siglip": tf.SiglipVisionModel,
    }[preset]
    model, info = cls.from_pretrained(tmp_path / "hf", output_loading_info=True)
    assert not any(info.get(k) for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    x = images(config)
    with torch.no_grad():
        out = model.eval()(pixel_values=torch.from_numpy(x))
    attr, stage = {
        "vit_test_dinov2": ("last_hidden_state", "norm"),
        "vit_test_clip": ("image_embeds", "logits"),
        "vit_test_siglip": ("pooler_output", "pooled"),
    }[preset]
    errors = CaseModel(config, state, x)
    P.check_stage(
        "numpy",
        f"our {preset} export in transformers",
        factory("numpy")(config, state)(x)[stage],
        getattr(out, attr).numpy(),
        errors,
        stage,
    )


def test_hf_family_layouts_refuse_what_they_cannot_hold():

    with pytest.raises(WeightError, match="no Hugging Face layout holds"):
        hf.model_type_for(get_config("vit_test_token").replace(qk_norm=True))
    with pytest.raises(WeightError, match="visual_projection has no bias"):
        config = get_config("vit_test_clip").replace(img_size=16)
        hf.to_family_hf(init_state(config), config)
    with pytest.raises(WeightError, match="classifier reads the class token and the patch mean"):
        hf.family_config_to_vit(
            {
                "model_type": "dinov2",
                "architectures": ["Dinov2ForImageClassification"],
                "hidden_size": 24,
                "num_hidden_layers": 1,
                "num_attention_heads": 3,
            }
        )


def test_open_clip_visual_tower_imports_exports_and_matches_open_clip(tmp_path):
    """open_clip's own VisionTransformer (QuickGELU, as OpenAI's weights), random init with every
    parameter drawn: our import's oracle equals its projected features; our export loads into it
    strictly and round-trips bitwise; without the config the command refuses to guess the activation."""
    from open_clip.model import CLIPVisionCfg, _build_vision_tower
    from safetensors.numpy import save_file

    tower = _drawn(
        _build_vision_tower(
            8, CLIPVisionCfg(layers=2, width=24, head_width=8, patch_size=4, image_size=16), quick_gelu=True
        )
    )
    config = get_config("vit_test_clip").replace(img_size=16, num_classes=8)
    theirs = {f"visual.{k}": v.detach().numpy() for k, v in tower.state_dict().items()}
    state = formats.from_open_clip(theirs, config)
    x = images(config)
    with torch.no_grad():
        ref = tower(torch.from_numpy(x)).numpy()
    errors = CaseModel(config, state, x)
    P.check_stage(
        "numpy",
        "logits vs open_clip",
        factory("numpy")(config, state)(x)["logits"],
        ref,
        errors,
        "logits",
    )
    back = formats.to_open_clip(state, config)
    assert all(back[k].tobytes() == theirs[k].tobytes() for k in theirs) and set(back) == set(theirs)
    tower.load_state_dict({k.removeprefix("visual."): torch.from_numpy(v) for k, v in back.items()}, strict=True)
    save_file(theirs, str(tmp_path / "open_clip.safetensors"))
    assert detect(str(tmp_path / "open_clip.safetensors")) == "open_clip"
    with pytest.raises(WeightError, match="does not record its activation"):
        read(str(tmp_path / "open_clip.safetensors"), "open_clip")


@pytest.mark.parametrize("flavour", ["vit", "big_vision"])
def test_npz_export_loads_in_timms_load_weights_and_matches_the_ports(flavour, tmp_path):
    from timm.models.vision_transformer import _load_weights

    config = get_config("vit_test_token").replace(img_size=(16, 16))
    state = init_state(config, seed=3)
    if flavour == "big_vision":
        state["pos_embed"][:, 0] = 0.0  # big_vision gives the class token no position
    path = tmp_path / "w.npz"
    formats.write_npz(state, config, path, flavour)
    model = timm_vit(config.replace(no_embed_class=flavour == "big_vision"))  # timm's own init, then the file
    _load_weights(model, str(path))
    x = images(config)
    with torch.no_grad():
        ref = model(torch.from_numpy(x)).numpy()
    for port in ("torch", "mlx", "jax"):
        assert_logits_close(port, config, state, x, ref, f"timm _load_weights of our {flavour} npz")


@pytest.mark.parametrize("preset", ["vit_test_siglip", "siglip_gap"])
def test_big_vision_siglip_npz_loads_in_timms_load_weights_and_round_trips(preset, tmp_path):
    """SigLIP's MAP head (MAPHead_0) and big_vision's 'gap' pooling (the mean after the final
    norm: fc_norm=False), written by us, read by timm's _load_weights into the timm model with
    those options: timm's tensors equal ours bitwise; read back by us, bitwise too."""
    from timm.models.vision_transformer import _load_weights

    from conformance.references import timm_vit

    config = get_config("vit_test_siglip").replace(img_size=16, num_classes=0)
    if preset == "siglip_gap":
        config = config.replace(global_pool="avg", fc_norm=False)
    state = init_state(config, seed=7)
    path = tmp_path / "siglip.npz"
    write(state, config, str(path), "big_vision", npz_flavour="big_vision")
    model = timm_vit(config)
    _load_weights(model, str(path))
    theirs = timm_state(model)
    assert all(theirs[k].tobytes() == state[k].tobytes() for k in state)
    got_config, back = read(str(path), "big_vision")
    assert got_config == config.replace(act_layer="gelu")  # the activation is not stored: timm's default
    assert all(back[k].tobytes() == state[k].tobytes() for k in state)


def test_a_scanned_big_vision_npz_reads_as_its_unscanned_twin(tmp_path):
    """big_vision's scan layout stacks the blocks under Transformer/encoderblock/ (timm reads both)."""
    config = get_config("vit_test_siglip").replace(img_size=16, num_classes=0)
    state = init_state(config, seed=8)
    w = formats.to_npz(state, config, "big_vision")
    scanned = {k: v for k, v in w.items() if "encoderblock_" not in k}
    for k in [k for k in w if "encoderblock_0/" in k]:
        scanned[k.replace("encoderblock_0/", "encoderblock/")] = np.stack(
            [w[k.replace("encoderblock_0/", f"encoderblock_{i}/")] for i in range(config.depth)]
        )
    inferred = formats.infer_npz_config(scanned)
    assert inferred.depth == config.depth and inferred.global_pool == "map"
    back = formats.from_npz(scanned, config)
    assert all(back[k].tobytes() == state[k].tobytes() for k in state)


def test_npz_of_a_timm_model_round_trips_to_the_same_canonical_tensors(tmp_path):
    config = get_config("vit_test_token").replace(img_size=(16, 16))
    torch.manual_seed(4)
    state = timm_state(timm_vit(config, init_state(config, seed=4)))
    write(state, config, str(tmp_path / "w.npz"), "big_vision")
    assert detect(str(tmp_path / "w.npz")) == "big_vision"
    got_config, back = read(str(tmp_path / "w.npz"), "big_vision")
    assert got_config == config
    assert list(back) == list(state) and all(back[k].tobytes() == state[k].tobytes() for k in state)


def test_npz_refuses_a_pooling_it_cannot_hold():
    with pytest.raises(WeightError, match="fc_norm"):
        formats.to_npz(init_state(get_config("vit_test_avg")), get_config("vit_test_avg"))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_every_layout_round_trips_bitwise_through_the_command(layout, tmp_path, cli):
    preset = {"open_clip": "vit_test_clip", "naflex": "vit_test_naflex"}.get(layout, "vit_test_token")
    config = get_config(preset).replace(img_size=(16, 16))
    state = init_state(config, seed=5)
    if layout == "open_clip":
        state["head.bias"][:] = 0.0  # open_clip's proj has no bias
    src = tmp_path / "src.safetensors"
    write(state, config, str(src), "canonical")
    out = tmp_path / ("out" if layout == "hf" else "out.npz" if layout == "big_vision" else "out.safetensors")
    code, _, err = cli("convert", src, out, "--to", layout)
    assert code == 0, err
    got_config, back = read(str(out), detect(str(out)), None if layout != "timm" else config)
    assert got_config == config
    assert list(back) == list(state) and all(back[k].tobytes() == state[k].tobytes() for k in state), layout


@pytest.mark.parametrize("preset, layout, flags", FAMILY_ROUND_TRIPS + (FAMILY_ROUND_TRIPS_THOROUGH if heavy() else []))
def test_family_layouts_round_trip_bitwise_through_the_command(preset, layout, flags, tmp_path, cli):
    config = get_config(preset).replace(img_size=16, num_classes=0 if preset != "vit_test_clip" else 7)
    state = init_state(config, seed=9)
    if preset == "vit_test_clip":
        state["head.bias"][:] = 0.0
    src, out = tmp_path / "src.safetensors", tmp_path / ("out.npz" if layout == "big_vision" else "out")
    write(state, config, str(src), "canonical")
    code, _, err = cli("convert", src, out, "--to", layout, *flags)
    assert code == 0, err
    got_config, back = read(str(out), detect(str(out)), config if layout == "big_vision" else None)
    assert got_config.replace(init_values=config.init_values) == config
    assert list(back) == list(state) and all(back[k].tobytes() == state[k].tobytes() for k in state)


@pytest.mark.parametrize(
    "make_file, message",
    [
        (lambda d: (d / "x.txt").write_text("hello") and d / "x.txt", "matches no known layout"),
        (lambda d: _npz(d, {"foo": np.zeros(2)}), "neither 'embedding/kernel'"),
        (
            lambda d: _safetensors(d, {"blocks.0.attn.qkv.weight": np.zeros((3, 1), np.float32)}),
            "matches no known layout",
        ),
        (
            lambda d: _safetensors(
                d,
                {
                    "patch_embed.proj.weight": np.zeros((8, 3, 4, 4), np.float32),
                    "pos_embed": np.zeros((1, 5, 8), np.float32),
                },
            ),
            "missing",
        ),
        (lambda d: d / "nope.safetensors", "does not exist"),
        (lambda d: _npz(d, {"embedding/kernel": np.array([object()], dtype=object)}), "refusing to load them"),
    ],
    ids=["unknown-file", "unknown-npz", "unknown-keys", "missing-key", "missing-file", "pickled-npz"],
)
def test_convert_gives_a_clear_error_and_exit_2(make_file, message, tmp_path, cli):
    src = make_file(tmp_path)
    code, _, err = cli("convert", src, tmp_path / "o.safetensors", "--to", "canonical")
    assert code == 2 and message in err and "Traceback" not in err, err


def test_convert_names_the_key_whose_shape_does_not_fit(tmp_path):
    """Through ``python -m weights`` itself, as a user types it."""
    config = get_config("vit_test_token")
    state = init_state(config)
    state["blocks.1.mlp.fc1.weight"] = state["blocks.1.mlp.fc1.weight"][:, :10]
    from safetensors.numpy import save_file

    save_file(state, str(tmp_path / "bad.safetensors"))
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "weights",
            "convert",
            str(tmp_path / "bad.safetensors"),
            str(tmp_path / "o.safetensors"),
            "--to",
            "mlx",
            "--config",
            json.dumps(config.to_dict()),
        ],
        capture_output=True,
        text=True,
    )
    assert run.returncode == 2 and "'blocks.1.mlp.fc1.weight': expected shape (96, 24), found (96, 10)" in run.stderr


@pytest.mark.parametrize(
    "old, new, prefix", [((4, 4), (6, 6), 1), ((14, 14), (7, 9), 1), ((3, 5), (5, 3), 0), ((8, 8), (8, 8), 1)]
)
def test_pos_embed_resampling_equals_timms(old, new, prefix):
    from timm.layers import resample_abs_pos_embed as timm_resample

    pos = np.random.default_rng(0).normal(size=(1, prefix + old[0] * old[1], 16)).astype(np.float32)
    ours = resample_abs_pos_embed(pos, new, old, num_prefix_tokens=prefix)
    ref = timm_resample(
        torch.from_numpy(pos),
        new_size=list(new),
        old_size=list(old),
        num_prefix_tokens=prefix,
        interpolation="bicubic",
        antialias=True,
    ).numpy()
    assert ours.shape == ref.shape and np.array_equal(ours, ref)


def test_resampled_state_runs_in_every_port_at_the_new_size():
    config = get_config("vit_test_token")
    new_config, state = resample_state(init_state(config), config, (24, 32))
    x = images(new_config)
    ref = factory("numpy")(new_config, state)(x)["logits"]
    for port in ("torch", "mlx", "jax"):
        assert_logits_close(port, new_config, state, x, ref, "resampled")


def test_a_distilled_deit_exports_as_deit_with_teacher_and_reads_back_bitwise(tmp_path):
    """distilled=True is transformers' DeiTForImageClassificationWithTeacher: our export loads
    there (from_pretrained) and gives the ports' logits, the mean of its two classifiers; its
    directory reads back as the same config and state bit for bit. The companion: a DeiT checkpoint
    of the classifier without the teacher head is refused, naming the head it lacks."""
    from transformers import DeiTForImageClassificationWithTeacher

    model_cls = DeiTForImageClassificationWithTeacher
    config, state, x, ref = exported_to_transformers("vit_test_distilled", model_cls, tmp_path / "hf")
    assert_logits_close("torch", config, state, x, ref, "our DeiT export in transformers")
    back, back_config = hf.read_hf(tmp_path / "hf")
    assert (
        back_config == config and all(np.array_equal(back[k], state[k]) for k in state) and back.keys() == state.keys()
    )
    settings = json.loads((tmp_path / "hf" / "config.json").read_text())
    settings["architectures"] = ["DeiTForImageClassification"]
    with pytest.raises(WeightError, match="not both heads"):
        hf.hf_config_to_vit(settings)


def test_an_unknown_layout_in_a_files_metadata_is_exit_2_naming_it(tmp_path, cli):
    """A safetensors file whose vit_conformance_layout names no layout (another tool's or an edit):
    the command names the key and the value, exit 2; the companion: the file as written converts."""
    from safetensors.numpy import load_file, save_file
    from safetensors import safe_open

    config = get_config("vit_test_token")
    src = tmp_path / "src.safetensors"
    write(init_state(config, seed=1), config, str(src), "canonical")
    with safe_open(str(src), "np") as f:
        meta = dict(f.metadata())
    odd = tmp_path / "odd.safetensors"
    save_file(load_file(str(src)), str(odd), metadata={**meta, "vit_conformance_layout": "timm_v9"})
    code, out, err = cli("convert", odd, tmp_path / "a.safetensors", "--to", "torch")
    assert code == 2 and "vit_conformance_layout='timm_v9'" in out + err, out + err
    code, out, err = cli("convert", src, tmp_path / "b.safetensors", "--to", "torch")
    assert code == 0, out + err


def test_a_truncated_npz_member_and_an_npz_that_inflates_a_thousandfold_are_refused_by_name(tmp_path):
    """A member cut short is said to be truncated (not "pickled objects"); a 1 GiB member stored
    in a few KiB (here 8 MiB) is refused from the zip's directory before it is inflated; the companion: an
    ordinary .npz reads."""
    import io
    import zipfile

    from weights.formats import read_npz
    from weights.canonical import WeightError

    buf = io.BytesIO()
    np.save(buf, np.zeros((16, 16), np.float32))
    cut = tmp_path / "cut.npz"
    with zipfile.ZipFile(cut, "w") as z:
        z.writestr("w.npy", buf.getvalue()[:-100])
    with pytest.raises(WeightError, match="truncated or malformed member"):
        read_npz(cut)
    bomb = tmp_path / "bomb.npz"
    with zipfile.ZipFile(bomb, "w", zipfile.ZIP_DEFLATED) as z:
        with z.open("w.npy", "w", force_zip64=True) as f:
            f.write(b"\0" * (8 << 20))  # 8 MiB of zeros deflate to about 8 KiB
    with pytest.raises(WeightError, match="refused before inflating it"):
        read_npz(bomb)
    ok = tmp_path / "ok.npz"
    np.savez(ok, w=np.ones(3, np.float32))
    assert read_npz(ok)["w"].tolist() == [1, 1, 1]
