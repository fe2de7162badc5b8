"""x-transformers' ViTransformerWrapper over an Encoder, unmodified: raw patches flattened (p1 p2 c),
normalised, projected and normalised again, by its bias-free LayerNorm (a LayerNorm without affine,
times a gamma); a learned table over the patches; each block two entries of one ModuleList (the
attention's at 2i with separate to_q, to_k, to_v and to_out without bias, the feed-forward's at
2i + 1 with biases), the residuals added by the Encoder; a final norm; the mean of every token."""

from dataclasses import replace

import numpy as np

from conformance.capture import ModelPort

OPTIONS = {
    "patch_norm": True,
    "embed_norm": True,
    "norm_bias": False,
    "norm_eps": 1e-5,
    "class_token": False,
    "global_pool": "avg",
    "fc_norm": False,
    "qkv_bias": False,
    "proj_bias": False,
    "mlp_bias": True,
}


def build(c, rotary_pos_emb=False):
    """``rotary_pos_emb``: the Encoder's rotary embedding (test_position_schemes)."""
    from x_transformers import Encoder, ViTransformerWrapper

    # norm_add_unit_offset=False: its norms' gamma is the weight (the default holds weight - 1)
    encoder = Encoder(
        dim=c.embed_dim,
        depth=c.depth,
        heads=c.num_heads,
        attn_dim_head=c.head_dim,
        ff_mult=c.mlp_ratio,
        norm_add_unit_offset=False,
        rotary_pos_emb=rotary_pos_emb,
    )
    return ViTransformerWrapper(
        image_size=c.img_size[0],
        patch_size=c.patch_size[0],
        channels=c.in_chans,
        num_classes=c.num_classes,
        attn_layers=encoder,
    ).eval()


def convert(state, config):
    out = {
        "patch_to_embedding.0.gamma": state["patch_embed.patch_norm.weight"],
        "patch_to_embedding.1.weight": state["patch_embed.proj.weight"]
        .transpose(0, 2, 3, 1)
        .reshape(config.embed_dim, -1),
        "patch_to_embedding.1.bias": state["patch_embed.proj.bias"],
        "patch_to_embedding.2.gamma": state["patch_embed.norm.weight"],
        "pos_embedding": state["pos_embed"],
        "attn_layers.final_norm.gamma": state["norm.weight"],
        "mlp_head.weight": state["head.weight"],
        "mlp_head.bias": state["head.bias"],
    }
    C, (ph, pw) = config.in_chans, config.patch_size
    out["patch_to_embedding.0.gamma"] = (
        state["patch_embed.patch_norm.weight"].reshape(C, ph, pw).transpose(1, 2, 0).ravel()
    )
    for i in range(config.depth):
        b, attn, ff = f"blocks.{i}.", f"attn_layers.layers.{2 * i}.", f"attn_layers.layers.{2 * i + 1}."
        out[attn + "0.0.gamma"] = state[b + "norm1.weight"]
        for name, rows in zip(("to_q", "to_k", "to_v"), np.split(state[b + "attn.qkv.weight"], 3)):
            out[f"{attn}1.{name}.weight"] = rows
        out[attn + "1.to_out.weight"] = state[b + "attn.proj.weight"]
        out[ff + "0.0.gamma"] = state[b + "norm2.weight"]
        out[ff + "1.ff.0.0.weight"], out[ff + "1.ff.0.0.bias"] = state[b + "mlp.fc1.weight"], state[b + "mlp.fc1.bias"]
        out[ff + "1.ff.2.weight"], out[ff + "1.ff.2.bias"] = state[b + "mlp.fc2.weight"], state[b + "mlp.fc2.bias"]
    return out


port = ModelPort(
    build, convert=convert, patch_order="p1 p2 c", supports={**OPTIONS, "square_images": True, "square_patches": True}
)


def _scaled_twice(c):
    model = build(c)
    model.attn_layers.layers[0][1].attend.scale = c.head_dim**-0.5 * 2  # the classic scale bug, in block 0
    return model


def _norm_shared(c):
    model = build(c)
    model.attn_layers.layers[1][0][0] = model.attn_layers.layers[0][0][0]  # block 0's two norms one module
    return model


scale_bug_port = replace(port, build=_scaled_twice)
shared_norm_port = replace(port, build=_norm_shared)
