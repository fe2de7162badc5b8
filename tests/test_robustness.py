"""A verdict CI can rely on: misbehaving ports, hostile configs and files, and convert's targets,
each asserting the exit code, the one-line message, and that nothing else happened (no
traceback, no file written or replaced). The ports are in tests/data/hostile_ports.py; each runs
in the process verify gives it, as on the command line."""

from __future__ import annotations

import json
import os
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from impls import get_config
from weights import init_state

H = "tests.data.hostile_ports"


@pytest.mark.parametrize(
    "hostile, stage, reason",
    [
        ("exit_0_in_forward", "forward", "the port exited (sys.exit(0)) before returning"),
        ("exit_0_in_factory", "load", "the port exited (sys.exit(0)) before returning"),
        ("os_exit_0_in_forward", "forward", "the port's process exited with status 0 before returning"),
        ("segfault_in_forward", "forward", "the port's process was killed by SIGSEGV (a crash in native code)"),
        ("keyboard_interrupt_in_forward", "forward", "the port raised KeyboardInterrupt"),
    ],
)
def test_a_port_that_ends_its_process_is_not_conformant_with_the_reason(cli, tmp_path, hostile, stage, reason):
    code, out, err = cli("verify", f"{H}:{hostile}", "--json", str(tmp_path / "r.json"))
    report = json.loads((tmp_path / "r.json").read_text())
    assert code == 1 and not report["conformant"] and "Traceback" not in out + err, out + err
    assert report["failures"][0]["stage"] == stage and report["failures"][0]["reason"] == reason
    assert f"FAIL {stage}" in out and "NOT CONFORMANT" in out


def test_a_port_module_that_exits_while_imported_is_not_conformant(cli):
    code, out, err = cli("verify", "tests.data.hostile_import_exit:make")
    assert code == 1 and "the port stopped (sys.exit(0)) while it was imported" in out and "Traceback" not in err


def test_a_port_module_that_raises_while_imported_is_a_usage_error(cli):
    code, out, err = cli("verify", "tests.data.hostile_import_error:make")
    assert code == 2 and err.strip().splitlines() == [
        "usage error: cannot load port 'tests.data.hostile_import_error:make': RuntimeError: this module cannot be "
        "imported"
    ]


def test_a_hanging_port_is_a_finding_within_the_timeout_and_the_remaining_cases_are_not_run(cli, tmp_path):
    start = time.monotonic()
    code, out, err = cli("verify", f"{H}:hangs_in_forward", "--timeout", "1", "--json", str(tmp_path / "r.json"))
    elapsed = time.monotonic() - start
    failures = json.loads((tmp_path / "r.json").read_text())["failures"]
    assert code == 1 and failures[0]["reason"] == "no answer in 1 s", failures[:2]
    assert all(f["reason"] == "not run: no answer in 1 s on an earlier case" for f in failures[1:])
    assert elapsed < 60, elapsed  # one timeout, not one per case (a hang check, not a speed target)


@pytest.mark.parametrize(
    "hostile, conformant",
    [
        ("zeros_with_numpy_abs_patched", False),  # its zeros judged with verify's own numpy
        ("correct_with_numpy_exp_patched", True),
        ("correct_with_numpy_errors_raising", True),
        ("correct_that_changes_directory", True),
        ("correct_that_leaves_a_thread", True),
        ("prints_to_stdout", True),
    ],
)
@pytest.mark.parametrize("where", ["own process", "in process"])
def test_what_a_port_does_to_its_interpreter_cannot_reach_the_verdict(
    cli, tmp_path, monkeypatch, hostile, conformant, where
):
    monkeypatch.chdir(tmp_path)
    flags = ["--in-process"] if where == "in process" else []
    if where == "in process" and hostile == "correct_that_leaves_a_thread":
        pytest.skip("in this process a port's thread outlives verify: what the port's own process is for")
    numpy_abs, errors = np.abs, np.geterr()
    code, out, err = cli("verify", f"{H}:{hostile}", "--json", "r.json", *flags)
    assert code == (0 if conformant else 1), out[-400:] + err[-400:]
    assert json.loads((tmp_path / "r.json").read_text())["conformant"] is conformant  # written where asked
    assert np.abs is numpy_abs and np.geterr() == errors and os.getcwd() == str(tmp_path)
    if hostile == "prints_to_stdout" and where == "own process":
        assert "a port that prints" not in out and "a port that prints" in err  # stdout is the report's


