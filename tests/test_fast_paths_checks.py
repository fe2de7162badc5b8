"""The companions of conformance/tests/test_fast_paths.py: each of its properties fails on a deliberately
broken port (and the project's checks that take no port). Not shipped."""

import os
import subprocess
import sys
import numpy as np
import pytest
from conformance import properties as P
from conformance import strategies as S
from conformance.tests.helpers import expect_failure, factory, mutant
from impls import get_config


def test_fast_path_check_fails_on_dropout_in_the_fused_kernel():
    config = get_config("vit_test_token")
    case = P.ModelCase(config, S.WeightCase(0, 4.0).make(config), S.make_images(config, 2, "ordinary", 0))
    expect_failure(P.check_stages_match_oracle, "mutant", mutant("torch_fused_attention_dropout"), case)


def test_mlx_binds_sgemm_to_openblas_when_it_is_installed():
    """In a fresh process, as a user's: importing the MLX port loads OpenBLAS before mlx.core.

    .ci/run sets VIT_CONFORMANCE_EXPECT_OPENBLAS=1 when its install step succeeded; then a
    missing library fails. Elsewhere a missing library is a named skip, never a silent pass."""
    import platform

    from impls.mlx_blas import find_openblas

    if platform.system() != "Linux":
        pytest.skip(f"OpenBLAS binding is for MLX on Linux; this is {platform.system()} (MLX uses Accelerate)")
    if not find_openblas():
        assert os.environ.get("VIT_CONFORMANCE_EXPECT_OPENBLAS") != "1", (
            ".ci/run installed libopenblas0-pthread, yet impls.mlx_blas.find_openblas() does not find it"
        )
        pytest.skip(
            "OpenBLAS (Debian: libopenblas0-pthread) is not installed: MLX runs on its reference BLAS, "
            "correct but slow; .ci/run installs it where it can (root or sudo, apt-get)"
        )
    code = (
        "from impls import mlx_vit; import mlx.core as mx; from impls.mlx_blas import sgemm_provider;"
        "mx.eval(mx.ones((4, 4)) @ mx.ones((4, 4))); print(sgemm_provider())"
    )
    provider = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert "openblas" in provider, f"cblas_sgemm resolves to {provider}"


def test_mlx_results_with_openblas_equal_those_with_the_reference_blas_within_tolerance(tmp_path):
    """The same MLX forward in a process without OpenBLAS (VIT_CONFORMANCE_MLX_BLAS=0)."""
    config = get_config("vit_test_deep")
    state = S.WeightCase(1, 4.0).make(config)
    x = S.make_images(config, 2, "ordinary", 1)
    np.savez(tmp_path / "in.npz", x=x)
    code = (
        "import numpy as np; from impls import get_config, mlx_vit; from impls.mlx_blas import sgemm_provider;"
        "from conformance.strategies import WeightCase; c = get_config('vit_test_deep');"
        f"x = np.load(r'{tmp_path / 'in.npz'}')['x']; assert 'openblas' not in (sgemm_provider() or '');"
        f"np.save(r'{tmp_path / 'ref.npy'}', mlx_vit.make(c, WeightCase(1, 4.0).make(c), taps=False)(x))"
    )
    env = dict(os.environ, VIT_CONFORMANCE_MLX_BLAS="0")
    subprocess.run([sys.executable, "-c", code], check=True, env=env, capture_output=True)
    reference_blas = np.load(tmp_path / "ref.npy")
    case = P.ModelCase(config, state, x)
    P.check_stages_match_oracle("mlx (OpenBLAS)", lambda c, s: factory("mlx")(c, s, taps=False), case)
    P.check_stages_match_oracle("mlx (reference BLAS)", lambda c, s: lambda images: reference_blas, case)
