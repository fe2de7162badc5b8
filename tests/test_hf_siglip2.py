"""transformers' SigLIP 2 vision tower (issue: NaFlex): its layout read and written bitwise both
ways through weights.hf, and Siglip2VisionModel, unmodified, CONFORMANT on packed batches (three
grids in one batch, every row padded) as it takes its inputs: patches, a mask, each row's grid."""

from functools import partial

import numpy as np
import pytest

from conformance.profiles import heavy
from conformance.verify.forward import verify
from impls import get_config
from weights import hf, init_state
from weights.canonical import WeightError
from weights.hf import siglip2

# vit_test_naflex as SigLIP 2 holds it: no prefix tokens, the attention pool, a 4 x 4 table resized bilinearly
SIGLIP2 = get_config("vit_test_naflex").replace(
    img_size=16, class_token=False, reg_tokens=0, global_pool="map", fc_norm=None, init_values=None,
    act_layer="gelu_tanh", num_classes=0, pos_embed_grid_size=4, pos_embed_interp_mode="bilinear",
)  # fmt: skip


def test_the_siglip2_layout_round_trips_bitwise_both_ways(tmp_path):
    from transformers import Siglip2VisionConfig, Siglip2VisionModel

    state = init_state(SIGLIP2, seed=2)
    hf.write_hf(state, SIGLIP2, tmp_path)
    back, config = hf.read_hf(tmp_path)
    assert config == SIGLIP2 and all(back[k].tobytes() == state[k].tobytes() for k in state)
    # transformers' own model, every parameter drawn, through canonical and back
    settings = siglip2.vit_config_to_siglip2(SIGLIP2)
    model = Siglip2VisionModel(Siglip2VisionConfig(**{k: v for k, v in settings.items() if k != "architectures"}))
    theirs = {
        k: np.random.default_rng(i).normal(size=v.shape).astype(np.float32)
        for i, (k, v) in enumerate(model.state_dict().items())
    }
    again = siglip2.to_siglip2(siglip2.from_siglip2(theirs, SIGLIP2), SIGLIP2)
    assert sorted(again) == sorted(theirs) and all(again[k].tobytes() == theirs[k].tobytes() for k in theirs)


def test_the_siglip2_layout_refuses_what_it_cannot_hold_by_name():
    with pytest.raises(WeightError, match=r"a 3x5 table \(SigLIP 2's is square\)"):
        siglip2.vit_config_to_siglip2(SIGLIP2.replace(pos_embed_grid_size=(3, 5)))
    with pytest.raises(WeightError, match="class_token=True"):
        siglip2.vit_config_to_siglip2(SIGLIP2.replace(class_token=True))
    wrong = siglip2.to_siglip2(init_state(SIGLIP2), SIGLIP2)
    wrong["embeddings.patch_embedding.weight"] = wrong["embeddings.patch_embedding.weight"][:, :-3]
    with pytest.raises(WeightError, match=r"\(24, 45\): expected \(hidden_size, 48\)"):
        siglip2.from_siglip2(wrong, SIGLIP2)


@pytest.mark.parametrize(
    "dtype",
    [
        "float32",
        pytest.param("bfloat16", marks=pytest.mark.skipif(not heavy(), reason="thorough profile: ci's float32")),
    ],
)
def test_transformers_siglip2_is_conformant_on_packed_batches_unmodified(dtype):
    from tests.data.hf_siglip2_port import port

    report = verify(port, SIGLIP2, port="transformers Siglip2VisionModel", dtype=dtype)
    assert report.conformant, report.failures[:2] or [(s.name, s.ratio) for s in report.stages if not s.ok][:3]
    assert {"embed", "blocks.0", "blocks.1", "norm", "logits"} <= {s.name for s in report.stages}


def test_siglip2_attending_its_padding_is_not_conformant():
    """The companion: the same model told every patch is valid."""
    from tests.data.hf_siglip2_port import port

    def padding_attended(config, state, dtype="float32"):
        forward = port(config, state, dtype)
        return lambda batch: forward({**batch, "patch_valid": np.ones_like(batch["patch_valid"])})

    padding_attended.supports, padding_attended.inputs = port.supports, "naflex"
    report = verify(padding_attended, SIGLIP2, port="Siglip2VisionModel attending its padding")
    assert not report.conformant and report.located() == "blocks.0"


def test_big_visions_naflex_layout_round_trips_bitwise_and_resizes_as_the_config_says(tmp_path):
    """big_vision's NaFlex ViT (models/proj/image_text/naflex_vit.py: a Dense over (h w c) patches,
    a (n, n, D) table resized by jax.image.scale_and_translate, bilinear, antialiased) is SigLIP 2's
    function: its resize is the config's aa_matrix; the companion: without antialias it is not."""
    import jax
    import jax.numpy as jnp

    from weights.convert import detect, read, write
    from weights.resample import aa_matrix

    state = init_state(SIGLIP2, seed=4)
    path = tmp_path / "siglip2_naflex.npz"
    write(state, SIGLIP2, str(path), "big_vision", npz_flavour="big_vision")
    assert np.load(path)["params/pos_embedding"].shape == (4, 4, 24)
    config, back = read(str(path), detect(str(path)), None)
    assert config == SIGLIP2.replace(act_layer="gelu") and all(back[k].tobytes() == state[k].tobytes() for k in state)
    with pytest.raises(WeightError, match="write flavour 'big_vision'"):
        write(state, SIGLIP2, str(tmp_path / "vit.npz"), "big_vision", npz_flavour="vit")

    # jitted, as big_vision's model runs it (and one program each, not one per op)
    @partial(jax.jit, static_argnums=(0, 1, 2))
    def resize(n_in, n_out, aa):
        return jax.image.scale_and_translate(
            jnp.eye(n_in, dtype=jnp.float32)[:, :, None], (n_in, n_out, 1), (1,), jnp.asarray([n_out / n_in]),
            jnp.asarray([0.0]), method="bilinear", antialias=aa,
        )[:, :, 0]  # fmt: skip

    for n_in, n_out in ((16, 7), (4, 6)):  # down, up
        resized = {aa: np.asarray(resize(n_in, n_out, aa)).T for aa in (True, False)}
        assert np.abs(resized[True] - aa_matrix(n_in, n_out, "bilinear")).max() < 1e-6
        if n_out < n_in:
            assert np.abs(resized[False] - aa_matrix(n_in, n_out, "bilinear")).max() > 1e-2
