"""pytest plugin: run the conformance suite against your own ports.

    pytest --pyargs conformance.tests --port mypkg.mymodule:make [--port ...] [--only-given-ports]
    pytest --pyargs conformance.tests --attention-port mypkg.mymodule:make_attention
    pytest --pyargs conformance.tests --grad-port mypkg.mymodule:make_grad
    pytest --pyargs conformance.tests --port mypkg.mymodule:port --set num_classes=0   # a headless tower

Registered through the ``pytest11`` entry point, so it is active wherever the package is
installed. Tests that apply to a whole model take the ``port`` argument and run for every
given port factory (beside the built-in torch, mlx and jax ports, or instead of them with
``--only-given-ports``); attention tests take ``attention_port``, gradient tests ``grad_port``
(a built-in framework's name or a gradient factory's spec); tests of a framework's
internals (``framework_port``) run for the built-in ports only.
"""

from __future__ import annotations

import os

import pytest

from conformance.numerics.precision import PORT_DTYPES
from conformance import profiles
from conformance.capture import ModelPort
from conformance.home import shadowing
from conformance.report import CannotJudge, UsageError, describe_exception
from conformance.sandbox.portside import WHAT, PortStopped, load_port
from conformance.sandbox.remote import Remote, RemoteAttention, RemoteFactory
from conformance.support import Unsupported, describe, inputs_of, supports_of
from impls import FRAMEWORK_PORTS, load_factory
from impls.protocol import ViTConfig
from conformance.support import fixed_config
from dataclasses import fields
import json
import math
import argparse

# At import, before hypothesis reads --hypothesis-profile: the profiles exist from any directory,
# and the default (ci, or HYPOTHESIS_PROFILE) is active for users' runs too.
profiles.register()
profiles.load_default()


def pytest_addoption(parser):
    group = parser.getgroup("vit-conformance", "ViT conformance suite")
    group.addoption(
        "--port",
        action="append",
        default=[],
        metavar="PKG.MODULE:MAKE",
        help="a port factory make(config, state) -> forward(images) to test (repeatable)",
    )
    group.addoption(
        "--attention-port",
        action="append",
        default=[],
        metavar="PKG.MODULE:MAKE_ATTENTION",
        help="an attention factory make_attention(state, dim=..., context_dim=..., num_heads=..., "
        "head_dim=..., qkv_bias=...) -> forward(x, context, mask) -> (out, weights) (repeatable)",
    )
    group.addoption(
        "--grad-port",
        action="append",
        default=[],
        metavar="PKG.MODULE:MAKE_GRAD",
        help="a gradient factory make_grad(config, state) -> grad(images, loss) -> {'loss', 'params', "
        "'images', 'taps'} to test (repeatable; docs/gradients.md)",
    )
    group.addoption(
        "--dtype",
        default="float32",
        choices=PORT_DTYPES,
        help="what the whole-model cases ask every port to compute in (passed to factories as dtype= unless float32)",
    )
    group.addoption(
        "--only-given-ports",
        action="store_true",
        help="run only the given ports, not the built-in torch, mlx and jax ones",
    )
    group.addoption(
        "--in-process-ports",
        action="store_true",
        help="run the given ports in pytest's own process, as the built-in ones (no isolation: a port's "
        "os._exit ends the run; for ports you trust, such as the project's zoo)",
    )
    group.addoption(
        "--vit-timeout",
        type=_seconds,
        default=None,
        metavar="SECONDS",
        help="a call into a given port that gives no answer this long fails its test (default: verify's, 300 s "
        "plus a second per GFLOP of a batch's forward); each given port runs in a process of its own",
    )
    group.addoption(
        "--set",
        action="append",
        default=[],
        dest="vit_set",
        metavar="KEY=VALUE",
        help="fix one config field in every config drawn for the whole-model ports (repeatable; the "
        "value is JSON: --set num_classes=0 --set depth=2), as verify's --set",
    )


def _seconds(text: str) -> float:

    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"--vit-timeout must be a finite number of seconds above 0, got {text!r}")
    return value


_SETTINGS: dict = {}  # --set: config fields fixed for the whole-model ports' drawn configs


def settings_of(items: list[str]) -> dict:
    """--set KEY=VALUE items as {field: value} (JSON values, else strings), fields checked."""

    names = {f.name for f in fields(ViTConfig)} - {"name"}
    out = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or key.strip() not in names:
            raise pytest.UsageError(f"--set {item!r}: KEY=VALUE with KEY a config field ({', '.join(sorted(names))})")
        try:
            out[key.strip()] = json.loads(raw)
        except ValueError:
            out[key.strip()] = raw
    return out


def pytest_configure(config):
    from conformance import strategies

    if shadowing():
        raise pytest.UsageError(shadowing())
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    strategies.set_dtype(config.option.dtype)
    _SETTINGS.clear()
    _SETTINGS.update(settings_of(getattr(config.option, "vit_set", [])))
    config.addinivalue_line("markers", "vit_no_port: no port applies (deselected)")
    config.addinivalue_line("markers", "slow: builds full-size models")
    _check_given_ports(config)


