"""``python -m conformance verify``: arguments to a config, a port and a report; exit codes."""

from __future__ import annotations

import json
from pathlib import Path

from conformance.numerics.gradients import check_grad_dtype
from conformance.report import UsageError, resource_problem, tool_failure
from conformance.sandbox.heap import keep_freed_memory
from conformance.sandbox.isolated import Isolated, PortStopped, default_timeout
from conformance.sandbox.portside import DEFAULT_CONFIGS, TAP_ON_A_FACTORY, InProcess, default_config, load_port
from conformance.support import Unsupported
from conformance.verify.attention import verify_attention
from conformance.verify.budget import estimate, machine_memory, seconds, too_large
from conformance.verify.cases import images_of, verify_plan
from conformance.verify.forward import verify
from conformance.verify.grad import GradReport, format_grad_report, verify_grad
from conformance.verify.outputs import Outputs
from conformance.verify.report import Report, format_report
from impls import PORTS, ConfigError, get_config, tap_names
from impls.protocol import ViTConfig
from weights import WeightError, load_state, read_config
from weights.cancel import Cancelled, cancellable, cancelled_line
from weights.config import config_from_json, inline_json
from conformance.sandbox.isolated import close_all
import contextlib
import sys


def with_settings(config: ViTConfig, settings: list[str]) -> ViTConfig:
    """``--set key=value`` applied to a config (a value is JSON, else a string): the field is named
    in any error."""

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
    preset: str | None,
    config_json: str | None,
    weights: str | None,
    make=None,
    settings: list[str] | None = None,
    default: ViTConfig | None = None,
) -> ViTConfig:
    """--preset, --config or the config stored in --weights; failing those ``default`` (the port
    chose it) or ``default_config(make)``; with --set applied."""

    try:
        config = None
        if config_json:
            text = config_json if inline_json(config_json) else Path(config_json).read_text()
            config = config_from_json(text, "--config" if text is config_json else f"the config file {config_json!r}")
        elif preset:
            config = get_config(preset)
        elif weights:
            config = read_config(weights)
        if config is None:
            config = default if default is not None else default_config(make)
        return with_settings(config, settings or [])
    except WeightError as e:
        raise UsageError(str(e)) from None
    except OSError as e:
        raise UsageError(f"cannot read the config file {config_json!r}: {e.strerror}") from None
    except (ConfigError, ValueError, TypeError) as e:
        raise UsageError(f"bad config: {e}") from None


def _side(args, kind: str, spec: str):
    """The port's side of the check: a process of its own (the default) or this one (--in-process)."""

    if kind == "forward" and args.tap and spec in PORTS:  # a built-in port is a factory: said before it starts
        raise UsageError(TAP_ON_A_FACTORY)
    if not getattr(args, "in_process", False):
        memory = getattr(args, "memory_limit", None)
        taps = args.tap if kind == "forward" else ()
        return Isolated(kind, spec, taps, timeout=args.timeout or 300.0, memory=memory and int(memory * 2**30))
    return InProcess(load_port(kind, spec, args.tap if kind == "forward" else ()), spec)


def _stopped(outputs: Outputs, spec: str, e, config: ViTConfig | None = None, attention=None) -> int:
    """The port failed before verify could ask it anything (``PortStopped``): a finding, never a pass."""

    report = Report(spec, config or get_config(DEFAULT_CONFIGS[0]), attention=attention)
    report.failures.append({"case": "-", "stage": e.stage, "reason": str(e)})
    report.first_divergence = e.stage
    return outputs.write(report, format_report(report))


def _show_progress(args) -> bool:
    """A progress bar on a terminal, and never in a run whose report goes to --json."""

    return bool(getattr(sys.stderr, "isatty", lambda: False)()) and not args.json


def dry_run(spec: str, config: ViTConfig, args) -> int:
    """What verify would do, and what it would cost, without running anything."""

    names = [name for name, _ in verify_plan(config, None if not args.weights else {})]
    stages = tap_names(config)
    memory = machine_memory()
    print(f"verify {spec} in {args.dtype}: {config.name or 'config'} {config.to_dict()}")
    print(f"{len(names)} cases: {'; '.join(names)}")
    print(f"{len(stages)} stages per case ({stages[0]} ... {stages[-1]}): {len(names) * len(stages)} comparisons")
    print(
        f"estimate: peak memory {estimate(config) / 1e9:.3g} GB (this machine: "
        f"{'unknown' if memory is None else f'{memory / 1e9:.3g} GB'}), about {seconds(config, images_of(names), len(names)):.0f} s "
        "(docs/performance.md)"
    )
    why = too_large(config)
    if why:
        print(f"would refuse: {why}")
    return 0


def _timeout(args, side, config: ViTConfig) -> None:

    if hasattr(side, "timeout"):
        side.timeout = args.timeout or default_timeout(config)


