"""A verify run's promise to CI, part two (issue 41): every finding reaches the report, a report
never outlives its run nor lands on an input, each failure in its own exit class, a cancelled
run leaves nothing behind, the machine's limits are told as such, and whatever a port returns
is exit 1 with one line. The ports are in tests/data/hostile_ports.py, each run in the process
verify gives it, as on the command line."""

from __future__ import annotations

import json
import os
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conformance.tests.helpers import budget
from impls import get_config
from tests.processes import parent, running
from weights import init_state, save_state

H = "tests.data.hostile_ports"


@pytest.fixture(scope="module")
def state():
    return init_state(get_config("vit_test_token"), seed=0)


# ----------------------------------------------------------------------------- every finding reported


@pytest.mark.parametrize("hostile, counts", [("nan_logits", "21 NaN, 0 Inf"), ("overflowing_softmax", "18 NaN, 3 Inf")])
def test_a_non_finite_finding_is_exit_1_with_a_complete_json_report(cli, tmp_path, hostile, counts):
    from conformance.profiles import heavy

    if hostile == "nan_logits" and not heavy():
        pytest.skip("thorough profile: NaN logits alone; in ci the overflowing softmax's logits hold NaN and Inf")
    plot = ["--plot", str(tmp_path / "r.png")] if hostile == "overflowing_softmax" else []  # its ratio is inf
    code, out, err = cli("verify", f"{H}:{hostile}", "--json", str(tmp_path / "r.json"), *plot)
    report = json.loads((tmp_path / "r.json").read_text())  # strict JSON: no bare Infinity or NaN
    assert code == 1 and report["conformant"] is False and report["first_divergence"] == "logits", err
    assert any(counts in f["reason"] for f in report["failures"]) and (not plot or (tmp_path / "r.png").stat().st_size)
    logits = next(s for s in report["stages"] if s["name"] == "logits")
    assert logits["ok"] is False and (hostile == "nan_logits" or logits["ratio"] == "Infinity")


def test_the_report_spells_every_non_finite_figure_as_a_string_float_reads():
    from conformance.verify.outputs import dumps

    text = dumps({"a": [float("inf"), -np.inf, np.float32("nan")], "b": {"c": np.float64(1.5), "d": np.int64(2)}})
    back = json.loads(text)
    assert back == {"a": ["Infinity", "-Infinity", "NaN"], "b": {"c": 1.5, "d": 2}}
    assert [float(v) for v in back["a"]][:2] == [np.inf, -np.inf] and np.isnan(float(back["a"][2]))
    with pytest.raises(ValueError):  # the companion: what the report used to hand json
        json.dumps({"a": float("inf")}, allow_nan=False)


# ----------------------------------------------------------------------------- reports never stale


def test_a_failing_re_run_never_leaves_the_last_run_s_pass_behind(cli, tmp_path):
    path = tmp_path / "r.json"
    code, _, err = cli("verify", f"{H}:prints_to_stdout", "--json", str(path))
    assert code == 0 and json.loads(path.read_text())["conformant"] is True, err
    code, out, err = cli("verify", "tests.data.hostile_import_error:make", "--json", str(path))
    report = json.loads(path.read_text())
    assert code == 2 and report["conformant"] is False and report["verdict"] is None and report["exit_code"] == 2
    assert "cannot load port" in report["error"] and err.count("\n") == 1


def test_a_tool_failure_writes_a_report_that_says_so(cli, tmp_path):
    path = tmp_path / "r.json"
    path.write_text('{"conformant": true}')
    code, out, err = cli("verify", "tests.data.hostile_tool_failure:port", "--json", str(path))
    report = json.loads(path.read_text())
    assert code == 3 and report["conformant"] is False and report["exit_code"] == 3 and "INTERNAL ERROR" in err


@pytest.mark.parametrize("what", ["weights", "module", "config"])
def test_a_report_path_naming_an_input_of_the_run_is_exit_2_and_both_are_untouched(cli, tmp_path, state, what):
    from pathlib import Path

    weights, config = tmp_path / "w.safetensors", tmp_path / "c.json"
    save_state(state, weights, get_config("vit_test_token"))
    config.write_text(json.dumps(get_config("vit_test_token").to_dict()))
    module = Path(__file__).parent / "data" / "hostile_ports.py"
    target = {"weights": weights, "module": module, "config": config}[what]
    before = {p: p.read_bytes() for p in (weights, module, config)}
    args = ["--weights", str(weights)] if what == "weights" else ["--config", str(config)] if what == "config" else []
    code, out, err = cli("verify", f"{H}:prints_to_stdout", *args, "--json", str(target))
    assert code == 2 and out == "" and "an input of this run" in err and err.count("\n") == 1, err
    assert {p: p.read_bytes() for p in before} == before


