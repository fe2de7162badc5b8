"""What the tests of a Hugging Face tower layout check alike (tests/test_hf_qwen2_5_vl.py, test_hf_sam.py)."""

import numpy as np
import pytest

from weights import hf
from weights.canonical import WeightError


def drawn(model, seed: int):
    """transformers' ``model`` with every parameter drawn anew (normal, 0.2), in eval mode."""
    import torch

    with torch.no_grad():
        for i, p in enumerate(model.parameters()):
            p.copy_(torch.from_numpy(np.random.default_rng(seed + i).normal(0, 0.2, size=p.shape).astype(np.float32)))
    return model.eval()


def refused_with_its_part_after_the_tower(model, path, match: str):
    """``model`` saved whole (its merger, its neck): ``hf.read_hf`` refuses the directory, naming
    the part and how to leave it out."""
    model.save_pretrained(path, safe_serialization=True)
    with pytest.raises(WeightError, match=match):
        hf.read_hf(path)


def written_read_and_loaded(state, config, path, model_cls, to_layout, after: str):
    """``state`` written by ``hf.write_hf`` and read back bitwise; the directory loaded by transformers'
    ``model_cls`` holding the tensors ``to_layout`` makes, but those of the part after the tower
    (keys holding ``after``: drawn anew, none written). Returns the config read back."""
    hf.write_hf(state, config, path)
    again, read = hf.read_hf(path)
    assert sorted(again) == sorted(state) and all(again[k].tobytes() == np.asarray(state[k]).tobytes() for k in state)
    model = model_cls.from_pretrained(path)
    loaded = {k: v.numpy() for k, v in model.state_dict().items() if after not in k}
    ours = to_layout(state, config)
    assert sorted(loaded) == sorted(ours) and all(np.array_equal(loaded[k], ours[k]) for k in ours)
    return read
