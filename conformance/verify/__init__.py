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
gradient check), ``drawn`` (the plugin's property for packed and quantized ports: verify on a drawn
config), ``attention`` (an attention port) and ``report`` (text, JSON, plot); none imports another's
caller. The port's side of a check (in this process or its own) is conformance.sandbox, below this
package; the command line is conformance.commands.verify, above it.
"""

import importlib

# Lazily (the names' modules on first use), so the port's process, which imports
# conformance.sandbox.child, pays for neither the error model nor hypothesis.
_HOME = {
    "attention_cases": "attention",
    "verify_attention": "attention",
    "BATCHES": "cases",
    "Case": "cases",
    "default_cases": "cases",
    "state_changes": "cases",
    "verify": "forward",
    "format_grad_report": "grad",
    "verify_grad": "grad",
    "Report": "report",
    "format_report": "report",
    "plot_report": "report",
    "summarize_stages": "report",
}


# The command's names, re-exported for one release (they moved to conformance.commands.verify; the
# package below a command never imports it: this reaches up only when a user asks for one)
_MOVED = {"UsageError": "conformance.report", "load_config": "conformance.commands.verify"}
_MOVED |= {"main": "conformance.commands.verify", "with_settings": "conformance.commands.verify"}
# the port's side, now the sandbox's (conformance.sandbox), re-exported for one release too
_MOVED |= {"default_config": "conformance.sandbox.portside", "load_grad_factory": "conformance.sandbox.portside"}


def __getattr__(name):
    if name in _HOME:
        return getattr(importlib.import_module(f"conformance.verify.{_HOME[name]}"), name)
    if name in _MOVED:
        return getattr(importlib.import_module(_MOVED[name]), name)
    raise AttributeError(f"module 'conformance.verify' has no attribute {name!r}")


__all__ = sorted(_HOME | _MOVED)
