"""The ports the image properties cannot feed or bound, on drawn configs (issue 58): a port of
packed batches (``inputs="naflex"``) and a quantized ModelPort, each judged as verify judges it
(conformance/verify/drawn.py): packed batches of three grids for the first, the oracle on
the port's own dequantized weights for the second, its widths drawn where its quantizer's groups
divide them (its supports' ``embed_dim=multiple_of(n)``). The plugin gives this test the --port
ports of those kinds (``verified_port``) and the image properties the others."""

from hypothesis import strategies as st

from conformance import strategies as S
from conformance.plugin import kind_of, verified_side
from conformance.tests.helpers import budget, drawn
from conformance.verify.drawn import check_verified


# two patches a side at least: on one, a table resized with its axes swapped is the same table
@drawn(budget(5, minimum=1), shrink=False, config=S.configs(max_depth=2, min_grid=2), seed=st.integers(0, 2**16))
def test_a_packed_or_quantized_port_conforms_on_drawn_configs(verified_port, config, seed):
    packed = kind_of(verified_port) == "packed"
    check_verified(verified_port, verified_side(verified_port), config, seed, packed)
