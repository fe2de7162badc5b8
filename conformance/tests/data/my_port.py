from conformance.capture import ModelPort
from my_vit import MyViT  # your model: a PyTorch, MLX or Flax NNX module built from the config

# timm's names -> yours (a segment or a dotted path; {i} for a block index); layouts follow your modules
RENAME = {
    "cls_token": "cls",
    "pos_embed": "pos",
    "patch_embed.proj": "stem",
    "blocks": "layers",
    "norm1": "ln_attn",
    "norm2": "ln_ff",
    "attn.qkv": "to_qkv",
    "attn.proj": "to_out",
    "mlp.fc1": "ff_in",
    "mlp.fc2": "ff_out",
    "norm": "ln_out",
    "head": "classifier",
}
port = ModelPort(MyViT, rename=RENAME)
