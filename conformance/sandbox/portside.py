"""The port's side of a check: building the port on a case, calling it, and what it did to its
inputs, told as findings. Everything else (the oracle, the error model, the verdict) is verify's.

``PortSide`` is the contract; ``InProcess`` runs the port in verify's own process (the Python
API, the zoo, the plugin) and ``conformance.sandbox.isolated.Isolated`` in a process of its own
(the command line), with the same answers. A finding is ``(stage, reason)``. ``load_port``
turns a spec (pkg.module:name, or a built-in framework) into the factory both sides call.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from conformance.capture import ModelPort
from conformance.capture.observed import unobserved
from conformance.capture.captured import CapturedForward
from conformance.guard import process_state
from conformance.numerics.mapped import let_go
from conformance.report import UsageError, describe_exception
from conformance.sandbox.handed import Case, Handed, finding
from conformance.support import Unsupported, build, build_config, inputs_of, supports_of, unsupported_option
from impls import FRAMEWORK_PORTS, get_config, load_factory
from impls.protocol import ViTConfig

Findings = list[tuple[str, str]]


class PortStopped(Exception):
    """The port failed outside any case, before verify could ask it anything: its module exited or
    hung while imported, its process died, or its ``supports`` declaration raised. A finding at
    ``stage`` ("import", "supports"), never the tool's failure."""

    def __init__(self, reason: str, stage: str = "import"):
        super().__init__(reason)
        self.stage = stage


def declared(fn, *args):
    """``fn(*args)`` where it reads the port's ``supports`` declaration (its predicates are the
    port's code): their exception is the port's, a ``PortStopped`` at "supports"."""

    try:
        return fn(*args)
    except Unsupported:
        raise
    except Exception as e:  # noqa: BLE001 - a predicate of the port's may raise anything
        raise PortStopped(f"the port's supports declaration raised {describe_exception(e)}", "supports") from None


class PortSide(Protocol):
    """What each check asks of the port."""

    name: str

    def unsupported(self, config: ViTConfig) -> str | None:
        """Why the port refuses ``config`` (its declared ``supports``), or None."""

    inputs: str  # what its forward takes (``conformance.support.inputs_of``), known once unsupported has run

    def forward(self, case: Case, config: ViTConfig, dtype: str) -> tuple[Any, Findings]:
        """Build the port on the case's state and run it on its images: (its output or None, findings)."""

    def twice(self, case: Case, config: ViTConfig, dtype: str) -> tuple[tuple[Any, Any] | None, Findings]:
        """Build once, call twice on the same images: (both outputs, or None, findings); the
        first is not held in the port's memory while the second runs where it can be written
        out (a full-size model's taps, twice, would not fit). A captured model is called a third
        time with nothing of capture attached (``conformance.capture.observed.unobserved``): a finding where
        its output is not the observed call's."""

    def backward(self, case: Case, config: ViTConfig, dtype: str, loss) -> tuple[Any, Findings]:
        """Build the gradient factory on the case's state, take ``loss``'s gradients on its images."""

    def attention(self, case: Case, options: dict) -> tuple[Any, Findings]:
        """Build the attention factory on the case's state and call it on (x, context, mask)."""


class _Sink:
    """Findings collected where a report is not at hand (``report.finding``'s interface)."""

    def __init__(self):
        self.failures: list[dict] = []

    def findings(self) -> Findings:
        return [(f["stage"], f["reason"]) for f in self.failures]


