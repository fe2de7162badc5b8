"""A port of packed batches whose padding holds NaN (tests/test_naflex.py): every image's own
tokens right, as conformance/examples/naflex_ports.py's port computes them."""

import numpy as np

from conformance.examples.naflex_ports import port
from impls import VIT_FAMILY


def _nan_in_padding(config, state, dtype="float32"):
    """The right port whose blocks' outputs hold NaN in every padding token (a kernel that leaves
    masked rows uninitialised): every image's own tokens are right."""
    forward = port(config, state, dtype)

    def run(batch):
        taps = forward(batch)
        pad = np.nonzero(~np.asarray(batch["patch_valid"]))
        for name in [k for k in taps if k.startswith("blocks.") and k.count(".") == 1]:
            value = np.array(taps[name], dtype=np.float32)
            value[pad[0], pad[1] + config.num_prefix_tokens] = np.nan
            taps[name] = value
        return taps

    return run


_nan_in_padding.supports, _nan_in_padding.inputs = VIT_FAMILY, "naflex"
nan_in_padding = _nan_in_padding
