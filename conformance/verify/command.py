"""``python -m conformance verify``: arguments to a config, a port and a report; exit codes."""

from __future__ import annotations

import json
from pathlib import Path

from conformance.report import describe_exception
from conformance.verify.attention import verify_attention
from conformance.verify.forward import verify
from conformance.verify.report import Report, format_report, plot_report
from impls import load_factory
from impls.protocol import ViTConfig


class UsageError(Exception):
    """Bad arguments: exit status 2."""


DEFAULT_CONFIGS = ("vit_test_token", "vit_test_token_square")


def default_config(make=None) -> ViTConfig:
    """vit_test_token, or the first of its twins the port supports (its square twin for a port of
    square images only), or vit_test_token moved inside what the port declares; failing all,
    vit_test_token (verify then names the option the port refuses)."""
    from conformance.support import build_config, supports_of, unsupported_option
    from impls import get_config

    supports = supports_of(make) if make is not None else None
    for name in DEFAULT_CONFIGS:
        if unsupported_option(supports, get_config(name)) is None:
            return get_config(name)
    base = get_config(DEFAULT_CONFIGS[0])
    fitted = build_config(supports, {f: getattr(base, f) for f in base.__dataclass_fields__ if f != "name"})
    return fitted if fitted is not None else base


def with_settings(config: ViTConfig, settings: list[str]) -> ViTConfig:
    """``--set key=value`` applied to a config (a value is JSON, else a string): the field is named
    in any error."""
    from impls import ConfigError

    changes = {}
    for item in settings:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise UsageError(f"--set {item!r} must look like KEY=VALUE (e.g. depth=2, num_classes=0)")
        if key not in config.__dataclass_fields__ or key == "name":
            raise UsageError(
                f"--set {key}: not a config field; fields: {', '.join(f for f in config.__dataclass_fields__ if f != 'name')}"
            )
        try:
            changes[key] = json.loads(raw)
        except ValueError:
            changes[key] = raw
    if not changes:
        return config
    try:
        return ViTConfig.from_dict({**config.to_dict(), **changes})
    except (ConfigError, ValueError, TypeError) as e:
        raise UsageError(f"--set {', '.join(f'{k}={v!r}' for k, v in changes.items())}: {e}") from None


def load_config(
    preset: str | None, config_json: str | None, weights: str | None, make=None, settings: list[str] | None = None
) -> ViTConfig:
    from impls import ConfigError, get_config
    from weights import WeightError, read_config

    try:
        config = None
        if config_json:
            # Inline JSON or a file: a long inline config is not a path to probe (ENAMETOOLONG).
            text = config_json if config_json.lstrip().startswith("{") else Path(config_json).read_text()
            config = ViTConfig.from_dict(json.loads(text))
        elif preset:
            config = get_config(preset)
        elif weights:
            config = read_config(weights)
        if config is None:
            config = default_config(make)
        return with_settings(config, settings or [])
    except WeightError as e:
        raise UsageError(str(e)) from None
    except OSError as e:
        raise UsageError(f"cannot read the config file {config_json!r}: {e.strerror}") from None
    except (ConfigError, ValueError, TypeError) as e:
        raise UsageError(f"bad config: {e}") from None


def _load(spec: str, what: str):
    try:
        return load_factory(spec)
    except Exception as e:  # noqa: BLE001 - a module that does not import or parse is a usage error
        raise UsageError(f"cannot load {what} {spec!r}: {describe_exception(e)}") from None


def _with_taps(make, taps: list[str]):
    if not taps:
        return make
    from conformance.capture import ModelPort

    if not isinstance(make, ModelPort):
        raise UsageError(
            "--tap applies to a ModelPort (a model and its weight mapping), not a port factory: a factory "
            "names its taps itself"
        )
    overrides = {}
    for t in taps:
        stage, sep, module = t.partition("=")
        if not sep or not stage or not module:
            raise UsageError(f"--tap {t!r} must look like STAGE=MODULE or STAGE=MODULE:in")
        overrides[stage] = module
    return make.with_taps(overrides)


def _write(report: Report, args) -> None:
    print(format_report(report))
    if args.json:
        Path(args.json).write_text(json.dumps(report.to_dict(), indent=1, allow_nan=False) + "\n")
    if args.plot:
        plot_report(report, args.plot)


def main(args) -> int:
    from conformance.support import Unsupported

    if args.attention:
        if args.port:
            raise UsageError("give a whole-model port or --attention, not both")
        report = verify_attention(_load(args.attention, "attention factory"), port=args.attention, seed=args.seed)
        _write(report, args)
        return 0 if report.conformant else 1
    if args.grad:
        return _main_grad(args)
    if not args.port:
        raise UsageError("name the port to verify (pkg.module:name), or --attention pkg.module:make_attention")
    make = _with_taps(_load(args.port, "port"), args.tap)
    config, state = _config_and_state(args, make)
    try:
        report = verify(
            make,
            config,
            port=args.port,
            state=state,
            seed=args.seed,
            dtype=args.dtype,
            policy=getattr(args, "policy", "mixed"),
        )
    except (Unsupported, ValueError) as e:
        if isinstance(e, Unsupported) or "tap override" in str(e):
            raise UsageError(str(e)) from None
        raise
    _write(report, args)
    return 0 if report.conformant else 1


def _config_and_state(args, make=None) -> tuple[ViTConfig, dict | None]:
    """--preset / --config / the config stored in --weights (or the default that fits the port),
    with --set applied, and --weights' state (or None)."""
    from weights import WeightError, load_state

    config = load_config(args.preset, args.config, args.weights, make, getattr(args, "set", None))
    if not args.weights:
        return config, None
    try:
        return config, load_state(args.weights, config)
    except WeightError as e:
        raise UsageError(str(e)) from None


def _main_grad(args) -> int:
    from conformance.numerics.gradients import check_grad_dtype
    from conformance.support import Unsupported
    from conformance.verify.grad import format_grad_report, load_grad_factory, verify_grad

    if args.port or args.attention:
        raise UsageError("give a gradient factory (--grad) alone, without a forward port or --attention")

    try:
        check_grad_dtype(args.dtype)
    except ValueError as e:
        raise UsageError(f"{e} (docs/gradients.md)") from None
    try:
        make_grad = load_grad_factory(args.grad)
    except (ImportError, ValueError) as e:
        raise UsageError(f"cannot load gradient factory {args.grad!r}: {describe_exception(e)}") from None
    config, state = _config_and_state(args)
    try:
        report = verify_grad(make_grad, config, port=args.grad, state=state, seed=args.seed, dtype=args.dtype)
    except Unsupported as e:
        raise UsageError(str(e)) from None
    print(format_grad_report(report))
    if args.json:
        Path(args.json).write_text(json.dumps(report.to_dict(), indent=1, allow_nan=False) + "\n")
    return 0 if report.conformant else 1
