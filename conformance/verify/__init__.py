"""Verify a port against the float64 oracle on a set of drawn inputs, stage by stage.

    python -m conformance verify pkg.module:make [--preset NAME | --config JSON] [--weights PATH]
                                 [--dtype float32|bfloat16|float16] [--json PATH] [--plot PATH]

Exit status: 0 the port conforms, 1 it does not, 2 a usage error (bad port spec, config,
weights file), 3 the tool's own failure (an exception inside the mapping, capture, error model
or comparison: its last frames and a line saying so, never "the port raised"). The oracle runs first, and the port gets read-only copies of the images and
the state: a port that raises, writes to its inputs, changes the state it was handed, returns
the wrong shape or dtype, NaN or Inf, no ``logits``, or a mis-shaped tap is a finding with a
one-line reason, never a traceback. Batches of 3 and 1 images are used.

The package: ``cases`` (verify's fixed cases), ``forward`` (the forward check), ``grad`` (the
gradient check), ``attention`` (an attention port), ``report`` (text, JSON, plot) and ``command``
(the command line); none imports another's caller.
"""

from conformance.verify.attention import attention_cases, verify_attention
from conformance.verify.cases import BATCHES, Case, default_cases, state_changes
from conformance.verify.command import UsageError, default_config, load_config, main, with_settings
from conformance.verify.forward import verify
from conformance.verify.grad import format_grad_report, load_grad_factory, verify_grad
from conformance.verify.report import Report, format_report, plot_report, summarize_stages

__all__ = [
    "BATCHES",
    "Case",
    "Report",
    "UsageError",
    "attention_cases",
    "default_cases",
    "default_config",
    "format_grad_report",
    "format_report",
    "load_config",
    "load_grad_factory",
    "main",
    "plot_report",
    "state_changes",
    "summarize_stages",
    "verify",
    "verify_attention",
    "verify_grad",
    "with_settings",
]
