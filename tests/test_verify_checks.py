"""The companions of conformance/tests/test_verify.py: each of its properties fails on a deliberately
broken port (and the project's checks that take no port). Not shipped."""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
import pytest

from conformance.numerics.precision import PORT_DTYPES
from conformance.tests.helpers import DATA_DIR
from hypothesis import given, settings
from conformance import strategies as S
from conformance.profiles import heavy
from conformance.tests.helpers import budget
from conformance.verify import verify
from impls import get_config, load_factory
from weights import init_state, load_state, save_state
from conformance.tests.test_verify import CONFIG  # noqa: F401


DATA = DATA_DIR / "user_ports.py"


@pytest.fixture(scope="module")
def user_dir(tmp_path_factory):
    """A directory outside the repository holding the user's port module."""
    d = tmp_path_factory.mktemp("user")
    shutil.copy(DATA, d / "user_ports.py")
    return d


def run_cli(user_dir, *args):
    """``python -m conformance verify ARGS`` as a user types it, in a subprocess."""
    env = dict(os.environ, PYTHONPATH=str(user_dir))
    proc = subprocess.run(
        [sys.executable, "-m", "conformance", "verify", *args],
        cwd=user_dir,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    return proc.returncode, proc.stdout + proc.stderr


@pytest.fixture
def cli(user_dir, monkeypatch, cli):
    """tests/conftest.py's ``cli`` (the command in this process) from the user's directory: each
    subprocess pays for importing torch, JAX and MLX again (1 to 3 s), so only the first test
    below starts one."""
    monkeypatch.chdir(user_dir)
    monkeypatch.syspath_prepend(str(user_dir))
    return cli


@pytest.fixture(scope="module")
def load(user_dir):
    sys.path.insert(0, str(user_dir))
    yield lambda name: load_factory(f"user_ports:{name}")
    sys.path.remove(str(user_dir))


EXAMPLE = {name: DATA_DIR / name for name in ("my_vit.py", "my_port.py")}


def _python_blocks(path: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", path.read_text(), re.S)


REFERENCES = {"timm": "conformance.references:timm_port", "transformers": "conformance.references:transformers_port"}


# Every port in every dtype in the thorough profile; in ci every port but the built-in JAX one in
# float32, and torch in bf16 and fp16: conformance/tests/test_verify.py verifies the built-in ports
# on seeded weights, whose cases include the offset and x64 ones (JAX too; a file's path to the
# port is the same for every port); timm and transformers in every dtype on trained-like weights
# (the test before the one that reads this).
WEIGHT_FILE_PORTS = [
    (p, d)
    for p in ("torch", "mlx", "jax", "timm", "transformers")
    for d in PORT_DTYPES
    if heavy() or (d == "float32" and p != "jax") or p == "torch"
]


@pytest.mark.parametrize(
    "user_port, conformant, first, reason",
    [
        ("correct", True, None, None),
        ("logits_only", True, None, None),
        ("shared_norm", False, "blocks.0.norm2", None),
        ("softmax_wrong_axis", False, "blocks.0.attn.weights", None),
        ("crashing", False, "forward", "the port raised RuntimeError: boom"),
        ("nan_logits", False, "logits", "non-finite values"),
        ("misshaped_tap", False, "blocks.0.attn.weights", "shape (3, 25, 3, 25), expected (3, 3, 25, 25)"),
        ("no_logits", False, "logits", "the port returned no 'logits'"),
        ("float64", False, "patch_embed", "dtype float64, asked for float32"),
        ("squeezes", False, "logits", "shape (7,), expected (1, 7)"),
        (
            "edits_state",
            False,
            "load",
            "the port changed the state it was handed: replaced 'blocks.0.norm2.bias', "
            "replaced 'blocks.0.norm2.weight'",
        ),
        ("pops_key", False, "load", "the port changed the state it was handed: removed 'head.bias'"),
        ("clips_images", False, "forward", "the port wrote to its inputs"),
    ],
)
def test_verify_gives_the_verdict_and_first_divergent_stage(load, user_port, conformant, first, reason):
    report = verify(load(user_port), CONFIG, port=user_port)
    assert report.conformant is conformant
    assert report.first_divergence == first
    if reason:
        reasons = [f["reason"] for f in report.failures] + [s.reason for s in report.stages]
        assert any(reason in r for r in reasons), reasons


def test_cli_exit_0_for_a_conformant_port_with_json_and_plot(user_dir):
    code, out = run_cli(user_dir, "user_ports:correct", "--json", "r.json", "--plot", "r.png")
    assert code == 0, out
    assert "CONFORMANT" in out and "Traceback" not in out
    report = json.loads((user_dir / "r.json").read_text())
    assert report["port"] == "user_ports:correct" and report["conformant"] is True
    assert report["first_divergence"] is None and report["failures"] == []
    assert {"name", "max_abs_err", "rel_err", "ratio", "tol", "e2e_ratio", "e2e_tol", "mode", "ok"} <= set(
        report["stages"][0]
    )
    assert [s["name"] for s in report["stages"]][:2] == ["patch_embed", "embed"]
    assert (user_dir / "r.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_exit_1_names_the_first_divergent_stage(user_dir, cli):
    code, out, err = cli("verify", "user_ports:shared_norm", "--json", "s.json")
    assert code == 1, out + err
    assert "NOT CONFORMANT: first divergent stage blocks.0.norm2" in out
    assert json.loads((user_dir / "s.json").read_text())["first_divergence"] == "blocks.0.norm2"


def test_cli_reports_a_crashing_port_without_a_traceback(user_dir, cli):
    code, out, err = cli("verify", "user_ports:crashing", "--json", "c.json")
    assert code == 1 and "Traceback" not in out + err, out + err
    failures = json.loads((user_dir / "c.json").read_text())["failures"]
    assert failures and failures[0]["reason"] == "the port raised RuntimeError: boom"


def test_cli_takes_a_weight_file_and_a_json_config(user_dir, cli):
    config = get_config("vit_test_avg")
    save_state(init_state(config, seed=3), user_dir / "w.safetensors", config)
    code, out, err = cli("verify", "user_ports:correct", "--weights", "w.safetensors")
    assert code == 0, out + err
    code, out, err = cli("verify", "user_ports:correct", "--config", json.dumps(config.to_dict()))
    assert code == 0, out + err


@pytest.mark.parametrize(
    "args, message",
    [
        (["no_such_module:make"], "cannot load port 'no_such_module:make'"),
        (["user_ports"], "must look like 'pkg.module:factory'"),
        (["user_ports:correct", "--config", '{"embed_dim": 10, "num_heads": 3}'], "embed_dim 10"),
        (["user_ports:correct", "--weights", "missing.safetensors"], "does not exist"),
        (["user_ports:correct", "--config", "missing.json"], "cannot read the config file 'missing.json'"),
    ],
)
def test_cli_exit_2_on_a_usage_error(cli, args, message):
    code, out, err = cli("verify", *args)
    assert code == 2 and message in err and "Traceback" not in out + err, out + err


def test_verify_in_low_precision_catches_a_softmax_without_its_max():
    from conformance.zoo import MUTANTS

    report = verify(load_factory(MUTANTS["torch_naive_softmax_fp16"].factory), CONFIG, port="mutant", dtype="float16")
    assert report.first_divergence == "blocks.0.attn.weights" and not report.conformant


def test_the_readme_example_verifies_an_unmodified_model_and_locates_its_shared_norm(tmp_path, capsys):
    """README's and docs/verify.md's example files are these tested ones. The model file as
    written conforms (every stage but the weights inside MLX's fused attention); the same file
    with a block that reuses its first norm is located at blocks.0.norm2, the port unchanged.
    (The command runs in this process, as most test_cli_* above do.)"""
    from conformance.commands.cli import main

    root = Path(__file__).parents[1]
    blocks = _python_blocks(root / "README.md") + _python_blocks(root / "docs" / "verify.md")
    for path in EXAMPLE.values():
        assert path.read_text() in blocks, f"README.md or docs/verify.md no longer shows {path.name} as it is tested"
        shutil.copy(path, tmp_path / path.name)

    def run(report):
        for name in ("my_vit", "my_port"):  # the user's files, imported afresh
            sys.modules.pop(name, None)
        sys.path.insert(0, str(tmp_path))
        try:
            code = main(["verify", "my_port:port", "--json", str(report)])
        finally:
            sys.path.remove(str(tmp_path))
        captured = capsys.readouterr()
        return code, captured.out + captured.err, json.loads(report.read_text())

    code, out, report = run(tmp_path / "ok.json")
    assert (
        code == 0
        and len(report["stages"]) == 23
        and set(report["unseen"]) == {"blocks.0.attn.weights", "blocks.1.attn.weights"}
    ), out
    model = (tmp_path / "my_vit.py").read_text()
    buggy = model.replace("self.ff_in(self.ln_ff(x))", "self.ff_in(self.ln_attn(x))")
    assert buggy != model
    (tmp_path / "my_vit.py").write_text(buggy)
    code, out, report = run(tmp_path / "bug.json")
    assert code == 1 and report["first_divergence"] == "blocks.0.norm2", out
    assert "the module 'layers.0.ln_ff' that holds its weights was never called" in out
    for name in ("my_vit", "my_port"):
        sys.modules.pop(name, None)


@pytest.mark.parametrize("dtype", PORT_DTYPES)
@pytest.mark.parametrize("reference", sorted(REFERENCES))
@settings(max_examples=budget(5, minimum=1))
@given(weights=S.trained_like_weights())
def test_timm_and_transformers_as_ports_pass_verify_on_trained_like_weights(reference, dtype, weights):
    """Implementations nobody here wrote, on weights conditioned like a trained ViT's, in every
    dtype: a verdict of NOT CONFORMANT here would be a false alarm."""
    report = verify(
        load_factory(REFERENCES[reference]), CONFIG, port=reference, state=weights.make(CONFIG), dtype=dtype
    )
    assert report.conformant, [(s.name, s.reason) for s in report.stages if not s.ok] + report.failures


@pytest.mark.parametrize(
    "weights", [S.WeightCase(3, 4.0, S.OFFSET), S.WeightCase(4, 64.0)], ids=["offset-1000", "spread-x64"]
)
@pytest.mark.parametrize("which, dtype", WEIGHT_FILE_PORTS)
def test_ports_pass_verify_on_weight_files_with_a_large_offset_and_a_wide_spread(which, dtype, weights, tmp_path):
    path = tmp_path / "w.safetensors"
    save_state(weights.make(CONFIG), path, CONFIG)
    report = verify(
        load_factory(REFERENCES.get(which, which)), CONFIG, port=which, state=load_state(path, CONFIG), dtype=dtype
    )
    assert report.conformant, [(s.name, s.reason) for s in report.stages if not s.ok] + report.failures


def test_weights_of_another_layout_name_it_and_the_convert_in_one_line(tmp_path, cli):
    """An MLX-layout file given to --weights: exit 2 in one line naming its layout and the convert;
    the companion: the canonical file the convert writes is what --weights reads."""
    from weights import init_state
    from weights.convert import write

    config = get_config("vit_test_token")
    path = tmp_path / "w_mlx.safetensors"
    write(init_state(config, seed=0), config, str(path), "mlx")
    code, out, err = cli("verify", "torch", "--weights", path)
    said = [line for line in (out + err).splitlines() if "usage error" in line]
    assert code == 2 and len(said) == 1, out + err
    assert "is a mlx checkpoint" in said[0] and f"python -m weights convert {path} canonical.safetensors" in said[0]
    code, out, err = cli("convert", path, tmp_path / "canonical.safetensors", "--to", "canonical")
    assert code == 0, err
    from weights import load_state

    assert set(load_state(tmp_path / "canonical.safetensors")) == set(init_state(config))  # what --weights reads
