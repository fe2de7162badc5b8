"""python -m conformance [agree] | verify PORT | zoo | bench | docs | calibrate [--grad]

``agree`` (the default): build a preset with seeded weights, run the PyTorch, MLX and JAX ports
and the float64 oracle on the same images, and print a per-stage agreement table.
"""

from __future__ import annotations

import argparse
import sys
import time


from conformance.numerics.precision import PORT_DTYPES
from conformance.numerics.compare import compare_outputs, first_divergence
from conformance.numerics.error_model import CaseModel
from conformance.report import table
from conformance.generators import make_images
from impls import FRAMEWORK_PORTS, PRESETS, get_config, load_factory
from weights import init_state
import math


def agree(args) -> int:
    config = get_config(args.preset)
    state = init_state(config, seed=args.seed)
    images = make_images(config, args.batch, "ordinary", args.seed)
    t0 = time.perf_counter()
    model = CaseModel(config, state, images, args.dtype)
    results = {}
    for port in args.ports:
        out = load_factory(port)(config, state, dtype=args.dtype)(images)
        results[port] = {r.name: r for r in compare_outputs(out, model, dtype=args.dtype)}
    seconds = time.perf_counter() - t0
    print(
        f"{args.preset}: seeded weights (seed {args.seed}), {args.batch} images {config.in_chans}x"
        f"{config.img_size[0]}x{config.img_size[1]}; {args.dtype} ports against the float64 oracle"
    )
    print(
        "error = max over elements of |port - oracle| over the error model's bound for the stage computed from "
        "the port's own inputs (docs/tolerances.md); tol: the calibrated largest error of correct ports x 4\n"
    )
    rows = []
    for name in model.names:
        rs = [results[p][name] for p in args.ports]
        rows.append([name, *[r.ratio for r in rs], rs[0].tol, all(r.ok for r in rs)])
    print(table(["stage", *[f"{p} error" for p in args.ports], "tol", "ok"], rows))
    bad = {p: first_divergence(list(r.values())) for p, r in results.items() if first_divergence(list(r.values()))}
    print()
    if bad:
        for port, stage in bad.items():
            print(f"{port}: diverges first at {stage}")
        return 1
    worst = max((r.separation, p, n) for p, rs in results.items() for n, r in rs.items())
    print(
        f"all {len(args.ports)} ports agree with the oracle at all {len(model.names)} stages; closest to its "
        f"tolerance: {worst[2]} ({worst[1]}) at {worst[0]:.2f} of it; {seconds:.1f} s"
    )
    return 0


def _number(flag: str, kind=float, low: float = 0.0, strict: bool = True):
    """An argparse type: a finite ``kind`` above ``low`` (or at least it, ``strict=False``); any
    other value is refused naming the flag (exit 2)."""

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{flag} takes a number, got {text!r}") from None
        if not math.isfinite(value) or value < low or (strict and value == low):
            bound = f"{'above' if strict else 'at least'} {low:g}"
            raise argparse.ArgumentTypeError(f"{flag} must be a finite number {bound}, got {text!r}")
        return value

    return parse


def _add_agree(parser, sub) -> None:
    """``agree``, the default: its options on the main parser too."""
    p = sub.add_parser("agree", help="per-stage agreement of the built-in ports (the default)")
    for target in (parser, p):
        target.add_argument("--preset", default="vit_tiny_patch16_224", choices=sorted(PRESETS))
        target.add_argument("--seed", type=int, default=0)
        target.add_argument("--batch", type=int, default=2)
        target.add_argument("--ports", nargs="+", default=list(FRAMEWORK_PORTS), choices=list(FRAMEWORK_PORTS))
        target.add_argument("--dtype", default="float32", choices=PORT_DTYPES)


