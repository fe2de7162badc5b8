"""convert's promise to CI, as test_robustness.py's is verify's: a target refused or replaced
whole, never half written (a full disk, a signal), a temporary name within the file system's
limit, the umask's modes in every layout, a malformed input refused by name."""

from __future__ import annotations

import numpy as np
import pytest

from impls import get_config
from weights import init_state, save_state


@pytest.fixture(scope="module")
def state():
    return init_state(get_config("vit_test_token"), seed=0)


@pytest.fixture
def canonical(tmp_path, state):
    path = tmp_path / "src.safetensors"
    save_state(state, path, get_config("vit_test_token"))
    return path


def test_convert_refuses_an_existing_file_and_leaves_it_byte_identical(cli, tmp_path, canonical):
    out = tmp_path / "out.pth"
    out.write_bytes(b"precious")
    code, _, err = cli("convert", str(canonical), str(out), "--to", "timm")
    assert code == 2 and "exists (a file); pass --force" in err and out.read_bytes() == b"precious"


@pytest.mark.parametrize("layout, name", [("timm", "out.pth"), ("canonical", "out.safetensors"), ("hf", "out_dir")])
def test_convert_force_replaces_atomically_leaving_no_temporary(cli, tmp_path, canonical, layout, name):
    out = tmp_path / name
    out.mkdir() if layout == "hf" else out.write_bytes(b"old")
    code, _, err = cli("convert", str(canonical), str(out), "--to", layout, "--force")
    assert code == 0, err
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["src.safetensors", name])  # no .tmp left
    assert (out / "model.safetensors").is_file() if layout == "hf" else out.read_bytes() != b"old"


def test_convert_replaces_a_symlink_and_never_writes_through_it(cli, tmp_path, canonical):
    target = tmp_path / "elsewhere.bin"
    target.write_bytes(b"not mine")
    link = tmp_path / "out.safetensors"
    link.symlink_to(target)
    code, _, err = cli("convert", str(canonical), str(link), "--to", "canonical", "--force")
    assert code == 0 and not link.is_symlink() and target.read_bytes() == b"not mine", err


@pytest.mark.parametrize("force", [[], ["--force"]])
def test_convert_refuses_a_target_that_is_not_a_file_or_a_directory(cli, canonical, force):
    code, _, err = cli("convert", str(canonical), "/dev/null", "--to", "canonical", *force)
    assert code == 2 and "is not a regular file or a directory: refusing to replace it" in err


@pytest.mark.parametrize(
    "args, message",
    [
        (["--to", "timm", "--num-heads", "0"], "--num-heads must be a positive integer, got 0"),
        (["--to", "timm", "--img-size", "1", "2", "3"], "takes one size or two"),
        (["--to", "canonical", "--config", "missing.json"], "No such file or directory"),
    ],
)
def test_convert_refuses_nonsense_arguments_with_one_line(cli, tmp_path, canonical, args, message):
    code, _, err = cli("convert", str(canonical), str(tmp_path / "o.pth"), *args)
    assert code == 2 and message in err and not (tmp_path / "o.pth").exists(), err


def test_convert_to_a_missing_directory_is_exit_2_with_one_line(cli, tmp_path, canonical):
    code, _, err = cli("convert", str(canonical), str(tmp_path / "no" / "o.pth"), "--to", "timm")
    assert code == 2 and len(err.strip().splitlines()) == 1 and "does not exist" in err


def test_an_hf_config_json_that_is_not_an_object_is_refused_naming_it(cli, tmp_path):
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text("[]")
    code, _, err = cli("convert", str(tmp_path / "hf"), str(tmp_path / "o.safetensors"), "--to", "canonical")
    assert code == 2 and "config.json' holds a list, expected a JSON object" in err, err


# ----------------------------------------------------------------------------- writes that fail or are cut short


@pytest.mark.parametrize(
    "layout, name", [("canonical", "o.safetensors"), ("timm", "o.pth"), ("hf", "o"), ("big_vision", "o.npz")]
)
def test_convert_onto_a_full_disk_is_exit_2_with_one_line_and_leaves_nothing(cli, canonical, small_fs, layout, name):
    code, out, err = cli("convert", str(canonical), str(small_fs / name), "--to", layout)
    assert code == 2 and err.count("\n") == 1 and "no space left on its device (about 0.0659 MB needed" in err, err
    assert list(small_fs.iterdir()) == []


