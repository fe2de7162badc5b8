"""What the capture tests share: a small square config, an example port by name, a port's config
inside what it supports, and three of verify's cases in one batch shape."""

import dataclasses
import importlib

from conformance.capture import ModelPort
from conformance.support import build_config, supports_of
from conformance.verify import Case
from impls import get_config

SMALL = dataclasses.replace(get_config("vit_test_token"), img_size=(16, 16), name="vit_test_token_square")


def example(name: str) -> ModelPort:
    module, _, attr = name.partition(":")
    return getattr(importlib.import_module(f"conformance.examples.{module}"), attr)


def config_for(port, base=SMALL):
    """``base`` moved inside what the port supports."""
    return build_config(supports_of(port), base.to_dict() | {"name": None}) or base


def quick_cases(config, seed=0):
    """Three of verify's cases, in one batch shape (JAX compiles each op once per shape):
    ordinary and trained-like weights (massive activations, a common offset: where a fast
    variance cancels), and weights offset by 1000. verify's own cases add a batch of 1."""
    from conformance.strategies import TrainedLike, WeightCase, make_images

    return [
        Case("ordinary images (batch 3)", make_images(config, 3, "ordinary", seed), WeightCase(seed, 1.0).make(config)),
        Case(
            "trained-like weights (batch 3)",
            make_images(config, 3, "ordinary", seed),
            TrainedLike(seed + 4).make(config),
        ),
        Case(
            "offset 1000 (batch 3)",
            make_images(config, 3, "ordinary", seed),
            WeightCase(seed + 2, 4.0, 1000.0).make(config),
        ),
    ]
