from conformance.capture import ModelPort
from my_vit import RENAME, MyViT  # your model (PyTorch, MLX or Flax NNX, built from the config) and its table

port = ModelPort(MyViT, rename=RENAME)