def test_a_write_error_of_a_writer_s_own_type_is_exit_2_when_the_disk_is_full(cli, canonical, tmp_path, monkeypatch):
    """The same path as a full disk, injected: safetensors raises its own error type, not OSError.
    The companion: a writer's error with space to spare is the tool's own failure (exit 3)."""
    import dataclasses
    import shutil

    from weights.layouts import REGISTRY

    def full(state, config, path, **options):
        open(path, "wb").write(b"half")
        raise RuntimeError("Error while serializing: I/O error: No space left on device (os error 28)")

    monkeypatch.setitem(REGISTRY, "canonical", dataclasses.replace(REGISTRY["canonical"], write=full))
    code, _, err = cli("convert", str(canonical), str(tmp_path / "o.safetensors"), "--to", "canonical")
    assert (
        code == 2
        and "no space left on its device" in err
        and sorted(p.name for p in tmp_path.iterdir()) == ["src.safetensors"]
    )

    def bug(*args, **options):
        raise KeyError("a bug of the writer")

    monkeypatch.setitem(REGISTRY, "canonical", dataclasses.replace(REGISTRY["canonical"], write=bug))
    monkeypatch.setattr(shutil, "disk_usage", lambda p: shutil._ntuple_diskusage(10**12, 0, 10**12))
    code, _, err = cli("convert", str(canonical), str(tmp_path / "o.safetensors"), "--to", "canonical")
    assert code == 3 and "INTERNAL ERROR of weights convert" in err


def test_sigterm_mid_write_leaves_no_partial_file(tmp_path):
    """The write stopped while its temporary is on disk (SIGSTOP), then SIGTERM: exit 143, one
    line, neither the temporary nor OUT left."""
    from conformance.profiles import heavy

    if not heavy():
        pytest.skip(
            "thorough profile: a ViT-Ti's weights written and stopped mid-write; in ci the same cancellation "
            "(weights.cancel) is verify's SIGTERM and SIGINT tests and the same cleanup the full-disk tests"
        )
    import signal
    import subprocess
    import sys
    from pathlib import Path

    config = get_config("vit_tiny_patch16_224")
    src = tmp_path / "src.safetensors"
    save_state(init_state(config, seed=0), src, config)
    out_dir = tmp_path / "out"
    for attempt in range(3):
        out_dir.mkdir(exist_ok=True)
        run = subprocess.Popen(
            [sys.executable, "-m", "weights", "convert", str(src), str(out_dir / "o.pth"), "--to", "timm"],
            cwd=Path(__file__).parent.parent,
            stderr=subprocess.PIPE,
            text=True,
        )
        while run.poll() is None and not any(p.name.startswith(".") for p in out_dir.iterdir()):
            pass
        run.send_signal(signal.SIGSTOP)
        mid_write = any(p.name.startswith(".") for p in out_dir.iterdir()) and not (out_dir / "o.pth").exists()
        run.send_signal(signal.SIGTERM)
        run.send_signal(signal.SIGCONT)
        _, err = run.communicate(timeout=60)
        if mid_write:
            break
        for p in out_dir.iterdir():
            p.unlink()
    assert mid_write, "never caught the write in progress"
    assert run.returncode == 128 + signal.SIGTERM and err.strip().splitlines() == ["convert: cancelled by SIGTERM"]
    assert list(out_dir.iterdir()) == []


@pytest.mark.parametrize("length", [126, 200, 255])
def test_a_long_legal_out_name_is_written(cli, tmp_path, canonical, length):
    name = ("a." * 200)[: length - len(".safetensors")] + ".safetensors"
    code, _, err = cli("convert", str(canonical), str(tmp_path / name), "--to", "canonical")
    assert code == 0 and (tmp_path / name).is_file(), err
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["src.safetensors", name])


@pytest.mark.parametrize(
    "layout, name", [("canonical", "o.safetensors"), ("timm", "o.pth"), ("hf", "o"), ("big_vision", "o.npz")]
)
@pytest.mark.parametrize("mask", [0o022, 0o077])
def test_convert_writes_with_the_umask_s_modes_in_every_layout(cli, tmp_path, canonical, layout, name, mask):
    import os
    import stat

    old = os.umask(mask)
    try:
        code, _, err = cli("convert", str(canonical), str(tmp_path / name), "--to", layout)
    finally:
        os.umask(old)
    assert code == 0, err
    out = tmp_path / name
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in ([out, *out.iterdir()] if out.is_dir() else [out])}
    assert modes == {
        p: (0o777 if (tmp_path / name / p).is_dir() or p == name and out.is_dir() else 0o666) & ~mask for p in modes
    }


def test_save_state_writes_with_the_umask_s_mode(tmp_path, state):
    import os
    import stat

    old = os.umask(0o027)
    try:
        save_state(state, tmp_path / "w.safetensors", get_config("vit_test_token"))
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "w.safetensors").stat().st_mode) == 0o640