def test_the_companion_a_port_s_numpy_patch_would_fool_a_shared_numpy():
    """What the isolation is for: with the port's numpy.abs patched in the judging process, the
    zeros port would measure no error at all."""
    import importlib

    hostile = importlib.import_module(H)
    saved = np.abs, np.absolute
    try:
        forward = hostile.zeros_with_numpy_abs_patched(get_config("vit_test_token"), {})
        assert float(np.abs(np.float64(-5.0))) == 0.0 and forward(np.zeros((1, 3, 16, 24))).keys() == {"logits"}
    finally:
        np.abs, np.absolute = saved


# ----------------------------------------------------------------------------- exit codes, outputs


def test_an_unwritable_json_path_is_a_usage_error_before_any_work(cli, tmp_path):
    code, out, err = cli("verify", f"{H}:exit_0_in_forward", "--json", str(tmp_path / "missing" / "r.json"))
    assert code == 2 and out == "" and "the directory" in err and "does not exist" in err


def test_a_json_write_that_fails_after_the_verdict_is_exit_2_and_the_verdict_stands(cli):
    code, out, err = cli("verify", f"{H}:prints_to_stdout", "--json", "/dev/full")  # ENOSPC on write
    assert code == 2 and "CONFORMANT: all" in out
    assert (
        [line for line in err.splitlines() if line.startswith("usage error")]
        == [line for line in err.splitlines() if "could not write the report" in line]
        != []
    )


# ----------------------------------------------------------------------------- configs


@pytest.mark.parametrize(
    "config, message",
    [
        ("[]", "a config must be a JSON object of ViTConfig fields, got list"),
        ('{"depth": 10000}', "GB (7.088e+04 M parameters, 197 tokens, 10000 blocks"),
        ('{"img_size": 100000}', "39062501 tokens"),
        ('{"num_classes": 10000000000}', "GB (7.69e+06 M parameters"),
        ('{"num_classes": 1e10}', "num_classes must be an int >= 0, got 10000000000.0"),
        ('{"mlp_ratio": Infinity}', "mlp_ratio must be a finite number, got inf"),
        ('{"norm_eps": "1e-6"}', "norm_eps must be a finite number, got '1e-6'"),
        ("[" * 100000, "nested too deeply"),
        ("missing.json", "cannot read the config file 'missing.json'"),
    ],
)
def test_a_config_verify_cannot_use_is_exit_2_with_one_line_and_the_figure(cli, config, message):
    code, out, err = cli("verify", f"{H}:exit_0_in_forward", "--config", config)
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1 and message in err, err


def test_force_lets_a_config_past_the_memory_estimate():
    """The companion: the same estimate, told the machine has more memory, allows it; and a
    config refused for its stages alone is allowed a block short of the limit."""
    from conformance.verify.budget import MAX_STAGES, estimate, too_large

    config = get_config("vit_base_patch16_224").replace(depth=1000)
    assert "GB" in too_large(config) and too_large(config, memory=estimate(config)) is None
    narrow = get_config("vit_test_token")
    per_block = 10  # vit_test_token's stages per block; 5 outside them
    deepest = (MAX_STAGES - 5) // per_block
    assert too_large(narrow.replace(depth=deepest)) is None
    assert "stages per case" in too_large(narrow.replace(depth=deepest + 1))


def test_the_estimates_hold_their_calibration():
    """The memory and time models against every measurement they were fitted to (the committed
    benchmark, docs/data/bench_verify.json): memory an upper bound, at most 25% over, or 0.35 GB
    where the peak is near the interpreters' own (0.96 to 1.15 GB between runs; a config is refused
    on it); time within 20% (a --dry-run's guide, not a verdict)."""
    from pathlib import Path

    from conformance.verify.budget import FULL_SIZE_BATCH, estimate, seconds
    from conformance.verify.cases import FULL_SIZE, row_plan

    bench = json.loads((Path(__file__).parent.parent / "docs" / "data" / "bench_verify.json").read_text())
    assert len(bench["rows"]) >= 8 and {r.get("batch") for r in bench["rows"]} == {1, FULL_SIZE_BATCH}
    for r in bench["rows"]:
        config, images, batch = row_plan(r)
        peak = r["peak_gb"] * 1e9
        assert peak <= estimate(config, batch) <= max(1.25 * peak, peak + 0.35e9), r["label"]
        assert seconds(config, images, len(FULL_SIZE)) == pytest.approx(r["seconds"], rel=0.20), r["label"]