# ----------------------------------------------------------------------------- each failure in its class


@pytest.mark.parametrize(
    "hostile, stage, reason",
    [
        ("ragged_tap", "embed", "embed is a ragged or mixed list, not an array"),
        ("lazily_broadcast_huge", "logits", "logits has shape (3, 366503875925) (1.1e+12 elements) where the stage"),
        ("supports_that_raises", "supports", "the port's supports declaration raised RuntimeError: this predicate"),
        ("factory_returns_a_tuple", "forward", "the port raised TypeError: 'tuple' object is not callable"),
    ],
)
def test_a_malformed_port_is_a_finding_naming_the_tap_never_the_tool_s_failure(cli, tmp_path, hostile, stage, reason):
    code, out, err = cli("verify", f"{H}:{hostile}", "--json", str(tmp_path / "r.json"))
    failures = json.loads((tmp_path / "r.json").read_text())["failures"]
    assert code == 1 and "INTERNAL ERROR" not in err and "Traceback" not in out + err, err[-800:]
    assert failures[0]["stage"] == stage and failures[0]["reason"].startswith(reason), failures[0]


@pytest.mark.parametrize(
    "flag, value, message",
    [
        ("--timeout", "inf", "--timeout must be a finite number above 0, got 'inf'"),
        ("--timeout", "-1", "--timeout must be a finite number above 0, got '-1'"),
        ("--timeout", "nan", "--timeout must be a finite number above 0, got 'nan'"),
        ("--seed", "-1", "--seed must be a finite number at least 0, got '-1'"),
        ("--memory-limit", "nan", "--memory-limit must be a finite number above 0, got 'nan'"),
    ],
)
def test_a_numeric_flag_out_of_its_range_is_exit_2_naming_it(cli, flag, value, message):
    code, out, err = cli("verify", f"{H}:exit_0_in_forward", flag, value)
    assert code == 2 and out == "" and err.strip().splitlines()[-1].endswith(message), err


def test_a_config_too_deep_to_verify_is_refused_with_the_figure_before_any_work(cli):
    start = time.monotonic()
    code, out, err = cli("verify", f"{H}:exit_0_in_forward", "--set", "depth=10000", "--set", "embed_dim=24")
    assert code == 2 and out == "" and "compares 100005 stages per case (10000 blocks)" in err, err
    assert time.monotonic() - start < 60


def test_a_deep_config_s_stages_cross_without_a_descriptor_each(monkeypatch):
    """The wire packs small arrays and maps large ones: a descriptor per tap ran out at the soft
    limit (1024 on many machines) with one per tap of a deep config. The companion: a mapped
    array (each its own file, as every array is with ``MAP_AT_LEAST`` at 0) does hold one."""
    import resource
    import tempfile

    from conformance.sandbox import wire

    taps = {f"t{i}": np.full((3, 7), i, np.float32) for i in range(300)}
    with tempfile.TemporaryDirectory() as root:
        tree = wire.Writer(root, 1).encode(taps)
        assert os.listdir(os.path.join(root, "1")) == ["p1.bin"]  # 300 arrays, one file
        monkeypatch.setattr(wire, "MAP_AT_LEAST", 0)
        wire.Writer(root, 2).encode(taps)
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (128, hard))
        try:
            read = wire.Reader(root, mmap=True).decode(tree)
            with pytest.raises(OSError):
                [np.load(os.path.join(root, "2", f"{i + 1}.npy"), mmap_mode="r") for i in range(300)]
        finally:
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert [float(read[f"t{i}"][0, 0]) for i in (0, 299)] == [0.0, 299.0] and not read["t5"].flags.writeable
    with pytest.raises(ValueError):  # read-only for good, as a mapped array is: the port cannot flip it
        read["t5"].flags.writeable = True


