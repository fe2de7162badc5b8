"""convert's promise to CI, as test_robustness.py's is verify's: a target refused or replaced
whole, never half written (a full disk, a signal), a temporary name within the file system's
limit, the umask's modes in every layout, a malformed input refused by name."""

from __future__ import annotations

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
