"""timm's NaFlexVit as a port of packed batches (``inputs = "naflex"``): each forward call gets
a dict of patches, their (row, column) and validity, as NaFlexVit's own forward takes it; and
three ports with NaFlex's classic bugs, each one line away from the right one."""

import numpy as np
import torch

from conformance.references import TIMM_NAFLEX, timm_naflexvit, timm_taps


def _port(change=lambda batch: batch, antialias: bool = True):
    def make(config, state, dtype="float32"):
        model = timm_naflexvit(config, state, dtype={"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype])
        model.embeds.pos_embed_antialias = antialias
        return lambda batch: timm_taps(model, change(dict(batch)))

    make.supports, make.inputs = TIMM_NAFLEX, "naflex"  # what NaFlexVit builds
    return make


port = _port()
# every patch declared valid: the padding attended and pooled
padding_attended = _port(lambda b: {**b, "patch_valid": np.ones_like(b["patch_valid"])})
# the coordinates read as (x, y): the table resampled to the grid with its axes swapped
grid_swapped = _port(lambda b: {**b, "patch_coord": np.ascontiguousarray(b["patch_coord"][..., ::-1])})
# the table resampled without antialiasing
no_antialias = _port(antialias=False)
