"""The four ports on NaFlex's packed batches (impls.*_vit.make_naflex): the float64 oracle on a
packed batch equals itself on each image alone, row by row, for every pooling and the options
around the embedding; the PyTorch, MLX and JAX ports, explicit and fused, CONFORMANT under verify's
packed cases; a malformed batch refused by name. timm's NaFlexVit and transformers' SigLIP 2 on
packed batches are tests/test_naflex.py's and tests/test_hf_siglip2.py's."""

import numpy as np
import pytest

from conformance.profiles import heavy
from conformance.strategies import make_images
from conformance.tests.helpers import factory
from conformance.verify.forward import verify
from conformance.verify.packed import pack, unpack
from impls import NAFLEX_FAMILY, InputError, get_config
from weights import init_state

SMALL = get_config("vit_test_naflex")
GRIDS = ((4, 6), (5, 5), (3, 8))
OPTIONS = {
    "avg, registers": {},
    "map": {"global_pool": "map", "fc_norm": None},
    "avgmax, class token with a position entry": {
        "global_pool": "avgmax", "fc_norm": None, "class_token": True, "no_embed_class": False,
    },
    "max, the norms around the embedding": {
        "global_pool": "max", "fc_norm": None, "patch_norm": True, "embed_norm": True, "pre_norm": True,
    },
    "token, a sin-cos table": {"global_pool": "token", "class_token": True, "pos_embed": "sincos",
                               "pos_embed_grid_size": None},
    "map, SigLIP 2's table resized bilinearly": {"global_pool": "map", "fc_norm": None, "reg_tokens": 0,
                                                 "pos_embed_grid_size": 4, "pos_embed_interp_mode": "bilinear"},
}  # fmt: skip


def packed(config):
    images = [make_images(config, 1, "ordinary", j, grid)[0] for j, grid in enumerate(GRIDS)]
    patches, coord, valid = pack(images, config.patch_size)
    return images, {"patches": patches, "patch_coord": coord, "patch_valid": valid}


@pytest.mark.parametrize("changes", list(OPTIONS.values()), ids=list(OPTIONS))
def test_the_oracle_on_a_packed_batch_is_the_oracle_on_each_image_alone(changes, monkeypatch):
    config = SMALL.replace(**changes)
    forward = factory("numpy")(config, init_state(config, seed=1))
    images, batch = packed(config)
    out = forward(batch)
    for i, (image, (gh, gw)) in enumerate(zip(images, GRIDS)):
        alone, row = forward(image[None]), unpack(out, i, gh * gw, config)
        assert set(row) == set(alone)
        for name in alone:
            assert np.abs(row[name] - alone[name]).max() <= 1e-12 * max(np.abs(alone[name]).max(), 1.0), name
    # the companion: the attention without its mask, the padding attended: the rows differ
    from impls import numpy_vit

    call = numpy_vit.Attention.__call__
    monkeypatch.setattr(numpy_vit.Attention, "__call__", lambda self, x, *a, keep=None, **kw: call(self, x, *a, **kw))
    row, alone = unpack(forward(batch), 0, 24, config), forward(images[0][None])
    assert np.abs(row["blocks.0.attn"] - alone["blocks.0.attn"]).max() > 1e-3


RUNS = [("torch", "float32", {}), ("mlx", "bfloat16", OPTIONS["map"]), ("jax", "float32", OPTIONS["map"])]
if heavy():
    RUNS += [
        (p, d, o) for p in ("torch", "mlx", "jax") for d in ("float32", "bfloat16", "float16") for o in OPTIONS.values()
    ]


@pytest.mark.parametrize("runner, dtype, changes", RUNS)
def test_every_port_is_conformant_on_packed_batches(runner, dtype, changes):
    from impls import load_factory

    make = load_factory(f"impls.{runner}_vit:make_naflex")
    config = SMALL.replace(**changes)
    report = verify(make, config, port=f"{runner}, packed", dtype=dtype)
    assert report.conformant, report.failures[:2] or [(s.name, s.ratio) for s in report.stages if not s.ok][:3]

    if runner != "torch" and not heavy():
        return  # ci budget: MLX's and JAX's fused attention (a program more) in the thorough profile
    if (runner, dtype) == ("jax", "float16"):
        return  # XLA's CPU dot_general has no float16 x float16 -> float32, jax.nn.dot_product_attention's: on images too

    def fused(config, state, dtype="float32"):  # the fused attention, logits only
        return make(config, state, fused_attn=True, taps=False, **({} if dtype == "float32" else {"dtype": dtype}))

    fused.supports, fused.inputs = NAFLEX_FAMILY, "naflex"
    report = verify(fused, config, port=f"{runner}, packed, fused", dtype=dtype)
    assert report.conformant, report.failures[:2] or [(s.name, s.ratio) for s in report.stages if not s.ok][:3]


def test_a_malformed_packed_batch_is_refused_by_name():
    forward = factory("torch")(SMALL, init_state(SMALL))
    _, batch = packed(SMALL)
    with pytest.raises(InputError, match=r"no \['patch_valid'\]"):
        forward({k: v for k, v in batch.items() if k != "patch_valid"})
    with pytest.raises(InputError, match=r"patches \(B, L, 48\)"):
        forward({**batch, "patches": batch["patches"][..., :-1]})
    flipped = batch["patch_valid"][:, ::-1].copy()  # padding first
    with pytest.raises(InputError, match="its patches before its padding"):
        forward({**batch, "patch_valid": flipped})
    with pytest.raises(InputError, match="row 0 of a packed batch holds 28 patches on a 4x6 grid"):
        forward({**batch, "patch_valid": np.ones_like(batch["patch_valid"])})  # the padding declared an image's
