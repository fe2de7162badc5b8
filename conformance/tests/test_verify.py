"""`python -m conformance verify`: verdict, exit code, first divergent stage, JSON and plot, on
user ports written outside the project; a misbehaving port is a finding, never a traceback."""

import pytest

from conformance.profiles import heavy
from conformance.verify import verify
from impls import get_config, load_factory, tap_names


CONFIG = get_config("vit_test_token")


def test_builtin_ports_pass_verify(framework_port):
    report = verify(load_factory(framework_port), CONFIG, port=framework_port)
    assert report.conformant, [(s.name, s.reason) for s in report.stages if not s.ok] + report.failures
    assert [s.name for s in report.stages] == tap_names(CONFIG)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_builtin_ports_pass_verify_in_low_precision(framework_port, dtype):
    """In ci torch stands for the three (test_model runs every tap of all three in bf16 and fp16
    through the properties); the thorough profile verifies all three (JAX compiles 10 s here)."""
    if framework_port != "torch" and not heavy():
        pytest.skip(
            "ci budget: MLX and JAX low-precision verify run in the thorough profile; test_model checks "
            "every tap of MLX in bf16 and fp16, of JAX in bf16"
        )
    report = verify(load_factory(framework_port), CONFIG, port=framework_port, dtype=dtype)
    assert report.conformant, [(s.name, s.reason) for s in report.stages if not s.ok] + report.failures


# ----------------------------------------------------------------------------- no false alarms
