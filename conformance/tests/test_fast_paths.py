"""Fast paths (each framework's fused attention, mx.compile, jax.jit) agree with the oracle
within the tolerance policy, as the explicit paths do; and MLX on Linux runs on OpenBLAS."""

from conformance import properties as P
from conformance import strategies as S
from conformance.tests.helpers import budget, drawn, factory

FAST = {"torch": dict(fused_attn=True), "mlx": dict(fused_attn=True, compiled=True), "jax": dict(fused_attn=True)}


@drawn(budget(2), case=S.model_cases())
def test_fused_and_compiled_forward_matches_the_oracle(framework_port, case):
    fast = FAST[framework_port]
    make = lambda config, state: factory(framework_port)(config, state, taps=False, **fast)  # noqa: E731
    P.check_stages_match_oracle(framework_port, make, case)