def _with_header(raw: bytes, pairs: list) -> bytes:
    """A safetensors file's bytes with its header written from ``pairs`` (a key may repeat)."""
    import json
    import struct

    (size,) = struct.unpack("<Q", raw[:8])
    text = "{" + ",".join(f"{json.dumps(k)}:{json.dumps(v)}" for k, v in pairs) + "}"
    body = text.encode()
    body += b" " * (-len(body) % 8)
    return struct.pack("<Q", len(body)) + body + raw[8 + size :]


def test_a_safetensors_header_naming_a_key_twice_is_refused_naming_it(cli, tmp_path, canonical):
    """The format allows each key once; the reader would take the last silently. The companion:
    the same header without the repeat reads."""
    import json
    import struct

    raw = canonical.read_bytes()
    (size,) = struct.unpack("<Q", raw[:8])
    pairs = list(json.loads(raw[8 : 8 + size]).items())
    twice = dict(pairs)["pos_embed"]
    (tmp_path / "twice.safetensors").write_bytes(_with_header(raw, [*pairs, ("pos_embed", twice)]))
    (tmp_path / "once.safetensors").write_bytes(_with_header(raw, pairs))
    code, _, err = cli("convert", str(tmp_path / "twice.safetensors"), str(tmp_path / "o.pth"), "--to", "timm")
    assert code == 2 and "its header names 'pos_embed' more than once" in err, err
    code, _, err = cli("convert", str(tmp_path / "once.safetensors"), str(tmp_path / "o.pth"), "--to", "timm")
    assert code == 0, err


# ----------------------------------------------------------------------------- dtypes, as the file stores them


def _stored_as(tmp_path, kind: str, dtype: str):
    """A BEiT save_pretrained directory or an original-ViT .npz with one query kernel stored in
    ``dtype``: q, k and v are concatenated into timm's qkv, which would promote or hide it."""
    import ml_dtypes
    from safetensors.numpy import load_file, save_file

    from weights import hf
    from weights.convert import write

    as_dtype = ml_dtypes.bfloat16 if dtype == "bfloat16" else dtype
    if kind == "hf":
        config = get_config("vit_test_beit")
        hf.write_hf(init_state(config), config, tmp_path / "beit")
        state = load_file(tmp_path / "beit" / "model.safetensors")
        key = "beit.encoder.layer.0.attention.attention.query.weight"
        save_file({**state, key: state[key].astype(as_dtype)}, str(tmp_path / "beit" / "model.safetensors"))
        return tmp_path / "beit", key, []
    config = get_config("vit_test_token")
    write(init_state(config), config, str(tmp_path / "v.npz"), "big_vision")
    state = dict(np.load(tmp_path / "v.npz"))
    key = "Transformer/encoderblock_0/MultiHeadDotProductAttention_1/query/kernel"
    np.savez(tmp_path / "v.npz", **{**state, key: state[key].astype(as_dtype)})
    return tmp_path / "v.npz", key, ["--img-size", *map(str, config.img_size)]


@pytest.mark.parametrize(
    "kind, dtype, cast, message",
    [
        ("hf", "float16", False, "float16, where the canonical format is float32: pass --cast"),
        ("hf", "bool", True, "dtype bool, expected float32 (or float16, bfloat16, float64 with --cast)"),
        ("npz", "int64", True, "dtype int64, expected float32"),
        ("npz", "bool", False, "dtype bool, expected float32"),
    ],
)
def test_a_kernel_of_another_dtype_is_refused_by_its_stored_name_and_dtype(cli, tmp_path, kind, dtype, cast, message):
    """Refused before the layout maps it (it was written silently, or named float64, when the
    mapping's concatenation promoted it); a non-float dtype even with --cast."""
    src, key, extra = _stored_as(tmp_path, kind, dtype)
    code, _, err = cli(
        "convert", str(src), str(tmp_path / "o.safetensors"), "--to", "canonical", *extra, *(["--cast"] if cast else [])
    )
    assert code == 2 and f"key {key!r}: {message}" in err, err


@pytest.mark.parametrize("kind", ["hf", "npz"])
def test_a_float16_kernel_is_taken_with_cast(cli, tmp_path, kind):
    """The companion: the same file with --cast converts, the kernel's values as float16 held them."""
    from weights import load_state

    src, _, extra = _stored_as(tmp_path, kind, "float16")
    code, _, err = cli("convert", str(src), str(tmp_path / "o.safetensors"), "--to", "canonical", *extra, "--cast")
    assert code == 0, err
    qkv = load_state(tmp_path / "o.safetensors")["blocks.0.attn.qkv.weight"]
    q = qkv[: qkv.shape[1]]
    assert qkv.dtype == np.float32 and np.array_equal(q, q.astype(np.float16).astype(np.float32))
