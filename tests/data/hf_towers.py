"""transformers' vision towers of today's VLMs that weights.hf.towers reads and writes (AIMv2's,
InternViT's, Pixtral's), built as their importer writes them: from the config.json it writes for a
``ViTConfig``, unmodified, in eval mode."""

from functools import partial

from weights.hf import towers

# model_type -> transformers' config and model classes
CLASSES = {
    towers.AIMV2: ("Aimv2VisionConfig", "Aimv2VisionModel"),
    towers.INTERNVL: ("InternVLVisionConfig", "InternVLVisionModel"),
    towers.PIXTRAL: ("PixtralVisionConfig", "PixtralVisionModel"),
}


def tower(config, model_type: str):
    """transformers' ``model_type`` tower for ``config``."""
    import transformers

    config_class, model_class = (getattr(transformers, name) for name in CLASSES[model_type])
    return model_class(config_class(**towers.hf_settings(config, model_type))).eval()


def builder(model_type: str):
    """A ModelPort's build: config -> transformers' ``model_type`` tower, as its importer writes it."""
    return partial(tower, model_type=model_type)
