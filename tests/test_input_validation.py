"""Bad images raise the same clear InputError in every port, before any computation."""

import numpy as np
import pytest

from conformance.tests.helpers import factory
from impls import InputError, get_config
from weights import init_state

CONFIG = get_config("vit_test_token")  # 3 x 16 x 24
STATE = init_state(CONFIG)
PORTS = ["numpy", "torch", "mlx", "jax"]

BAD = {
    "rank": (np.zeros((3, 16, 24), np.float32), "rank 4 (B, C, H, W) = (B, 3, 16, 24), got shape (3, 16, 24)"),
    "channels": (np.zeros((1, 4, 16, 24), np.float32), "3 channels (in_chans) on axis 1, got shape (1, 4, 16, 24)"),
    "size": (np.zeros((1, 3, 24, 16), np.float32), "16x24 (img_size) on axes 2, 3, got shape (1, 3, 24, 16)"),
    "empty": (np.zeros((0, 3, 16, 24), np.float32), "at least one image"),
    "float64": (np.zeros((1, 3, 16, 24), np.float64), "float32, got dtype float64"),
    "int": (np.zeros((1, 3, 16, 24), np.int64), "float32, got dtype int64"),
}


@pytest.mark.parametrize("impl", PORTS)
@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_images_raise_the_same_clear_error_in_every_port(impl, case):
    images, message = BAD[case]
    with pytest.raises(InputError) as info:
        factory(impl)(CONFIG, STATE, taps=False)(images)
    assert message in str(info.value)


@pytest.mark.parametrize("impl", ["torch", "mlx", "jax"])
def test_framework_modules_check_their_native_inputs_too(impl):
    """Called directly on framework arrays, each module raises the same error as the factory."""
    from conformance.builtin import framework

    module, to_fw, _ = framework(impl)
    if impl == "jax":
        model = module._abstract_model(CONFIG, False)
    else:
        model = module.VisionTransformer(CONFIG)
    with pytest.raises(InputError, match="16x24"):
        model(to_fw(np.zeros((1, 3, 24, 16), np.float32)))


@pytest.mark.parametrize("impl", PORTS)
def test_good_images_pass_the_same_check(impl):
    out = factory(impl)(CONFIG, STATE, taps=False)(np.zeros((2, 3, 16, 24), np.float32))
    assert out.shape == (2, 7) and np.isfinite(out).all()
