"""Factories whose every call runs in the port's own process: how the pytest plugin takes the
ports it is given (``--port``, ``--attention-port``, ``--grad-port``), isolated as verify
isolates them (``conformance.sandbox.isolated``).

A remote factory is called as the port's own (``make(config, state[, dtype=])`` then
``forward(images)``; ``make_attention(state, **options)`` then ``forward(x, context, mask)``;
``make_grad(config, state[, dtype=])`` then ``grad(images, loss)``), but each call of the
returned function builds the port on the state and runs it in the port's process, which the
factory keeps between calls. What ends or stops that process (``os._exit``, ``sys.exit``, a
signal, no answer within the timeout) and what the port does wrong to its inputs are raised as
``PortFailure`` with verify's own reason, so the test fails; after a hang the next calls fail
at once. The port's declaration (``supports``) is read in the test's process, where configs are
drawn: importing the port's module there is checked first in the port's process, so a module
that exits or hangs while imported stops the run as a usage error instead.
"""

from __future__ import annotations

import atexit

import numpy as np

from conformance.returned import Taps
from conformance.sandbox.handed import Case
from conformance.sandbox.isolated import Isolated, default_timeout


class PortFailure(AssertionError):
    """The port's call did not return: verify's findings on it, joined by semicolons."""


def _raise(findings) -> None:
    raise PortFailure("; ".join(f"{stage}: {reason}" for stage, reason in findings) or "the port returned nothing")


class Remote:
    """One port process for one spec and kind (forward, grad, attention), started on first use."""

    def __init__(self, kind: str, spec: str, timeout: float | None = None):
        self.kind, self.spec, self.timeout = kind, spec, timeout
        self.isolated = None
        atexit.register(self.close)

    def check(self) -> None:
        """Import the port in its own process once: its module's exit, hang or error raised here
        (``PortStopped``, ``UsageError``)."""
        self.side().default_config()

    def side(self):
        """The port's process as verify takes it (an ``Isolated`` PortSide), started on first use."""

        if self.isolated is None:
            self.isolated = Isolated(self.kind, self.spec, timeout=self.timeout or 300.0)
        return self.isolated

    def call(self, method: str, case: Case, *args, timeout: float | None = None):
        side = self.side()
        side.timeout = self.timeout or timeout or 300.0
        out, findings = getattr(side, method)(case, *args)
        if out is None:
            _raise(findings)
        return _writable(out)

    def close(self) -> None:
        if self.isolated is not None:
            self.isolated.close()
            self.isolated = None


def _writable(out):
    """The outputs as the port's own call would give them: arrays of this process's, writable
    (verify's wire hands them back mapped or read-only), in the same structure."""

    if isinstance(out, Taps):
        for key in list(out):
            out[key] = _writable(out[key])
        if out.second is not None:
            _writable(out.second)
        return out
    if isinstance(out, dict):
        return {k: _writable(v) for k, v in out.items()}
    if isinstance(out, (list, tuple)):
        return type(out)(_writable(v) for v in out)
    return np.array(out) if isinstance(out, np.ndarray) else out


def _array(a):
    return None if a is None else np.ascontiguousarray(np.asarray(a))


class RemoteFactory:
    """A whole-model port factory (or a gradient factory, ``kind="grad"``) run remotely."""

    def __init__(self, remote: Remote, local):
        self.remote = remote
        self.supports = getattr(local, "supports", None)

    def __call__(self, config, state, dtype: str = "float32", **options):

        if options:  # the protocol's factories take config, state and dtype; built-in ports alone take more
            raise TypeError(f"a given port is called with config, state and dtype only, not {sorted(options)}")
        state = {k: _array(v) for k, v in state.items()}
        remote = self.remote

        def forward(images):
            images = _array(images)
            case = Case("a property's call", images, state)
            return remote.call("forward", case, config, dtype, timeout=default_timeout(config, len(images)))

        def grad(images, loss):
            images = _array(images)
            case = Case("a property's call", images, state)
            return remote.call("backward", case, config, dtype, loss, timeout=default_timeout(config, 3 * len(images)))

        return grad if remote.kind == "grad" else forward


class RemoteAttention:
    """An attention factory ``make_attention(state, **options)`` run remotely."""

    def __init__(self, remote: Remote, local):
        self.remote = remote
        self.supports = getattr(local, "supports", None)

    def __call__(self, state, **options):
        state = {k: _array(v) for k, v in state.items()}

        def forward(x, context=None, mask=None):
            case = Case("a property's call", _array(x), state, _array(context), _array(mask))
            return self.remote.call("attention", case, dict(options))

        return forward
