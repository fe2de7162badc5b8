"""The tables in docs/ that come from code or measurements, generated, never typed.

    python -m conformance docs            rewrite every generated block in docs/*.md
    python -m conformance docs --check    exit 1 naming each block that differs (a test runs this)

A block sits between ``<!-- generated: NAME -->`` and ``<!-- end generated: NAME -->``. Its
source is code (the zoo's catalogue) or a committed measurement: conformance/numerics/calibration.json
(``python -m conformance calibrate``), docs/data/zoo.json (``python -m conformance zoo --json``)
docs/data/bench.json (``python -m conformance bench --json``) and docs/data/bench_verify.json
(``python -m conformance bench --verify --json``).
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

from conformance.numerics.precision import PORT_DTYPES
from conformance.diagnosis.classes import ATTENTION_CLASSES, CLASSES, GRADIENT_CLASSES, OBSERVED
from conformance.diagnosis.scan import calibration as scan_calibration
from conformance.numerics.tolerances import CHAOTIC_KIND, CHAOTIC_MODE, MARGIN, MODES, calibration, measured
from conformance.verify.budget import estimate, seconds
from conformance.verify.cases import FULL_SIZE, row_plan
from conformance.zoo import MUTANTS
from impls import get_config
from impls.stages import BY_KIND, OPTIONS, STAGES
from weights import options

ROOT = Path(__file__).resolve().parents[2]  # the checkout: conformance/commands/docs.py
DOCS = ROOT / "docs"
DATA = DOCS / "data"
BLOCK = re.compile(r"(<!-- generated: (?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- end generated: (?P=name) -->)", re.S)


def _cell(value, spec: str = ".3g") -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return format(value, spec)
    return str(value).replace("|", "\\|")


def markdown_table(headers: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------- generators


def _recorded(name: str):
    """A committed measurement (docs/data/NAME), or None where there is none yet."""
    path = DATA / name
    return json.loads(path.read_text()) if path.exists() else None


def zoo_table(measured: dict | None = None) -> str:
    """Every mutant of the catalogue, with what `python -m conformance zoo --json` measured: where
    verify locates it and by how much, in its own dtype and (model mutants) in the other two."""

    if measured is None:
        measured = _recorded("zoo.json") or {"mutants": []}
    rows_by_name = {r["name"]: r for r in measured.get("mutants", [])}

    def cell(entry, declared, bug_class):
        if not entry or entry.get("found") is None:
            return "not caught"
        where = "" if entry["found"] == declared else f" at {entry['found']}"
        ratio = entry.get("ratio")
        named = entry.get("named")
        name = "" if named == bug_class else f", named {named}" if named else ", not named"
        if entry.get("pooled") is not None:  # each element within tolerance: systematic over the cases
            return f"systematic (α = {entry['pooled']:.3g})" + where + name
        return ("inf" if ratio is None or ratio == float("inf") else f"{ratio:.3g}") + where + name

    rows = []
    for m in MUTANTS.values():
        r = rows_by_name.get(m.name, {})
        caught = f"{len(r['caught_by'])}/{len(r['sampled'])}" if r.get("sampled") else "-"
        by_dtype = r.get("by_dtype") or {}
        own = {"found": r.get("found"), "ratio": r.get("ratio"), "named": r.get("named")} if r else None
        dtypes = [
            cell(by_dtype.get(d) if by_dtype else (own if d == m.dtype else None), m.first_divergence, m.bug_class)
            if r
            else "not measured"
            for d in PORT_DTYPES
        ]
        if m.level in ("attention", "gradient"):
            dtypes[1:] = ["-", "-"]  # attention factories take no dtype; gradients are checked in float32
        rows.append(
            [
                f"`{m.name}`",
                m.description,
                m.source,
                f"`{m.first_divergence}`",
                f"`{m.bug_class}`",
                m.dtype,
                *dtypes,
                r.get("exposing_case"),
                caught,
            ]
        )
    return markdown_table(
        [
            "mutant",
            "bug",
            "from",
            "declared stage",
            "bug class",
            "dtype",
            "float32",
            "bfloat16",
            "float16",
            "exposing case",
            "caught by",
        ],
        rows,
    )


def bench_table(result: dict | None = None) -> str:
    result = _recorded("bench.json") if result is None else result
    if result is None:
        return "No benchmark recorded yet: `python -m conformance bench --json docs/data/bench.json`.\n"
    m = result["machine"]
    peak = ", ".join(f"{k} {v:.0f} GFLOP/s" for k, v in m["matmul_peak_gflops"].items())
    head = (
        f"Measured with `python -m conformance bench` (warm-up {result['warmup']}, median of {result['repeats']}) "
        f"on {m['processor']}, {m['cores']} cores, {m['platform']}; float32 2048² matmul peak in the same run: "
        f"{peak}; MLX's `cblas_sgemm` from `{m['mlx_sgemm']}`.\n\n"
    )
    names = {
        "vit_tiny_patch16_224": "ViT-Ti/16",
        "vit_small_patch16_224": "ViT-S/16",
        "vit_base_patch16_224": "ViT-B/16",
    }
    rows = [
        [
            names.get(r["model"], r["model"]),
            r["batch"],
            r["port"],
            f"{r['images_per_s']:.2f}",
            f"{r['ratio_to_timm']:.2f}",
            f"{r['gflops']:.0f}",
            f"{100 * r['peak_fraction']:.0f}%",
            f"{r['peak_mb']:.0f}",
        ]
        for r in result["rows"]
    ]
    return head + markdown_table(
        ["model", "batch", "port", "images/s", "× timm", "GFLOP/s", "% of peak", "peak MB"], rows
    )


def tolerance_table() -> str:
    """Per stage kind and dtype: the largest ratio measured on correct ports and the tolerance."""

    table = measured()
    rows = []
    for dtype, modes in table.items():
        for kind in modes["local"]:
            row = [f"`{kind}`", dtype]
            for mode in MODES:
                m = modes.get(mode, {}).get(kind)
                row += ["-" if m is None else f"{m:.3g}", "-" if m is None else f"{MARGIN * m:.3g}"]
            rows.append(row)
    for dtype, modes in table.items():  # end to end past the linear regime, whatever the kind
        m = modes[CHAOTIC_MODE][CHAOTIC_KIND]
        rows.append([f"{CHAOTIC_KIND}, chaotic", dtype, "-", "-", f"{m:.3g}", f"{MARGIN * m:.3g}"])
    return markdown_table(
        [
            "stage kind",
            "dtype",
            "local: largest ratio",
            "local: tolerance",
            "end to end: largest ratio",
            "end to end: tolerance",
        ],
        rows,
    )


def stage_table() -> str:
    """The stage table (impls.stages): every stage, its shape, the option it needs, what it is
    computed from, where capture reads it in a model as written, the weights it uses."""

    plain, qk = get_config("vit_test_token"), get_config("vit_test_token").replace(qk_norm=True)
    rows = []
    for stage in STAGES:
        rule, with_qk = stage.capture_rule(plain), stage.capture_rule(qk)
        capture = f"`{rule}`" + (f" (with `qk_norm`: `{with_qk}`)" if with_qk != rule else "")
        scope = {"block": "blocks.{i}.", "attn_pool": "attn_pool."}.get(stage.scope, "")
        name = (scope + stage.name) if stage.name else scope.rstrip(".")
        rows.append(
            [
                f"`{name}`",
                f"({', '.join(stage.shape.split())})",
                OPTIONS[stage.when],
                ", ".join(f"`{i}`" for i in stage.inputs) or "the images",
                capture,
                ", ".join(f"`{p}`" for p in stage.params),
                stage.note,
            ]
        )
    return markdown_table(
        ["stage", "shape", "exists with", "computed from", "read from a model as written", "weights", "note"], rows
    )


def option_table() -> str:
    """The ViT family's options (weights/options.py): default, the original ViT's values, what each
    layout that restricts it can hold, and its names in the other libraries."""

    def names(o) -> str:
        found = [
            f"{lib}: `{n}`"
            for lib, n in (("transformers", o.hf), ("big_vision", o.big_vision), ("open_clip", o.open_clip))
            if n
        ]
        timm = "timm: none" if o.timm is None else f"timm: `{o.timm}`" if o.timm != o.field else ""
        return "; ".join(([timm] if timm else []) + found)

    rows = [
        [
            f"`{o.field}`",
            f"`{o.default!r}`",
            "-"
            if not o.family
            else ", ".join(f"`{v!r}`" for v in (o.original if isinstance(o.original, tuple) else (o.original,))),
            o.doc,
            "; ".join(f"{layout}: {', '.join(repr(v) for v in values)}" for layout, values in o.holds.items())
            or "every value",
            names(o),
        ]
        for o in options.OPTIONS
    ]
    return markdown_table(["option", "default", "original ViT", "what it is", "layouts hold", "named elsewhere"], rows)


def verify_bench_table(result: dict | None = None) -> str:
    result = _recorded("bench_verify.json") if result is None else result
    if result is None:
        return "Not measured yet: `python -m conformance bench --verify --json docs/data/bench_verify.json`.\n"

    def estimated(r) -> str:
        config, images, batch = row_plan(r)
        return f"{seconds(config, images, len(FULL_SIZE)):.0f} s, {estimate(config, batch) / 1e9:.2f} GB"

    m = result["machine"]
    head = (
        f"Measured with `python -m conformance bench --verify` on {m['processor']}, {m['cores']} cores, "
        f"{result.get('date', '')}: `verify {result['rows'][0]['port']} --preset ...` as a user runs it (the port in "
        "its own process); peak memory of verify's and the port's processes together; *oracle* one float64 NumPy "
        "forward over the same cases in the same run; *estimate* what `verify --dry-run` says beforehand "
        "(conformance/verify/budget.py, fitted to these rows).\n\n"
    )
    rows = [
        [
            r["label"],
            r["tokens"],
            r["depth"],
            r["width"],
            {True: "conformant", False: "NOT", None: f"exit {r['exit']}"}[r["conformant"]],
            f"{r['seconds']:.1f}",
            f"{r['peak_gb']:.2f}",
            f"{r['oracle_seconds']:.2f}",
            f"{r['ratio']:.0f}",
            estimated(r),
        ]
        for r in result["rows"]
    ]
    return head + markdown_table(
        ["config", "tokens", "depth", "width", "verdict", "wall s", "peak GB", "oracle s", "wall / oracle", "estimate"],
        rows,
    )


def spread_table() -> str:
    """Per bin of the propagated spread over the stage's largest magnitude, the correct ports'
    largest end-to-end ratio in each dtype (calibration.json): where the linear regime ends."""

    table = calibration()["end_to_end_by_relative_spread"]
    bins = list(dict.fromkeys(b for by_dtype in table.values() for b in by_dtype))
    cell = lambda d, b: "-" if b not in table[d] else f"{table[d][b]['max']:.3g} ({table[d][b]['n']})"  # noqa: E731
    return markdown_table([r"spread / max\|stage\|", *table], [[b, *(cell(d, b) for d in table)] for b in bins])


def diagnosis_table() -> str:
    """Every bug class (conformance.diagnosis.classes): where it is fitted, what it says, the hint."""
    FAMILY_FORMS = {"token_statistics": "fitted per token", "eps": "fitted over eps", "factor": "fitted constant"}

    by_class: dict[str, list[str]] = {}
    for m in MUTANTS.values():
        by_class.setdefault(m.bug_class, []).append(f"`{m.name}`")
    groups = (("forward", CLASSES), ("attention port", ATTENTION_CLASSES), ("gradient", GRADIENT_CLASSES))
    rows = [
        [
            f"`{c.name}`",
            where,
            "every stage" if set(c.kinds) == set(BY_KIND) else ", ".join(f"`{k}`" for k in c.kinds) or "any",
            FAMILY_FORMS[c.family] if c.family else ("observed" if where == "observed" else form(c)),
            c.says,
            c.hint,
            ", ".join(by_class.get(c.name, [])) or "-",
        ]
        for where, group in (*groups, ("observed", OBSERVED))
        for c in group
    ]
    return markdown_table(["class", "check", "fitted at", "form", "the port computes", "hint", "zoo"], rows)


def scan_table() -> str:
    """The scan's calibration: per dtype the correct ports' largest significant share, where."""
    record = scan_calibration()
    bands = record.get("bands", {})

    def gelu(d):
        lo, hi = bands.get(d, {}).get("gelu_tanh", (0.0, 0.0))
        return f"{lo:.2g} to {hi:.2g}"

    rows = [
        [d, f"{w['alpha']:.3g}", f"`{w['where']}`", len(w["alarms"]), gelu(d), len(w["named"]), len(w["held_out"])]
        for d, w in record["dtypes"].items()
    ]
    return markdown_table(
        [
            "dtype",
            "largest significant share (correct ports)",
            "where",
            "open rule's alarms",
            "band along gelu_tanh",
            "verdict's alarms",
            "verdict's alarms, seed 1",
        ],
        rows,
    )


def scan_size_table() -> str:
    """The scan's bands by size: per dtype and direction, the lowest and highest significant share
    the correct ports measured on the small configs (``bands``) and at each full size
    (``bands_by_size``, ``python -m conformance calibrate --scan-full``), then each activation class
    measured with the port's roundings replayed (every share, significant or not: never banded)."""
    record = scan_calibration()
    order = sorted(record.get("bands_by_size", {}), key=lambda preset: get_config(preset).embed_dim)
    sizes = {preset: record["bands_by_size"][preset] for preset in order}
    replayed = {preset: record.get("replayed_by_size", {}).get(preset, {}) for preset in order}

    def span(band):
        return "-" if band is None else f"{band[0]:.3g} to {band[1]:.3g}"

    rows = []
    for dtype in ("bfloat16", "float16"):
        keys = sorted({k for size in sizes.values() for k in size.get(dtype, {})})
        rows += [
            [
                dtype,
                f"`{k}`",
                span(record["bands"].get(dtype, {}).get(k)),
                *(span(z[dtype].get(k)) for z in sizes.values()),
            ]
            for k in keys
        ]
        bugs = sorted({b for size in replayed.values() for b in size.get(dtype, {})})
        small = record.get("replayed", {}).get(dtype, {})
        rows += [
            [dtype, f"`{b}`, replayed", span(small.get(b)), *(span(z.get(dtype, {}).get(b)) for z in replayed.values())]
            for b in bugs
        ]
    held = record.get("held_out_sizes", {})
    head = (
        f"{len(rows)} directions. Held out (seed 1's cases, judged by these bands): "
        + "; ".join(f"{len(ports)} ports at {preset}" for preset, ports in held.items())
        + f", in bfloat16 and float16: {len(record.get('held_out_full', []))} alarms.\n\n"
    )
    return head + markdown_table(["dtype", "direction", "small configs", *sizes], rows)


