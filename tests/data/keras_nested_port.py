"""keras-hub's ViTBackbone nested in a wrapper keras.Model, as a VLM holds its vision tower: the
wrapper's call is the backbone's, its weights' own paths start at the backbone while its layers are
named through the wrapper. capture names both by the layers' name chain (``backbone.vit_encoder...``)."""

import os

from conformance.capture import ModelPort
from conformance.examples import keras_hub_vit as K

os.environ.setdefault("KERAS_BACKEND", "jax")


def build(config):
    import keras

    class Tower(keras.Model):
        def __init__(self, backbone, **kwargs):
            super().__init__(**kwargs)
            self.backbone = backbone

        def call(self, images):
            return self.backbone(images)

    backbone = K.build(config)
    backbone.name = "backbone"  # not an automatic name: every build names it alike
    return Tower(backbone)


def convert(state, config):
    return {f"backbone.{k}": v for k, v in K.convert(state, config).items()}


port = ModelPort(build, convert=convert, images="NHWC", output=K.class_token, supports=K.SUPPORTS)