def run(args) -> int:
    """The whole of ``verify`` and its exit status, every ending in its own class: 0 or 1 a
    verdict; 2 the user's input or the machine's resources (one line); 3 the tool's own failure
    (its last frames); 128 + N a signal N that cancelled the run (one line; the port's processes
    killed and verify's temporary files removed on the way out). The JSON report is written for
    every ending once its path is checked (``Outputs``)."""

    outputs = Outputs(args)
    try:
        with cancellable():
            try:
                outputs.prepare(args)
                return main(args, outputs)
            except UsageError as e:
                print(f"{e.label}: {e}", file=sys.stderr)
                outputs.unfinished(2, str(e))
                return 2
            except Exception as e:  # noqa: BLE001 - the port's failures are findings inside verify: this is ours
                resource = resource_problem(e)
                if resource is not None:
                    print(f"environment error: {resource}", file=sys.stderr)
                    outputs.unfinished(2, resource)
                    return 2
                print(tool_failure(e), file=sys.stderr)
                outputs.unfinished(3, str(e))
                return 3
    except (Cancelled, KeyboardInterrupt) as e:
        close_all()  # again, where the signal interrupted a close on its way
        line, code = cancelled_line("verify", e)
        print(line, file=sys.stderr)
        outputs.unfinished(code, line)
        return code


def main(args, outputs: Outputs) -> int:
    """verify's run once its report paths are prepared (``Outputs.prepare``): the exit status
    of a verdict, or a ``UsageError``."""

    try:
        machine_memory()  # $VIT_CONFORMANCE_MEMORY read before anything starts
    except ValueError as e:
        raise UsageError(str(e)) from None
    if args.attention:
        if args.port:
            raise UsageError("give a whole-model port or --attention, not both")
        if args.grad:
            raise UsageError("give a gradient factory (--grad) alone, without a forward port or --attention")
        kind, spec = "attention", args.attention
    elif args.grad:
        if args.port:
            raise UsageError("give a gradient factory (--grad) alone, without a forward port or --attention")
        return _main_grad(args, outputs)
    elif not args.port:
        raise UsageError("name the port to verify (pkg.module:name), or --attention pkg.module:make_attention")
    else:
        kind, spec = "forward", args.port
    side = _side(args, kind, spec)
    with contextlib.closing(side) if hasattr(side, "close") else contextlib.nullcontext():
        if kind == "attention":
            try:
                report = verify_attention(side, port=spec, seed=args.seed)
            except PortStopped as e:
                return _stopped(outputs, spec, e, attention={})
            return outputs.write(report, format_report(report))
        explicit = args.preset or args.config or args.weights
        if explicit:  # judged (its size too) before the port's process starts
            config, state = _config_and_state(args, dry_run=getattr(args, "dry_run", False))
        try:
            default = side.default_config() if hasattr(side, "default_config") else default_config(side.make)
        except PortStopped as e:
            return _stopped(outputs, spec, e)
        if not explicit:
            config, state = _config_and_state(args, default=default, dry_run=getattr(args, "dry_run", False))
        if getattr(args, "dry_run", False):
            return dry_run(spec, config, args)
        _timeout(args, side, config)
        keep_freed_memory()
        try:
            report = verify(
                side,
                config,
                port=spec,
                state=state,
                seed=args.seed,
                dtype=args.dtype,
                policy=getattr(args, "policy", "mixed"),
                progress=_show_progress(args),
            )
        except PortStopped as e:
            return _stopped(outputs, spec, e, config)
        except (Unsupported, ValueError) as e:
            if isinstance(e, Unsupported) or "tap override" in str(e):
                raise UsageError(str(e)) from None
            raise
    return outputs.write(report, format_report(report))


def _config_and_state(args, default: ViTConfig | None = None, dry_run: bool = False) -> tuple[ViTConfig, dict | None]:
    """--preset / --config / the config stored in --weights (or ``default``, the one that fits the
    port), with --set applied, and --weights' state (or None; not read for a dry run)."""

    config = load_config(args.preset, args.config, args.weights, None, getattr(args, "set", None), default)
    why = None if getattr(args, "force", False) or dry_run else too_large(config)
    if why:
        raise UsageError(why)
    if not args.weights or dry_run:
        return config, None
    try:
        return config, load_state(args.weights, config)
    except WeightError as e:
        raise UsageError(_other_layout(args.weights) or str(e)) from None


def _other_layout(path: str) -> str | None:
    """One line where ``path`` is a checkpoint of another layout than the canonical one verify reads:
    which it is, and the convert that fixes it; else None."""
    from weights.convert import detect

    try:
        layout = detect(path)
    except (WeightError, OSError, ValueError):
        return None
    if layout in ("canonical", "timm"):
        return None
    return (
        f"{path} is a {layout} checkpoint, not the canonical (timm) layout --weights reads: "
        f"python -m weights convert {path} canonical.safetensors --to canonical"
    )


def _main_grad(args, outputs: Outputs) -> int:
    try:
        check_grad_dtype(args.dtype)
    except ValueError as e:
        raise UsageError(f"{e} (docs/gradients.md)") from None
    config, state = _config_and_state(args)
    side = _side(args, "grad", args.grad)
    with contextlib.closing(side) if hasattr(side, "close") else contextlib.nullcontext():
        _timeout(args, side, config)
        try:
            if hasattr(side, "start"):
                side.start()
            report = verify_grad(side, config, port=args.grad, state=state, seed=args.seed, dtype=args.dtype)
        except PortStopped as e:
            report = GradReport(args.grad, config, dtype=args.dtype)
            report.failures.append({"case": "-", "stage": e.stage, "reason": str(e)})
        except Unsupported as e:
            raise UsageError(str(e)) from None
    return outputs.write(report, format_grad_report(report))
