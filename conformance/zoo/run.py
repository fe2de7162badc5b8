"""python -m conformance zoo: run every mutant through the front door and report.

Each mutant goes through ``verify`` (the same code as ``python -m conformance verify``) for
its first divergent stage and separation ratio, and through one ``pytest --port`` /
``--attention-port`` run of a sample of the property suite (the plugin path a user takes),
for the tests that catch it. The correct ports, wrapped as user ports, run the same sample.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from dataclasses import asdict, dataclass, field

from conformance.verify import verify, verify_attention
from conformance.zoo.catalogue import MUTANTS, Mutant
from impls import get_config, load_factory

ZOO_CONFIG = "vit_test_token"  # 3 heads, 3 channels, square patches on a non-square 4x6 grid

# The sample of the property suite each mutant sees, by the level it plugs in at.
MODEL_SAMPLE = (
    "test_every_tap_of_every_port_matches_the_oracle",
    "test_two_calls_give_bitwise_identical_results",
    "test_each_layernorm_is_used_where_it_belongs",
    "test_a_batch_elements_output_does_not_depend_on_the_others",
    "test_model_attention_weights_are_softmax_of_scaled_qk_over_keys",
    "test_perturbing_one_heads_weights_changes_only_its_slice",
    "test_tokens_come_out_row_major",
)
ATTENTION_SAMPLE = (
    "test_cross_attention_takes_context_of_another_length_and_width",
    "test_boolean_mask_equals_additive_zero_or_minus_inf_mask",
    "test_masked_keys_do_not_influence_the_output",
    "test_weights_sum_to_one_over_keys_not_queries_in_cross_attention",
    "test_adding_a_constant_to_a_querys_logits_changes_nothing",
    "test_permuting_keys_and_values_together_leaves_the_output_unchanged",
    "test_permuting_queries_permutes_the_output",
    "test_large_logits_stay_finite_and_match_the_oracle",
    "test_multihead_attention_is_single_heads_side_by_side",
)
CORRECT_MODEL = ("impls.torch_vit:make", "impls.mlx_vit:make", "impls.jax_vit:make")
CORRECT_ATTENTION = ("impls.torch_vit:make_attention", "impls.mlx_vit:make_attention", "impls.jax_vit:make_attention")


@dataclass
class ZooRow:
    name: str
    framework: str
    level: str
    declared: str
    found: str | None
    ratio: float | None
    exposing_case: str | None
    caught_by: list[str] = field(default_factory=list)
    description: str = ""
    source: str = ""

    @property
    def located(self) -> bool:
        return self.found == self.declared

    @property
    def caught(self) -> bool:
        return self.found is not None or bool(self.caught_by)


def verify_mutant(mutant: Mutant):
    make = load_factory(mutant.factory)
    if mutant.level == "attention":
        return verify_attention(make, port=mutant.name)
    return verify(make, get_config(ZOO_CONFIG), port=mutant.name)


def run_plugin(model_ports, attention_ports, workers: int = 2, profile: str = "zoo") -> dict[str, list[str]]:
    """One pytest run of the sample with the given ports, exactly as a user runs it; returns, per
    port spec, the sampled tests that failed for it (and "<no result>" if none ran)."""
    with tempfile.TemporaryDirectory() as tmp:
        junit = os.path.join(tmp, "zoo.xml")
        cmd = [sys.executable, "-m", "pytest", "--pyargs", "conformance.tests", "--only-given-ports", "-q",
               "-p", "no:cacheprovider", f"--hypothesis-profile={profile}", f"--junitxml={junit}",
               "-k", " or ".join(MODEL_SAMPLE + ATTENTION_SAMPLE)]
        if workers > 1:
            cmd += ["-n", str(workers)]
        for spec in model_ports:
            cmd += ["--port", spec]
        for spec in attention_ports:
            cmd += ["--attention-port", spec]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if not os.path.exists(junit):
            raise RuntimeError(f"pytest did not run (exit {proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
        failed: dict[str, list[str]] = {spec: [] for spec in (*model_ports, *attention_ports)}
        ran: dict[str, int] = {spec: 0 for spec in failed}
        for case in ET.parse(junit).getroot().iter("testcase"):
            name = case.get("name", "")
            test, _, params = name.partition("[")
            spec = next((s for s in failed if s in params), None)
            if spec is None:
                continue
            ran[spec] += 1
            if case.find("failure") is not None or case.find("error") is not None:
                failed[spec].append(test)
        for spec, n in ran.items():
            if n == 0:
                failed[spec].append("<no result>")
        return failed


def run_zoo(mutants=None, with_plugin: bool = True, workers: int = 2) -> tuple[list[ZooRow], dict]:
    mutants = list(MUTANTS.values()) if mutants is None else list(mutants)
    rows = []
    for m in mutants:
        report = verify_mutant(m)
        found = report.first_divergence or (report.failures[0]["stage"] if report.failures else None)
        rows.append(ZooRow(m.name, m.framework, m.level, m.first_divergence, found, report.separation(),
                           report.worst_case.get(report.first_divergence or ""), description=m.description,
                           source=m.source))
    correct: dict = {}
    if with_plugin:
        model = [m.factory for m in mutants if m.level == "model"]
        attention = [m.factory for m in mutants if m.level == "attention"]
        failed = run_plugin(model + list(CORRECT_MODEL), attention + list(CORRECT_ATTENTION), workers)
        for row, m in zip(rows, mutants):
            row.caught_by = failed[m.factory]
        correct = {spec: failed[spec] for spec in (*CORRECT_MODEL, *CORRECT_ATTENTION)}
    return rows, correct


def format_zoo(rows: list[ZooRow], correct: dict) -> str:
    from conformance.report import table

    body = []
    for r in rows:
        caught = ", ".join(t.removeprefix("test_") for t in r.caught_by) if r.caught_by else "-"
        body.append([r.name, r.found or "-", "yes" if r.located else f"no ({r.declared})",
                     None if r.ratio is None else float(r.ratio), r.exposing_case or "-", caught])
    lines = [table(["mutant", "first divergence", "located", "ratio", "exposing case", "caught by (sampled tests)"], body)]
    n_caught = sum(r.caught and bool(r.caught_by or not correct) for r in rows)
    lines.append("")
    lines.append(f"{n_caught} of {len(rows)} mutants caught; {sum(r.located for r in rows)} located at their declared "
                 f"stage; smallest ratio {min((r.ratio for r in rows if r.ratio), default=float('nan')):.3g}")
    for spec, failures in correct.items():
        lines.append(f"correct port {spec}: " + ("passes the sample" if not failures else f"FAILS {failures}"))
    return "\n".join(lines)


def main(args) -> int:
    import json

    names = args.mutant or list(MUTANTS)
    unknown = [n for n in names if n not in MUTANTS]
    if unknown:
        print(f"usage error: unknown mutants {unknown}; known: {sorted(MUTANTS)}", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    rows, correct = run_zoo([MUTANTS[n] for n in names], with_plugin=not args.no_plugin, workers=args.workers)
    print(format_zoo(rows, correct))
    print(f"({time.perf_counter() - t0:.0f} s)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"mutants": [asdict(r) | {"located": r.located} for r in rows], "correct_ports": correct}, f,
                      indent=1)
    ok = all(r.located and (r.caught_by or args.no_plugin) for r in rows) and not any(correct.values())
    return 0 if ok else 1
