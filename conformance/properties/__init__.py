"""The properties a correct ViT port satisfies, as plain functions.

Each ``check_*`` takes a port factory (``make(config, state) -> forward``) or an attention
factory (``make_attention(state, dim=..., ...)``) and one drawn case, and raises
``PropertyFailure`` with a message naming the port, the stage, the case and the errors
against the tolerance. The tests run them on the built-in ports, the ``--port`` plugin on
a user's ports, and the bug zoo on its mutants, so all three exercise the same code.

A property that needs taps the port does not emit raises ``NotApplicable``; a port that
returns only logits is still checked end to end by ``check_matches_oracle``.

The package: ``core`` (the cases, ``PropertyFailure``, running a port, comparing within the
bounds), ``model`` (the whole model and the family's components), ``attention`` (a standalone
attention). A packed or a quantized port's property is verify's own verdict: conformance.verify.drawn.
"""

from conformance.properties.core import (  # noqa: F401
    PropertyFailure,
    NotApplicable,
    ModelCase,
    AttentionCase,
    check_fully_masked_row,
    run_model,
    check_close,
    check_stage,
)
from conformance.properties.model import (  # noqa: F401
    check_matches_oracle,
    check_stages_match_oracle,
    check_layerscale_scales_only_its_branch,
    check_prefix_tokens_as_timm,
    check_qk_norm_per_head,
    check_map_head_queries_with_the_latent,
    check_activation_is_the_named_one,
    check_batch_elements_independent,
    check_batch_size_invariant,
    check_deterministic,
    check_layernorms_in_place,
    check_attention_weights_are_softmax_over_keys,
    check_heads_merge_head_major,
    check_patch_embed_is_rearrange_then_linear,
    check_patch_shift_shifts_tokens,
    check_tokens_row_major,
)
from conformance.properties.attention import (  # noqa: F401
    run_attention,
    check_cross_attention_weights_sum_to_one_over_keys,
    check_query_constant_changes_nothing,
    check_key_value_permutation_invariant,
    check_query_permutation_equivariant,
    check_multihead_is_single_heads_concatenated,
    check_large_logits_finite_and_match_oracle,
)