def test_the_estimates_constants_are_the_fit_to_the_committed_benchmark():
    """budget.py's constants are what ``bench --verify --fit`` computes from the committed rows
    (written to five digits): the calibration is reproducible, not typed in."""
    from pathlib import Path

    from conformance.verify import budget
    from conformance.verify.bench import fit

    bench = json.loads((Path(__file__).parent.parent / "docs" / "data" / "bench_verify.json").read_text())
    for name, value in fit(bench["rows"]).items():
        assert getattr(budget, name) == pytest.approx(value, rel=1e-3), name
    # companion: a row measured twice as large is another fit
    rows = [dict(r, peak_gb=2 * r["peak_gb"]) if i == 0 else r for i, r in enumerate(bench["rows"])]
    assert fit(rows)["BASE"] != pytest.approx(budget.BASE, rel=1e-3)


_FIELD_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=8),
    st.lists(st.integers(-3, 10**6), max_size=3),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    fields=st.dictionaries(
        st.sampled_from(sorted(get_config("vit_test_token").to_dict()) + ["nonsense"]), _FIELD_VALUES, max_size=6
    )
)
def test_any_json_config_is_a_config_or_one_clear_refusal(fields):
    """Fuzzed over field values: load_config gives a config that fits, or a UsageError (exit 2,
    one line); never another exception, never an allocation (the estimate runs first)."""
    from conformance.report import UsageError
    from conformance.commands.verify import load_config

    base = get_config("vit_test_token").to_dict()
    text = json.dumps({**base, **fields}, allow_nan=True)
    try:
        config = load_config(None, text, None)
    except UsageError as e:
        assert "\n" not in str(e) and str(e)
        return
    from conformance.verify.budget import too_large

    too_large(config)  # a figure or None: arithmetic only


@settings(max_examples=60, deadline=None)
@given(header=st.binary(max_size=64), size=st.integers(0, 2**64 - 1))
def test_any_safetensors_header_is_read_or_refused_naming_the_file(tmp_path_factory, header, size):
    """Fuzzed over header bytes and the announced header length: a WeightError naming the file,
    never another exception."""
    from weights import WeightError, load_state

    path = tmp_path_factory.mktemp("h") / "w.safetensors"
    path.write_bytes(size.to_bytes(8, "little") + header)
    with pytest.raises(WeightError, match="w.safetensors"):
        load_state(path, get_config("vit_test_token"))


# ----------------------------------------------------------------------------- weights


@pytest.fixture(scope="module")
def state():
    return init_state(get_config("vit_test_token"), seed=0)


def _write(path, state, dtype):
    """A timm state dict in ``dtype``, as .safetensors or .pth."""
    import torch

    tensors = {k: torch.from_numpy(v.astype(np.float64)).to(getattr(torch, dtype)) for k, v in state.items()}
    if str(path).endswith(".pth"):
        torch.save(tensors, path)
    else:
        from safetensors.torch import save_file

        save_file(tensors, str(path))


@pytest.mark.parametrize("suffix", [".safetensors", ".pth"])
@pytest.mark.parametrize(
    "dtype, plain, cast",
    [
        ("float32", None, None),
        ("float16", "float16, where the canonical format is float32: pass --cast", None),
        ("bfloat16", "bfloat16, where the canonical format is float32: pass --cast", None),
        ("float64", "float64, where the canonical format is float32: pass --cast", None),
        ("int8", "dtype int8, expected float32", "dtype int8, expected float32"),
        ("complex64", "dtype complex64, expected float32", "dtype complex64, expected float32"),
    ],
)
def test_every_load_path_accepts_and_refuses_the_same_dtypes(cli, tmp_path, state, suffix, dtype, plain, cast):
    src = tmp_path / f"w{suffix}"
    _write(src, state, dtype)
    config = json.dumps(get_config("vit_test_token").to_dict())
    for flags, refusal in (([], plain), (["--cast"], cast)):
        out_path = tmp_path / f"out{len(flags)}.safetensors"
        code, out, err = cli("convert", str(src), str(out_path), "--to", "canonical", "--config", config, *flags)
        if refusal is None:
            assert code == 0 and out_path.is_file(), err
        else:
            assert code == 2 and refusal in err and "'patch_embed.proj.weight'" in err and not out_path.exists(), err


