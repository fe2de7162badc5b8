"""transformers' Siglip2VisionModel, unmodified, as a port of packed batches: the canonical state
written by ``weights.hf`` and read back by ``from_pretrained`` (strictly: nothing missing, nothing
unexpected), called as it takes its inputs (``pixel_values`` the patches, ``pixel_attention_mask``
their validity, ``spatial_shapes`` each row's grid), its taps what it returns: every layer's
hidden states (``embed``, ``blocks.{i}``), ``last_hidden_state`` (``norm``) and the pooler's
output (the logits of a headless tower)."""

import tempfile

import numpy as np
import torch

from impls import VIT_FAMILY

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def port(config, state, dtype="float32"):
    from transformers import Siglip2VisionModel
    from transformers.utils import logging

    from weights import hf

    logging.disable_progress_bar()
    with tempfile.TemporaryDirectory() as tmp:
        hf.write_hf(state, config, tmp)
        model, info = Siglip2VisionModel.from_pretrained(tmp, output_loading_info=True)
    if any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")):
        raise RuntimeError(f"Siglip2VisionModel did not load the checkpoint strictly: {info}")
    model = model.eval().to(DTYPES[dtype])

    @torch.no_grad()
    def forward(batch):
        coord, valid = np.asarray(batch["patch_coord"]), np.asarray(batch["patch_valid"])
        shapes = np.stack([(c[v].max(0) + 1) for c, v in zip(coord, valid)])  # each row's grid (h, w)
        out = model(
            pixel_values=torch.tensor(np.asarray(batch["patches"])).to(DTYPES[dtype]),
            pixel_attention_mask=torch.tensor(valid),
            spatial_shapes=torch.tensor(shapes),
            output_hidden_states=True,
        )
        taps = {"embed": out.hidden_states[0], "norm": out.last_hidden_state, "logits": out.pooler_output}
        taps.update({f"blocks.{i}": h for i, h in enumerate(out.hidden_states[1:])})
        return {k: v.float().numpy() for k, v in taps.items()}

    return forward


port.supports, port.inputs = VIT_FAMILY, "naflex"