KINDS = {"--port": "forward", "--attention-port": "attention", "--grad-port": "grad"}
_GIVEN: dict[str, set[str]] = {kind: set() for kind in KINDS.values()}  # kind -> the specs given
_REMOTES: dict = {}  # (kind, spec) -> conformance.sandbox.remote.Remote: one port process each
_TIMEOUT: list = [None]  # --vit-timeout
_PORT_KINDS: dict[str, str] = {}  # --port spec -> port_kind's answer


def _check_given_ports(config) -> None:
    """Every --port, --attention-port and --grad-port imports in a process of its own (one that
    raises, exits or hangs while imported stops the run here, naming it), then loads here for its
    declaration; not a failing test per property. pytest-xdist's workers leave it to the
    controller."""

    opts = config.option
    _TIMEOUT[0] = opts.vit_timeout
    for flag, kind in KINDS.items():
        specs = set(getattr(opts, flag[2:].replace("-", "_")))
        _GIVEN[kind] = set() if opts.in_process_ports else specs
        for spec in sorted(specs):
            try:
                if not hasattr(config, "workerinput") and not opts.in_process_ports:
                    _remote(kind, spec).check()
                make = load_port(kind, spec)
                if kind == "forward":
                    _PORT_KINDS[spec] = port_kind(make)
            except (PortStopped, UsageError) as e:
                why = str(e).removeprefix(f"cannot load {WHAT[kind]} {spec!r}: ")
                raise pytest.UsageError(f"{flag} {spec!r} cannot be loaded: {why}") from None
            except Exception as e:  # noqa: BLE001 - the port's declaration is the user's to fix
                raise pytest.UsageError(f"{flag} {spec!r} cannot be loaded: {describe_exception(e)}") from None


def port_kind(make) -> str:
    """What the property suite draws for a --port: "images" for a float port of images (every
    property), "packed" for a port of packed batches (``inputs="naflex"``) and "quantized" for a
    quantized ModelPort, which the image properties cannot feed or bound: those are judged as
    verify judges them, on drawn configs (conformance/tests/test_port_kinds.py)."""

    if inputs_of(make) == "naflex":
        return "packed"
    return "quantized" if isinstance(make, ModelPort) and make.quantize is not None else "images"


def kind_of(spec: str) -> str:
    """``port_kind`` of a --port given to this run, or of one of the project's own ports."""

    return _PORT_KINDS.get(spec) or port_kind(load_port("forward", spec))


def verified_side(spec: str):
    """What verify judges a --port through in the property suite: its own process, as every given
    port runs (``conformance.sandbox.isolated``); the project's own ports in this one."""

    return _remote("forward", spec).side() if spec in _GIVEN["forward"] else load_port("forward", spec)


def _remote(kind: str, spec: str):

    if (kind, spec) not in _REMOTES:
        _REMOTES[(kind, spec)] = Remote(kind, spec, _TIMEOUT[0])
    return _REMOTES[(kind, spec)]


def given(spec: str, kind: str = "forward"):
    """The factory a test calls for a port: a port given to this run (``--port`` and its kin)
    runs in a process of its own (``conformance.sandbox.remote``), as verify runs it; the built-in
    ports and the project's own test ports run here."""

    local = load_port(kind, spec)
    if spec not in _GIVEN.get(kind, ()):
        return local

    return (RemoteAttention if kind == "attention" else RemoteFactory)(_remote(kind, spec), local)


def pytest_unconfigure(config):
    for remote in _REMOTES.values():
        remote.close()
    _REMOTES.clear()


def _parametrize(metafunc, name: str, values: list[str]) -> None:
    if values:
        metafunc.parametrize(name, values, ids=values)
    else:
        metafunc.parametrize(name, [pytest.param(None, marks=pytest.mark.vit_no_port)], ids=["no-port"])


def pytest_generate_tests(metafunc):
    # Direct parametrisation, not fixtures: hypothesis re-runs the test body per example.
    opts = metafunc.config.option
    builtin = [] if opts.only_given_ports else list(FRAMEWORK_PORTS)
    kinds = {spec: _PORT_KINDS.get(spec, "images") for spec in opts.port}
    if "port" in metafunc.fixturenames:
        _parametrize(metafunc, "port", builtin + [spec for spec, kind in kinds.items() if kind == "images"])
    if "verified_port" in metafunc.fixturenames:  # no built-in port takes packed batches or is quantized
        _parametrize(metafunc, "verified_port", [spec for spec, kind in kinds.items() if kind != "images"])
    if "attention_port" in metafunc.fixturenames:
        _parametrize(metafunc, "attention_port", builtin + list(opts.attention_port))
    if "attention_path" in metafunc.fixturenames:
        # Each built-in port's explicit and fused paths, and every given attention port.
        _parametrize(
            metafunc,
            "attention_path",
            [f"{p}{path}" for p in builtin for path in ("", "+fused")] + list(opts.attention_port),
        )
    if "grad_port" in metafunc.fixturenames:
        _parametrize(metafunc, "grad_port", builtin + list(opts.grad_port))
    if "framework_port" in metafunc.fixturenames:
        _parametrize(metafunc, "framework_port", builtin)


