"""Models verified as their authors wrote them: each module builds an unmodified model and
gives the weight mapping from the canonical (timm) names, as a ``ModelPort`` named ``port``.

    python -m conformance verify conformance.examples.timm_vit:port --preset vit_tiny_patch16_224

timm_vit            timm's VisionTransformer (names are timm's: an empty rename), also under torch.autocast
hf_vit              transformers' ViTForImageClassification, ViTModel, CLIPVisionModel, SiglipVisionModel,
                    DeiTForImageClassificationWithTeacher (DeiT's distilled model)
mlx_image_vit       mlx-image's VisionTransformer (MLX, NHWC, separate q/k/v projections)
nnx_vit             a Flax NNX ViT built on nnx.MultiHeadAttention (LinearGeneral kernels)
linen_vit           a Flax linen ViT with the original ViT checkpoints' module names
seed_mlx_vit        the Korean post's MLX ViT as published, and with the shared norm it describes
seed_einops_vit     the Chinese post's einops ViT as published (its "(h d qkv)" split)
torchvision_vit     torchvision's VisionTransformer (nn.MultiheadAttention on its native fast path)
open_clip_vit       open_clip's VisionTransformer, headless (a final norm on the pooled token, or on every token)
quantized           mlx-image's ViT after mlx.nn.quantize, timm's after torch.ao's dynamic int8 (ModelPort(quantize=))
vit_pytorch_port    vit-pytorch's ViT and SimpleViT (lucidrains'), as people write them
eqx_mha_vit         an Equinox ViT on eqx.nn.MultiheadAttention (its vmap over heads read)
naflex_ports        timm's NaFlexVit as a port of packed batches, and NaFlex's classic bugs
"""
