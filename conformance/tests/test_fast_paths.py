"""Fast paths (each framework's fused attention, mx.compile, jax.jit) agree with the oracle
within the tolerance policy, as the explicit paths do; and MLX on Linux runs on OpenBLAS."""

import os
import subprocess
import sys

import numpy as np
from hypothesis import given, settings

from conformance import properties as P
from conformance import strategies as S
from conformance.compare import compare_array
from conformance.tests.helpers import budget, expect_failure, factory, mutant
from conformance.tolerances import tolerance
from impls import get_config

FAST = {"torch": dict(fused_attn=True), "mlx": dict(fused_attn=True, compiled=True), "jax": dict(fused_attn=True)}


def check_fast_path_matches_oracle(port, make, case):
    """The fast forward's logits are within the logits tolerance of the oracle."""
    out = P.run_model(port, make, case)
    ref = factory("numpy")(case.config, case.state)(case.images)["logits"]
    r = compare_array("logits", out["logits"], ref, tolerance("logits", regime=case.regime))
    if not r.ok:
        raise P.PropertyFailure(f"[{port}] fast path logits: {r.reason}\n  config: {case.config}\n  {case.info}")


@settings(max_examples=budget(2))
@given(case=S.model_cases())
def test_fused_and_compiled_forward_matches_the_oracle(framework_port, case):
    fast = FAST[framework_port]
    make = lambda config, state: factory(framework_port)(config, state, taps=False, **fast)  # noqa: E731
    check_fast_path_matches_oracle(framework_port, make, case)


def test_fast_path_check_fails_on_dropout_in_the_fused_kernel():
    config = get_config("vit_test_token")
    case = P.ModelCase(config, S.WeightCase(0, 4.0).make(config), S.make_images(config, 2, "ordinary", 0))
    expect_failure(check_fast_path_matches_oracle, "mutant", mutant("torch_fused_attention_dropout"), case)


def test_mlx_binds_sgemm_to_openblas_when_it_is_installed():
    """In a fresh process, as a user's: importing the MLX port loads OpenBLAS before mlx.core."""
    from impls.mlx_blas import find_openblas

    if os.environ.get("CI"):
        assert find_openblas(), "CI installs libopenblas0-pthread (.ci/run): OpenBLAS must be found"
    code = ("from impls import mlx_vit; import mlx.core as mx; from impls.mlx_blas import sgemm_provider;"
            "mx.eval(mx.ones((4, 4)) @ mx.ones((4, 4))); print(sgemm_provider())")
    provider = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    if find_openblas():
        assert "openblas" in provider, f"cblas_sgemm resolves to {provider}"
    else:
        assert "openblas" not in provider


def test_mlx_results_with_openblas_equal_those_with_the_reference_blas_within_tolerance(tmp_path):
    """The same MLX forward in a process without OpenBLAS (VIT_CONFORMANCE_MLX_BLAS=0)."""
    config = get_config("vit_test_deep")
    state = S.WeightCase(1, 4.0).make(config)
    x = S.make_images(config, 2, "ordinary", 1)
    np.savez(tmp_path / "in.npz", x=x)
    code = ("import numpy as np; from impls import get_config, mlx_vit; from impls.mlx_blas import sgemm_provider;"
            "from conformance.strategies import WeightCase; c = get_config('vit_test_deep');"
            f"x = np.load(r'{tmp_path / 'in.npz'}')['x']; assert 'openblas' not in (sgemm_provider() or '');"
            f"np.save(r'{tmp_path / 'ref.npy'}', mlx_vit.make(c, WeightCase(1, 4.0).make(c), taps=False)(x))")
    env = dict(os.environ, VIT_CONFORMANCE_MLX_BLAS="0")
    subprocess.run([sys.executable, "-c", code], check=True, env=env, capture_output=True)
    reference_blas = np.load(tmp_path / "ref.npy")
    ours = factory("mlx")(config, state, taps=False)(x)
    oracle = factory("numpy")(config, state)(x)["logits"]
    for name, logits in (("reference BLAS", reference_blas), ("OpenBLAS", ours)):
        r = compare_array("logits", logits, oracle, tolerance("logits"))
        assert r.ok, f"MLX with {name}: {r.reason}"