class InProcess:
    """The port called in verify's own process, on read-only copies of each case."""

    is_port_side = True

    def __init__(self, make: Callable, name: str = "port", copy: bool = True):
        self.make, self.name, self.copy = make, name, copy  # copy: hand read-only copies (False: as they are)

    def unsupported(self, config: ViTConfig) -> str | None:

        return declared(unsupported_option, supports_of(self.make), config)

    @property
    def inputs(self) -> str:

        return inputs_of(self.make)

    def _build(self, sink: _Sink, handed: Handed, config: ViTConfig, dtype: str):
        """(True, the port's forward for the handed case), or (False, None) with the finding. The
        state's pages, where mapped from verify's file (the port's process), are given back once
        the port is built: a port that copied them does not read them again, and one that did not
        reads them from the page cache."""

        try:
            return handed.call(sink, "load", build, self.make, config, handed.state, dtype)
        finally:
            let_go(*handed.state.values())

    def forward(self, case: Case, config: ViTConfig, dtype: str):

        sink, handed = _Sink(), Handed(case, self.copy)
        with process_state():
            built, forward = self._build(sink, handed, config, dtype)
            if not built:
                return None, sink.findings()
            if not handed.state_kept(sink, "load"):
                return None, sink.findings()
            ran, out = handed.call(sink, "forward", forward, handed.inputs)
        if not ran:
            return None, sink.findings()
        if handed.wrote_images() or handed.changed_state():
            finding(sink, case.name, "forward", "the port wrote to its inputs (images or state) during forward")
            return None, sink.findings()
        return out, sink.findings()

    def twice(self, case: Case, config: ViTConfig, dtype: str, keep: Callable = lambda out: out):
        """``keep``: what is held of the first output while the second runs (the port's process
        writes it to disk)."""
        sink, handed = _Sink(), Handed(case, self.copy)
        with process_state():
            built, forward = self._build(sink, handed, config, dtype)
            if not built:
                return None, sink.findings()
            ran, first = handed.call(sink, "forward", forward, handed.inputs)
            if not ran:
                return None, sink.findings()
            first = keep(first)
            ran, second = handed.call(sink, "forward", forward, handed.inputs)
            if ran and isinstance(forward, CapturedForward):  # and once with nothing of capture attached
                ran, differs = handed.call(sink, "forward", lambda images: unobserved(forward, images), handed.inputs)
                if ran and differs:
                    finding(sink, case.name, "logits", differs)
        return ((first, second) if ran else None), sink.findings()

    def backward(self, case: Case, config: ViTConfig, dtype: str, loss):

        sink, handed = _Sink(), Handed(case, self.copy)

        def backward():
            grad = (
                self.make(config, handed.state) if dtype == "float32" else self.make(config, handed.state, dtype=dtype)
            )
            return grad(handed.images, loss)

        with process_state():
            ran, out = handed.call(sink, "backward", backward)
        if not ran:
            return None, sink.findings()
        if not handed.state_kept(sink, "backward"):
            return None, sink.findings()
        if handed.wrote_images():
            finding(sink, case.name, "backward", "the port wrote to the images it was handed")
            return None, sink.findings()
        return out, sink.findings()

    def attention(self, case: Case, options: dict):

        sink, handed = _Sink(), Handed(case, self.copy)
        with process_state():
            ran, out = handed.call(
                sink,
                "forward",
                lambda: self.make(handed.state, **options)(handed.images, handed.context, case.mask),
            )
        if not ran:
            return None, sink.findings()
        if handed.wrote_images():
            finding(sink, case.name, "forward", "the port wrote to its inputs")
            return None, sink.findings()
        return out, sink.findings()


def port_side(make, name: str = "port") -> PortSide:
    """A factory as the port side of a check (one already a ``PortSide`` is kept)."""
    return make if getattr(make, "is_port_side", False) else InProcess(make, name)


DEFAULT_CONFIGS = ("vit_test_token", "vit_test_token_square")


def default_config(make=None) -> ViTConfig:
    """vit_test_token, or the first of its twins the port supports (its square twin for a port of
    square images only), or vit_test_token moved inside what the port declares; failing all,
    vit_test_token (verify then names the option the port refuses)."""

    supports = supports_of(make) if make is not None else None
    for name in DEFAULT_CONFIGS:
        if declared(unsupported_option, supports, get_config(name)) is None:
            return get_config(name)
    base = get_config(DEFAULT_CONFIGS[0])
    fitted = declared(build_config, supports, {f: getattr(base, f) for f in base.__dataclass_fields__ if f != "name"})
    return fitted if fitted is not None else base


WHAT = {"forward": "port", "grad": "gradient factory", "attention": "attention factory"}


def load_grad_factory(spec: str) -> Callable:
    """A built-in framework's name, 'pkg.module:make_grad', or a ModelPort ('pkg.module:port':
    the unmodified model's gradients, through its mapping)."""

    factory = load_factory(f"impls.{spec}_vit:make_grad" if spec in FRAMEWORK_PORTS else spec)
    return factory.make_grad if isinstance(factory, ModelPort) else factory


def load_port(kind: str, spec: str, taps=()):
    """The factory ``spec`` names for a ``kind`` of check (forward, grad, attention), with a
    forward port's --tap overrides; a module that does not import or parse is a UsageError. A
    module that exits or is interrupted while imported raises that (the caller decides)."""
    try:
        if kind == "grad":
            make = load_grad_factory(spec)
        else:
            make = load_factory(spec)
    except Exception as e:  # noqa: BLE001 - a module that does not import or parse is a usage error
        raise UsageError(f"cannot load {WHAT[kind]} {spec!r}: {describe_exception(e)}") from None
    return with_taps(make, list(taps)) if kind == "forward" else make


TAP_ON_A_FACTORY = (
    "--tap applies to a ModelPort (a model and its weight mapping), not a port factory: a factory names its taps itself"
)


def with_taps(make, taps: list[str]):
    """``--tap STAGE=MODULE`` overrides applied to a ``ModelPort``."""
    if not taps:
        return make

    if not isinstance(make, ModelPort):
        raise UsageError(TAP_ON_A_FACTORY)
    overrides = {}
    for t in taps:
        stage, sep, module = t.partition("=")
        if not sep or not stage or not module:
            raise UsageError(f"--tap {t!r} must look like STAGE=MODULE or STAGE=MODULE:in")
        overrides[stage] = module
    return make.with_taps(overrides)
