"""transformers' InternVLVisionModel (InternViT-300M's layout), unmodified, as InternVL reads it: the
last block's tokens (``last_hidden_state``; the tower has no final norm), the merger after it out of
scope. The config says its parts (final_norm=False, LayerScale, q, k and v apart without biases, the
class token); LayerScale is held as bare parameters of each layer (``lambda_1``, ``lambda_2``)."""

from conformance.capture import ModelPort


def _settings(config) -> dict:
    """InternVLVisionConfig's names for the config's sizes."""
    return dict(
        image_size=list(config.img_size),
        patch_size=list(config.patch_size),
        num_channels=config.in_chans,
        hidden_size=config.embed_dim,
        num_hidden_layers=config.depth,
        num_attention_heads=config.num_heads,
        intermediate_size=config.mlp_hidden_dim,
        layer_norm_eps=config.norm_eps,
        layer_scale_init_value=config.init_values,
        use_mean_pooling=True,  # InternVL's: no final norm
    )


def build(config):
    from transformers import InternVLVisionConfig, InternVLVisionModel

    return InternVLVisionModel(InternVLVisionConfig(**_settings(config))).eval()


BLOCK = {
    "norm1": "layernorm_before",
    "attn.q_proj": "attention.q_proj",
    "attn.k_proj": "attention.k_proj",
    "attn.v_proj": "attention.v_proj",
    "attn.proj": "attention.projection_layer",
    "norm2": "layernorm_after",
    "mlp.fc1": "mlp.fc1",
    "mlp.fc2": "mlp.fc2",
}


def convert(state):
    """The canonical state under transformers' names (InternVL's checkpoint layout)."""
    out = {
        "embeddings.cls_token": state["cls_token"],
        "embeddings.position_embeddings": state["pos_embed"],
        "embeddings.patch_embeddings.projection.weight": state["patch_embed.proj.weight"],
        "embeddings.patch_embeddings.projection.bias": state["patch_embed.proj.bias"],
    }
    i = 0
    while f"blocks.{i}.norm1.weight" in state:
        b, layer = f"blocks.{i}.", f"encoder.layer.{i}."
        for ours, theirs in BLOCK.items():
            for leaf in ("weight", "bias"):
                if b + f"{ours}.{leaf}" in state:
                    out[layer + f"{theirs}.{leaf}"] = state[b + f"{ours}.{leaf}"]
        out[layer + "lambda_1"], out[layer + "lambda_2"] = state[b + "ls1.gamma"], state[b + "ls2.gamma"]
        i += 1
    return out


SUPPORTS = {
    "final_norm": False,
    "init_values": lambda v: v is not None,
    "qkv_bias": False,
    "qkv_fused": False,
    "class_token": True,
    "global_pool": "token",
}
port = ModelPort(build, convert=convert, tower="blocks.{last}", supports=SUPPORTS)


def _lambdas_swapped(state):
    """A convert that sends ls1's gamma to lambda_2 and ls2's to lambda_1 (a copy-paste slip)."""
    out = convert(state)
    for key in [k for k in out if k.endswith("lambda_1")]:
        other = key[: -len("1")] + "2"
        out[key], out[other] = out[other], out[key]
    return out


lambdas_swapped = ModelPort(build, convert=_lambdas_swapped, tower="blocks.{last}", supports=SUPPORTS)