def test_a_float64_beyond_float32_is_refused_at_load_naming_the_key(cli, tmp_path, state):
    src = tmp_path / "w.pth"
    _write(src, {**state, "head.bias": np.full(state["head.bias"].shape, 1e300)}, "float64")
    config = json.dumps(get_config("vit_test_token").to_dict())
    code, _, err = cli(
        "convert", str(src), str(tmp_path / "o.safetensors"), "--to", "canonical", "--config", config, "--cast"
    )
    assert code == 2 and "key 'head.bias': values up to 1e+300 overflow float32" in err


@pytest.mark.parametrize(
    "name, message",
    [
        ("w.pth", "is a torch checkpoint, not a canonical safetensors file: convert it first"),
        ("hf_dir", "is a directory, not a canonical safetensors file"),
        ("missing.safetensors", "does not exist"),
    ],
)
def test_verify_weights_says_what_a_file_is(cli, tmp_path, state, name, message):
    (tmp_path / "hf_dir").mkdir()
    _write(tmp_path / "w.pth", state, "float32")
    code, out, err = cli("verify", f"{H}:exit_0_in_forward", "--weights", str(tmp_path / name))
    assert code == 2 and message in err and out == "", err


def test_an_exception_on_the_determinism_re_run_is_told_as_an_exception(cli, tmp_path):
    code, out, err = cli("verify", f"{H}:raises_on_the_second_call", "--json", str(tmp_path / "r.json"))
    failures = json.loads((tmp_path / "r.json").read_text())["failures"]
    assert code == 1 and failures == [
        {
            "case": failures[0]["case"],
            "stage": "forward",
            "reason": "the port raised RuntimeError: only once (on the determinism re-run)",
        }
    ]
    assert "randomness" not in out


def test_the_determinism_re_run_writes_the_first_call_out_before_the_second(cli, tmp_path):
    """The port's process writes the first call's outputs before making the second (a full-size
    model's taps, twice, would not fit): a port that returns its logits in one reused buffer, a
    different value each call, is found to differ. Holding both calls' outputs until the answer
    would compare the second call's buffer with itself."""
    code, out, _ = cli("verify", f"{H}:random_logits_in_one_buffer", "--json", str(tmp_path / "r.json"))
    failures = json.loads((tmp_path / "r.json").read_text())["failures"]
    assert code == 1 and [(f["stage"], f["reason"]) for f in failures] == [
        ("logits", "two calls on the same input differ (randomness at inference)")
    ], failures


def test_a_memory_limit_makes_a_port_s_huge_allocation_its_own_finding(cli, tmp_path):
    code, out, err = cli("verify", f"{H}:allocates_8_gb", "--memory-limit", "4", "--json", str(tmp_path / "r.json"))
    failures = json.loads((tmp_path / "r.json").read_text())["failures"]
    assert code == 1 and failures[0]["reason"].startswith("the port raised MemoryError"), failures[:1]


def test_a_gradient_factory_and_an_attention_port_that_end_their_process_are_findings(cli):
    code, out, err = cli("verify", "--grad", f"{H}:grad_exits")
    assert code == 1 and "the port's process exited with status 3 before returning" in out, out[-500:] + err[-500:]
    code, out, err = cli("verify", "--attention", f"{H}:attention_exits")
    assert code == 1 and "the port exited (sys.exit(0)) before returning" in out, out[-500:] + err[-500:]


def test_a_model_that_computes_otherwise_when_unobserved_is_a_finding():
    """A captured model is called once more with nothing of capture attached: its logits must be the
    observed call's, bitwise (the model here moves them when no hook is on it). The companion: every
    correct captured model verified conformant (tests/test_third_party.py, test_compiled.py, ...)
    passed the same check on its determinism re-run."""
    from conformance.verify.forward import verify
    from tests.capture_cases import quick_cases
    from tests.data.hostile_ports import hides_when_unobserved

    config = get_config("vit_test_token")
    report = verify(hides_when_unobserved, config, port="hides", cases=quick_cases(config)[:1])
    said = [f["reason"] for f in report.failures if f["stage"] == "logits"]
    assert not report.conformant and said, report.failures[:2]
    assert "without capture's hooks differs from its output observed" in said[0], said