def _add_verify(sub) -> None:
    """``verify``: a port (or --attention, --grad) against the oracle, stage by stage."""
    v = sub.add_parser(
        "verify",
        help="check a port factory against the oracle, stage by stage",
        description="Run a port and the float64 oracle on drawn inputs and report, per stage, "
        "the error against the tolerance and the first divergent stage. "
        "The port runs in a process of its own. "
        "Exit 0: conforms; 1: does not; 2: usage error; 3: the tool's own failure.",
    )
    v.add_argument(
        "port",
        nargs="?",
        help="the port: a factory or a ModelPort, 'pkg.module:name' (or a built-in: torch, mlx, jax, numpy)",
    )
    v.add_argument(
        "--attention",
        metavar="PKG.MODULE:MAKE_ATTENTION",
        help="verify an attention factory instead of a whole model (see docs/verify.md)",
    )
    v.add_argument(
        "--grad",
        metavar="PKG.MODULE:MAKE_GRAD",
        help="verify a gradient factory instead: every tap's cotangent in backward order, every "
        "parameter's gradient and the images' (or a built-in: torch, mlx, jax; docs/gradients.md)",
    )
    v.add_argument(
        "--tap",
        action="append",
        default=[],
        metavar="STAGE=MODULE[:in]",
        help="for a ModelPort: read STAGE from this module's output (or input); {i} for every block, "
        "e.g. blocks.{i}.attn.weights=layers.{i}.attn.softmax (repeatable)",
    )
    group = v.add_mutually_exclusive_group()
    group.add_argument(
        "--preset",
        choices=sorted(PRESETS),
        help="a named config (default: the config stored in "
        "--weights, else vit_test_token or its square twin, "
        "whichever the port supports)",
    )
    group.add_argument("--config", help="a ViTConfig as JSON, inline or a file path")
    v.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override one config field of the preset, --config or default (repeatable; the value is "
        "JSON: --set depth=2 --set num_classes=0)",
    )
    v.add_argument("--weights", help="a canonical safetensors file (default: seeded weights)")
    v.add_argument(
        "--dtype",
        default="float32",
        choices=PORT_DTYPES,
        help="what the port computes in: passed to the factory as dtype= unless float32",
    )
    v.add_argument(
        "--policy",
        default="mixed",
        choices=["mixed", "autocast", "uniform"],
        help="with --dtype bfloat16/float16, what each stage may be stored in: mixed (the dtype or float32, "
        "each stage judged as stored), autocast (as torch.autocast: LayerNorm and the residual "
        "stream in float32), uniform (every stage in the dtype)",
    )
    _add_verify_run(v)


def _add_verify_run(v) -> None:
    """verify's seed, report files, limits and where the port runs."""
    v.add_argument("--seed", type=_number("--seed", int, 0, strict=False), default=0)
    v.add_argument("--json", help="write the report as JSON here")
    v.add_argument("--plot", help="save a plot of error against stage here (PNG, SVG, PDF)")
    v.add_argument(
        "--timeout",
        type=_number("--timeout"),
        metavar="SECONDS",
        help="a call into the port that gives no answer this long is a finding (default: 300 s plus a "
        "second per GFLOP of a batch's forward)",
    )
    v.add_argument(
        "--memory-limit",
        type=_number("--memory-limit"),
        metavar="GB",
        help="the address space the port's process may map (its MemoryError is then a finding)",
    )
    v.add_argument(
        "--force",
        action="store_true",
        help="verify a config even if its estimated memory exceeds this machine's",
    )
    v.add_argument(
        "--dry-run",
        action="store_true",
        help="print the cases, the stages and the estimated time and peak memory, and run nothing",
    )
    v.add_argument(
        "--in-process",
        action="store_true",
        help="run the port in verify's own process (no isolation: faster to start, for debugging)",
    )


