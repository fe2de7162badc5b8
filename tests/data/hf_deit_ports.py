"""transformers' DeiTForImageClassificationWithTeacher, unmodified but for one injected bug each:
the attention scale doubled in block 0, and one LayerNorm shared by block 0's two branches."""

from dataclasses import replace

from conformance.examples.hf_vit import build_deit, deit_port


def _scaled_twice(config):
    model = build_deit(config)
    model.deit.layers[0].attention.scaling *= 2  # the classic scale bug
    return model


def _norm_shared(config):
    model = build_deit(config)
    layer = model.deit.layers[0]
    layer.layernorm_after = layer.layernorm_before  # one LayerNorm module for both branches
    return model


scale_bug_port = replace(deit_port, build=_scaled_twice)
shared_norm_port = replace(deit_port, build=_norm_shared)