PORT_PARAMS = ("port", "verified_port", "attention_port", "attention_path", "grad_port", "framework_port")


def pytest_collection_modifyitems(config, items):
    # Every test of the shipped suite judges a port (tests/test_plugin.py keeps it so): with
    # --only-given-ports the built-in ports are not parametrized, and a test no given port
    # applies to is marked vit_no_port and deselected. The project's own tests live in tests/.
    deselected = [item for item in items if item.get_closest_marker("vit_no_port")]
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        dropped = {id(item) for item in deselected}
        items[:] = [item for item in items if id(item) not in dropped]


CANNOT_JUDGE = "vit-conformance cannot judge"  # a report's user property: the run is a usage error


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """A model the tool cannot judge (conformance.report.CannotJudge: a module system no adapter
    reads, a part the config has no word for) fails its test with the one line verify prints, marked
    so that the run ends as pytest's usage error (``pytest_sessionfinish``), not as a finding."""

    report = yield
    error = call.excinfo.value if call.excinfo is not None else None
    if isinstance(error, CannotJudge):
        line = f"{getattr(error, 'label', 'usage error')}: {error}"
        report.longrepr = line
        report.user_properties.append((CANNOT_JUDGE, line))
    return report


def _cannot_judge(config) -> tuple[list[str], bool]:
    """(the lines of the tests the tool could not judge, whether every failure of the run is one),
    from the reports pytest's terminal reporter holds (xdist's controller's, under xdist)."""
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    failed = [r for k in ("failed", "error") for r in (reporter.stats.get(k, []) if reporter else [])]
    lines = [[v for k, v in getattr(r, "user_properties", ()) if k == CANNOT_JUDGE] for r in failed]
    return [line[0] for line in lines if line], all(lines)


def pytest_sessionfinish(session, exitstatus):
    """Tests failed only by what the tool cannot judge: pytest's usage error (exit 4), one line
    each; a finding about a port (any other failure) keeps exit 1."""
    lines, only = _cannot_judge(session.config)
    if lines and only and exitstatus == pytest.ExitCode.TESTS_FAILED:
        session.exitstatus = pytest.ExitCode.USAGE_ERROR


def pytest_terminal_summary(terminalreporter):
    for line in dict.fromkeys(_cannot_judge(terminalreporter.config)[0]):
        terminalreporter.write_line(f"vit-conformance: {line}")


@pytest.hookimpl(wrapper=True)
def pytest_pyfunc_call(pyfuncitem):
    """A fixed config (a preset parameter) outside what the port supports is reported as such,
    and so is a property whose every drawn config leaves it (non-square grids for a port of
    square images only)."""
    from hypothesis.errors import Unsatisfiable

    try:
        return (yield)
    except Unsupported as e:
        pytest.skip(str(e))
    except Unsatisfiable:
        supports = _supports(_model_port(pyfuncitem)) if hasattr(pyfuncitem, "callspec") else None
        if supports is None:
            raise
        pytest.skip(f"no config this property draws is one the port supports ({describe(supports)})")


def _supports(port):

    if port is None:
        return None
    try:
        supports = supports_of(load_factory(port))
    except (ImportError, ValueError):
        return None  # the test itself reports a port that does not load
    if _PORT_KINDS.get(port) == "packed" and isinstance(supports, dict):  # images on grids of their own
        supports = {**supports, "dynamic_img_size": (True,)}
    if _SETTINGS and isinstance(supports, dict):  # --set narrows what is drawn for every port
        return {**supports, **_SETTINGS}
    if _SETTINGS:
        fixed = fixed_config(supports)
        return fixed.replace(**_SETTINGS) if fixed is not None else supports
    return supports


def _model_port(item) -> str | None:
    """The whole-model port a test item runs (``port`` or ``verified_port``), if any."""
    params = getattr(getattr(item, "callspec", None), "params", {})
    return params.get("port") or params.get("verified_port")


@pytest.fixture(autouse=True)
def _vit_port_supports(request):
    """Drawn configs stay inside what the test's port declares it supports (conformance.support)."""
    from conformance import strategies

    strategies.set_supports(_supports(_model_port(request.node)))
    yield
    strategies.set_supports(None)


def pytest_report_header(config):
    opts = config.option
    given = list(opts.port) + list(opts.attention_port) + list(opts.grad_port)
    dtype = f", computing in {opts.dtype}" if opts.dtype != "float32" else ""
    if given:
        return (
            f"vit-conformance: ports {given}" + (" only" if opts.only_given_ports else " and the built-in ones") + dtype
        )
    return f"vit-conformance: built-in ports{dtype}" if dtype else None