def _add_zoo(sub) -> None:
    """``zoo``: the bug zoo through verify and the plugin."""
    z = sub.add_parser("zoo", help="run the bug zoo through verify and the --port plugin, one row per mutant")
    z.add_argument("--mutant", action="append", help="only this mutant (repeatable)")
    z.add_argument("--no-plugin", action="store_true", help="verify only, skip the sampled pytest run")
    z.add_argument(
        "--no-dtypes", action="store_true", help="verify each mutant in its own dtype only, not in all three"
    )
    z.add_argument("--workers", type=int, default=2, help="pytest-xdist workers for the sampled run")
    z.add_argument(
        "--cover",
        action="store_true",
        help="instead: which default case locates each model mutant alone, in each dtype, and the fewest that "
        "locate them all (docs/data/case_cover.json: the cases verify keeps at full size)",
    )
    z.add_argument("--json", help="write the rows as JSON here (docs/data/zoo.json feeds docs/zoo.md)")
    z.add_argument("--markdown", action="store_true", help="print the docs table (markdown) after the run")


def _add_bench(sub) -> None:
    """``bench``: throughput side by side, or verify's own cost (--verify)."""
    b = sub.add_parser("bench", help="forward throughput of every port against timm, side by side")
    b.add_argument(
        "--models",
        nargs="+",
        choices=sorted(PRESETS),
        help="default: ViT-Ti/16, ViT-S/16, ViT-B/16 at 224 (with --verify: every row of the verify benchmark, or those of these presets)",
    )
    b.add_argument("--batches", nargs="+", type=_number("--batches", int, 0), default=[1, 8])
    b.add_argument("--warmup", type=_number("--warmup", int, 0, strict=False), default=2)
    b.add_argument("--repeats", type=_number("--repeats", int, 0), default=5)
    b.add_argument(
        "--json", help="write the rows and the machine here (docs/data/bench.json feeds docs/performance.md)"
    )
    b.add_argument("--markdown", action="store_true", help="print the docs table (markdown) after the run")
    b.add_argument(
        "--verify",
        action="store_true",
        help="measure verify itself instead: wall time, peak memory and the ratio to one float64 oracle forward "
        "(docs/data/bench_verify.json)",
    )
    b.add_argument(
        "--fit",
        nargs="?",
        const=True,
        metavar="JSON",
        help="with --verify: print conformance/verify/budget.py's constants fitted to a verify benchmark's rows "
        "(JSON written by bench --verify --json; default a checkout's docs/data/bench_verify.json) instead of measuring",
    )


def _add_docs(sub) -> None:
    """``docs``: the generated tables."""
    d = sub.add_parser("docs", help="regenerate the tables in docs/ from code and committed measurements")
    d.add_argument("--check", action="store_true", help="only check: exit 1 naming each stale table")


def _add_calibrate(sub) -> None:
    """``calibrate``: its own options, parsed by its module."""
    c = sub.add_parser(
        "calibrate",
        add_help=False,
        help="measure the correct ports' errors the tolerances come from (--grad: the gradient bound's)",
    )
    c.add_argument("rest", nargs="*")


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m conformance", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command")
    _add_agree(parser, sub)
    for add in (_add_verify, _add_zoo, _add_bench, _add_docs, _add_calibrate):
        add(sub)
    return parser


def _command(args) -> int:
    """The parsed command's own main (each in conformance.commands, imported where it is run: the
    frameworks it loads are its own)."""
    if args.command == "bench" and args.fit is not None and not args.verify:
        print("usage error: --fit fits the verify benchmark's rows: give it with --verify", file=sys.stderr)
        return 2
    if args.command == "bench":
        from conformance.commands import bench

        return (bench.verify_main if args.verify else bench.main)(args)
    if args.command == "docs":
        from conformance.commands.docs import main
    elif args.command == "zoo":
        from conformance.commands import zoo

        return (zoo.cover_main if args.cover else zoo.main)(args)
    elif args.command == "verify":
        from conformance.commands.verify import run as main
    else:
        return agree(args)
    return main(args)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["calibrate"]:  # its own options
        from conformance.commands.calibrate import main as calibrate

        return calibrate(argv[1:])
    return _command(parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