def test_packed_arrays_come_back_as_written_and_a_reference_a_pack_cannot_hold_is_refused(tmp_path, monkeypatch):
    """Small arrays share pack files (a new one past ``PACK_BYTES``), each read back with its dtype,
    shape (a 0-d array stays 0-d), values and order; a reference whose offset or shape the pack
    cannot hold, or that is not a number, is a ``WireError`` naming it, never an array of
    whatever bytes lie there."""
    import ml_dtypes

    from conformance.sandbox import wire

    monkeypatch.setattr(wire, "PACK_BYTES", 4096)
    rng = np.random.default_rng(0)
    arrays = {
        "loss": np.float32(1.5),
        "empty": np.zeros((0, 3), np.float64),
        "bf16": rng.normal(size=(5, 7)).astype(ml_dtypes.bfloat16),
        "transposed": rng.normal(size=(6, 9)).T,
        "mask": rng.normal(size=11) > 0,
        **{f"w{i}": rng.normal(size=(17, 13)).astype(np.float32) for i in range(8)},  # 884 bytes each
    }
    tree = wire.Writer(tmp_path, 1).encode(arrays)
    assert sorted(os.listdir(tmp_path / "1")) == ["p1.bin", "p2.bin"]  # about 8 kB
    for mmap in (True, False):
        read = wire.Reader(tmp_path, mmap=mmap).decode(tree)
        for k, a in arrays.items():
            a = np.asarray(a)
            assert read[k].dtype == a.dtype and read[k].shape == a.shape and np.array_equal(read[k], a), k
            assert read[k].flags.writeable is not mmap
    ref = tree["w7"]
    size = (tmp_path / ref["__array__"]).stat().st_size
    for bad, why in [
        ({**ref, "offset": size - 4}, "ends past the pack's"),
        ({**ref, "shape": [17, 14000]}, "ends past the pack's"),
        ({**ref, "shape": [2**32, 2**32, 2**32]}, "ends past the pack's"),  # 2**96 elements, no wrap to 0
        ({**ref, "offset": -64}, "non-negative integers"),
        ({**ref, "shape": [17, "13"]}, "non-negative integers"),
        ({**ref, "offset": None}, "non-negative integers"),
        ({**ref, "__array__": "1/p1.npy"}, "not one"),
    ]:
        with pytest.raises(wire.WireError, match=why):
            wire.Reader(tmp_path, mmap=True).decode({"x": bad})
    assert np.array_equal(wire.Reader(tmp_path).decode({"x": ref})["x"], arrays["w7"])  # the companion


