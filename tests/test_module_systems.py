"""A model port's model of a module system no capture adapter reads (Haiku, Keras 2) is what
verify cannot do, not what the port did: exit 2 naming the system and the factory route, never
NOT CONFORMANT at ``load``. Keras 3's layers on its torch backend are torch.nn.Modules too: they are
read as Keras's, not as PyTorch's. The classes here stand in for those libraries' (capture reads
only a model's class hierarchy); the companion is that PyTorch, MLX and Keras modules find their
adapters (tests/test_keras.py verifies keras-hub's ViT on both backends)."""

import pytest
import torch

from conformance.capture import ModelPort, framework_of
from conformance.capture.adapters import ModuleSystemNotTaken
from conformance.report import CannotJudge, UsageError
from conformance.verify.forward import verify
from impls import get_config


def stand_in(module: str, *bases):
    return type("Model", bases or (object,), {"__module__": module})


KERAS_ON_TORCH = stand_in("keras.src.backend.torch.layer", torch.nn.Module)
HAIKU = stand_in("haiku._src.module")
SYSTEMS = {
    "keras_2": (stand_in("tf_keras.src.engine.functional"), "a Keras 2 model"),
    "haiku": (HAIKU, "a Haiku model"),
    "unknown": (stand_in("somelib.nets"), "a somelib object"),
}


@pytest.mark.parametrize("system", list(SYSTEMS))
def test_a_model_of_a_module_system_no_adapter_reads_is_a_usage_error_naming_it(system):
    cls, what = SYSTEMS[system]
    with pytest.raises(ModuleSystemNotTaken, match=what) as e:
        framework_of(cls())
    assert isinstance(e.value, CannotJudge) and isinstance(e.value, UsageError)
    assert "give verify a port factory instead" in str(e.value)


def test_verify_of_such_a_model_port_is_exit_2_not_a_finding_about_the_port():
    port = ModelPort(lambda config: HAIKU(), rename={})
    with pytest.raises(ModuleSystemNotTaken, match="a Haiku model"):
        verify(port, get_config("vit_test_token"), port="haiku")


def test_pytorch_mlx_and_keras_modules_find_their_adapters():
    import mlx.nn

    assert framework_of(torch.nn.Linear(2, 2)) == "torch.nn"
    assert framework_of(mlx.nn.Linear(2, 2)) == "mlx.nn"
    assert framework_of(KERAS_ON_TORCH()) == "keras"  # a torch.nn.Module too: Keras's names, Keras's layouts
    assert framework_of(stand_in("keras.src.models.functional")()) == "keras"


def test_a_model_build_returns_quantized_is_a_usage_error_naming_its_quantized_modules():
    """timm's model after torch's dynamic int8 quantization, inside build: verify cannot load float
    weights into it (exit 2), its quantized modules named (not their packed parts) and the route,
    ModelPort(quantize=); never the tool's crash on a packed parameter nor the port blamed for the
    tool's float cast (docs/quantization.md)."""
    import timm

    from conformance.capture.adapters import QuantizedNotTaken

    config = get_config("vit_test_token_square")

    def build(c):
        model = timm.create_model(
            "vit_tiny_patch16_224", img_size=c.img_size, patch_size=c.patch_size, embed_dim=c.embed_dim,
            depth=c.depth, num_heads=c.num_heads, num_classes=c.num_classes,
        ).eval()  # fmt: skip
        return torch.ao.quantization.quantize_dynamic(model, {torch.nn.Linear}, dtype=torch.qint8)

    with pytest.raises(
        QuantizedNotTaken, match=r"9 of the model's modules hold quantized weights \(blocks.0.attn.qkv.*quantize="
    ):
        verify(ModelPort(build, rename={}), config, port="int8")


def test_mlx_quantized_linears_are_found_and_float_ones_are_not():
    """The companion, in MLX: nn.quantize's QuantizedLinear is found; the same model unquantized
    has none (so a float port is judged as before)."""
    import mlx.nn as nn

    from conformance.capture.adapters import quantized_modules

    model = nn.Sequential(nn.Linear(64, 64), nn.GELU(), nn.Linear(64, 8))
    assert quantized_modules(dict(model.named_modules())) == {}
    nn.quantize(model, group_size=64, bits=4)
    found = sorted(quantized_modules(dict(model.named_modules())).values())
    assert found == ["layers.0 (QuantizedLinear)", "layers.2 (QuantizedLinear)"]