def form(c) -> str:
    if c.config:
        return "config: " + ", ".join(f"{k}={v!r}" for k, v in c.config.items())
    if c.state is not None:
        return "state"
    if c.gradient is not None:
        return "reference"
    return "stage"


GENERATORS = {
    "diagnosis": diagnosis_table,
    "scan": scan_table,
    "scan-sizes": scan_size_table,
    "zoo": zoo_table,
    "spread": spread_table,
    "bench": bench_table,
    "verify-bench": verify_bench_table,
    "tolerances": tolerance_table,
    "stages": stage_table,
    "options": option_table,
}


# ----------------------------------------------------------------------------- blocks


def render(text: str) -> str:
    def fill(match: re.Match) -> str:
        name = match.group("name")
        if name not in GENERATORS:
            raise KeyError(f"unknown generated block {name!r}; known: {sorted(GENERATORS)}")
        return match.group(1) + GENERATORS[name]() + match.group(4)

    return BLOCK.sub(fill, text)


def stale_blocks(docs: Path = DOCS) -> list[str]:
    """'file: block' for every generated block whose committed text differs from what the code gives."""
    stale = []
    for path in sorted(docs.glob("*.md")):
        text = path.read_text()
        fresh = render(text)
        if fresh != text:
            old = {m.group("name"): m.group("body") for m in BLOCK.finditer(text)}
            new = {m.group("name"): m.group("body") for m in BLOCK.finditer(fresh)}
            stale += [f"{path.relative_to(docs.parent)}: {name}" for name in new if new[name] != old.get(name)]
    return stale


def main(args) -> int:
    if not DOCS.is_dir():  # an installed package: the docs are the repository's
        print(
            f"usage error: no docs/ beside the package ({DOCS}): `python -m conformance docs` regenerates and checks "
            "a checkout's docs (git clone the repository and run it there)",
            file=sys.stderr,
        )
        return 2
    if args.check:
        stale = stale_blocks()
        for line in stale:
            print(f"stale: {line} (regenerate with python -m conformance docs)", file=sys.stderr)
        return 1 if stale else 0
    for path in sorted(DOCS.glob("*.md")):
        text = path.read_text()
        fresh = render(text)
        if fresh != text:
            path.write_text(fresh)
            print(f"rewrote {path.relative_to(ROOT)}")
    return 0