# ----------------------------------------------------------------------------- cancellation


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads the processes from /proc (Linux)")
@pytest.mark.parametrize("signame", ["SIGTERM", "SIGINT", "SIGHUP"])
def test_a_cancelled_verify_leaves_no_process_and_no_temporary_behind(tmp_path, signame):
    import signal

    from conformance.profiles import heavy

    if signame == "SIGHUP" and not heavy():
        pytest.skip("thorough profile: SIGHUP takes the path SIGTERM and SIGINT take in ci")
    import subprocess
    import sys
    from pathlib import Path

    tmp, pid_file = tmp_path / "tmp", tmp_path / "grandchild.pid"
    tmp.mkdir()
    env = {**os.environ, "TMPDIR": str(tmp), "VIT_TEST_GRANDCHILD_PID": str(pid_file)}
    verify = subprocess.Popen(
        [sys.executable, "-m", "conformance", "verify", f"{H}:starts_a_grandchild_and_hangs"],
        cwd=Path(__file__).parent.parent,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 120
    while not pid_file.exists() and verify.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    grandchild = int(pid_file.read_text())
    port = parent(grandchild)  # the port's process, mid-forward
    assert running(grandchild) and running(port) and any(tmp.iterdir())
    sent = time.monotonic()
    verify.send_signal(getattr(signal, signame))
    out, err = verify.communicate(timeout=5)
    while (running(grandchild) or running(port)) and time.monotonic() - sent < 5:
        time.sleep(0.05)
    assert verify.returncode == 128 + getattr(signal, signame), err
    assert err.strip().splitlines() == [f"verify: cancelled by {signame}"] and "Traceback" not in out + err
    assert not running(port) and not running(grandchild) and list(tmp.iterdir()) == []


# ----------------------------------------------------------------------------- the machine's resources


def test_a_temporary_folder_that_cannot_be_made_is_exit_2_naming_tmpdir(cli, monkeypatch):
    import errno

    from conformance.sandbox import isolated

    def refuse(**kwargs):
        raise OSError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(isolated.tempfile, "mkdtemp", refuse)
    code, out, err = cli("verify", f"{H}:prints_to_stdout")
    assert code == 2 and out == "" and err.startswith("environment error: verify cannot create its temporary folder")
    assert "(TMPDIR): Permission denied" in err and err.count("\n") == 1


def test_a_full_tmpdir_is_exit_2_with_the_figure(small_fs):
    from conformance.profiles import heavy

    if not heavy():
        pytest.skip("thorough profile: a real full TMPDIR; in ci the same paths, injected, in the two tests around it")
    import subprocess
    import sys
    from pathlib import Path

    run = subprocess.run(
        [sys.executable, "-m", "conformance", "verify", f"{H}:prints_to_stdout"],
        cwd=Path(__file__).parent.parent,
        env={**os.environ, "TMPDIR": str(small_fs)},
        capture_output=True,
        text=True,
    )
    assert run.returncode == 2 and run.stdout == "" and run.stderr.count("\n") == 1, run.stderr
    assert run.stderr.startswith("environment error: verify cannot write a case") and "MB free" in run.stderr
    assert list(small_fs.iterdir()) == []


def test_a_case_that_cannot_be_written_is_exit_2_not_the_tool_s_failure(cli, monkeypatch):
    """The same path as a full TMPDIR, injected where verify writes a case (the companion: the
    error itself, any other OSError, stays the tool's failure)."""
    import errno

    from conformance.sandbox import wire

    def full(self, a):
        raise OSError(errno.ENOSPC, "No space left on device", "x.npy")

    monkeypatch.setattr(wire.Writer, "array", full)
    code, out, err = cli("verify", f"{H}:prints_to_stdout")
    assert code == 2 and "no space left on the device (x.npy)" in err, err
    monkeypatch.setattr(wire.Writer, "array", lambda self, a: (_ for _ in ()).throw(OSError(errno.EBADF, "bad")))
    code, out, err = cli("verify", f"{H}:prints_to_stdout")
    assert code == 3 and "INTERNAL ERROR" in err


def test_a_port_folder_shadowing_the_project_s_package_is_exit_2_naming_it(tmp_path):
    import subprocess
    import sys

    (tmp_path / "weights.py").write_text("raise SystemExit('a user module, not the project package')\n")
    run = subprocess.run(
        [sys.executable, "-m", "conformance", "verify", "numpy"], cwd=tmp_path, capture_output=True, text=True
    )
    assert run.returncode == 2 and run.stdout == "" and run.stderr.count("\n") == 1, run.stderr
    assert f"{str(tmp_path / 'weights.py')!r} shadows vit-conformance's package 'weights'" in run.stderr


# ----------------------------------------------------------------------------- whatever a port returns


def _recipes():
    """What a port might return, as recipes tests/data/hostile_ports.py builds."""
    shapes = st.lists(st.integers(0, 4), min_size=0, max_size=4)
    fills = st.sampled_from([0.0, 1.5, -2.0, "nan", "inf", "-inf"])
    dtypes = st.sampled_from(["float32", "float64", "float16", "int32", "bool", "complex64", "uint8"])
    arrays = st.builds(lambda s, d, f: {"array": {"shape": s, "dtype": d, "fill": f}}, shapes, dtypes, fills)
    huge = st.builds(lambda n: {"broadcast": {"shape": [3, n], "fill": 0.0}}, st.integers(2**25, 2**40))
    values = st.builds(
        lambda v: {"value": v},
        st.one_of(
            st.none(), st.text(max_size=5), st.integers(), st.floats(), st.lists(st.lists(st.floats(), max_size=3))
        ),
    )
    leaves = st.one_of(arrays, huge, values)
    return st.recursive(
        leaves,
        lambda inner: st.one_of(
            st.builds(lambda xs: {"list": xs}, st.lists(inner, max_size=3)),
            st.builds(lambda xs: {"tuple": xs}, st.lists(inner, max_size=3)),
            st.builds(
                lambda d: {"dict": d},
                st.dictionaries(st.sampled_from(["logits", "embed", "blocks.0", "pooled", "zzz"]), inner, max_size=3),
            ),
        ),
        max_leaves=6,
    )


@settings(max_examples=budget(5, minimum=2), deadline=None, suppress_health_check=list(HealthCheck))
@given(recipe=_recipes())
def test_whatever_a_port_returns_is_exit_1_with_one_line_never_a_traceback(cli, tmp_path_factory, recipe):
    path = tmp_path_factory.mktemp("recipe") / "r.json"
    path.write_text(json.dumps(recipe))
    os.environ["VIT_TEST_RECIPE"] = str(path)
    try:
        code, out, err = cli("verify", f"{H}:returns_the_drawn_output", "--timeout", "60")
    finally:
        del os.environ["VIT_TEST_RECIPE"]
    assert code == 1 and "Traceback" not in out + err and "INTERNAL ERROR" not in err, (recipe, err[-1500:])
    assert out.strip().splitlines()[-1].startswith("NOT CONFORMANT") or "NOT CONFORMANT" in out, out[-500:]


def test_resource_errors_name_the_resource_and_the_figure():
    """What exit 2 says of the machine (the companion: any other OS error is not one, and stays
    the tool's failure)."""
    import errno
    import resource

    from conformance.report import resource_problem

    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert resource_problem(OSError(errno.ENOSPC, "full", "/tmp/x")) == "no space left on the device (/tmp/x)"
    assert f"too many open files for this process (x.npy): it may open {soft} (ulimit -n" in resource_problem(
        OSError(errno.EMFILE, "too many", "x.npy")
    )
    assert resource_problem(OSError(errno.EBADF, "bad")) is None and resource_problem(ValueError("x")) is None
