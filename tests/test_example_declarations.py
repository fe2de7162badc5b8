"""What a shipped example declares it supports is what its model builds and loads: the plugin draws
configs inside a port's ``supports`` (`pytest --port conformance.examples...`), so an option the
declaration leaves open and the model cannot take is a failing property on a correct model.
torchvision's and open_clip's ViTs build their patch conv for RGB whatever the config says, and
transformers' CLIP and SigLIP layouts always hold q, k and v biases: all four were failing the
property suite that way, from an installed wheel, until their declarations said so."""

import dataclasses

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conformance import strategies as S
from conformance.capture import LoadError
from conformance.sandbox.portside import load_port
from conformance.support import build, supports_of
from weights import WeightError, init_state

# The examples whose models build in milliseconds (PyTorch); each draws as the plugin draws for it
EXAMPLES = (
    "conformance.examples.torchvision_vit:port",
    "conformance.examples.open_clip_vit:port",
    "conformance.examples.hf_vit:port",
    "conformance.examples.hf_vit:clip_port",
    "conformance.examples.hf_vit:siglip_port",
    "conformance.examples.hf_vit:deit_port",
)


def builds_and_loads(make, data) -> None:
    """A config drawn inside what ``make`` declares builds its model and loads its weights."""
    S.set_supports(supports_of(make))
    try:
        config = data.draw(S.configs(max_depth=1), label="config")
    finally:
        S.set_supports(None)
    build(make, config, init_state(config, seed=0))


@pytest.mark.parametrize("spec", EXAMPLES)
@settings(suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(data=st.data())
def test_every_config_a_shipped_example_declares_builds_and_loads(spec, data):
    make = load_port("forward", spec)
    builds_and_loads(make, data)


@pytest.mark.parametrize(
    "spec, option, why",
    [
        ("conformance.examples.torchvision_vit:port", "in_chans", "conv_proj.weight"),
        ("conformance.examples.hf_vit:clip_port", "qkv_bias", "cannot hold qkv_bias=False"),
    ],
)
def test_a_declaration_that_leaves_an_option_open_is_caught(spec, option, why):
    """The companion: the same declarations without the option pinned fail to load, naming it."""
    make = load_port("forward", spec)
    opened = dataclasses.replace(make, supports={k: v for k, v in supports_of(make).items() if k != option})

    @settings(database=None, max_examples=50, derandomize=True)
    @given(data=st.data())
    def run(data):
        builds_and_loads(opened, data)

    with pytest.raises((LoadError, WeightError)) as caught:
        run()
    assert why in str(caught.value)
