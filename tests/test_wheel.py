"""The package as a user installs it (`pip install .`, not `-e`): the wheel built, installed in a
fresh virtual environment, and run from outside the checkout. verify in bfloat16 (the scan's
calibration), the quantized example (the quantization's), the plugin, and `docs` (a checkout's,
so exit 2 there) each need something only the checkout held until the wheel shipped it.

The environment reaches the frameworks through a path file naming this interpreter's
site-packages (a line of a path file is added to sys.path, its own path files not read, so this
checkout's editable install is not); the wheel's own files come first. Marked ``wheel``: the
ci profile's budget does not pay for building and installing it, `.ci/run` runs it apart
(`pytest -m wheel`)."""

import os
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.wheel
PACKAGES = ("conformance", "weights", "impls")
GHOST = ROOT / "build" / "lib" / "conformance" / "verify" / "ghost_of_a_moved_module.py"


def _run(cmd, cwd, timeout=900):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "HYPOTHESIS_PROFILE", "VIRTUAL_ENV")}
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    return proc.returncode, proc.stdout + proc.stderr


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(the fresh environment's python, a directory outside the checkout, the wheel's file names)."""
    tmp = tmp_path_factory.mktemp("wheel")
    # what an earlier build of a module since moved leaves in the checkout (pypa/setuptools#1871)
    GHOST.parent.mkdir(parents=True, exist_ok=True)
    GHOST.write_text("raise AssertionError('a module deleted from the source')\n")
    code, out = _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp), str(ROOT)], tmp)
    assert code == 0, out[-2000:]
    (wheel,) = tmp.glob("vit_conformance-*.whl")
    code, out = _run([sys.executable, "-m", "venv", str(tmp / "venv")], tmp)
    assert code == 0, out[-2000:]
    python = tmp / "venv" / "bin" / "python"
    code, site = _run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], tmp)
    (Path(site.strip()) / "frameworks.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    code, out = _run([str(python), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)], tmp)
    assert code == 0, out[-2000:]
    elsewhere = tmp / "elsewhere"
    elsewhere.mkdir()
    return python, elsewhere, zipfile.ZipFile(wheel).namelist()


def test_every_data_file_of_the_packages_is_in_the_wheel(installed):
    _, _, names = installed
    tracked = subprocess.run(["git", "ls-files", *PACKAGES], cwd=ROOT, capture_output=True, text=True).stdout.split()
    data = [p for p in tracked if not p.endswith(".py") and "/tests/" not in p]
    assert data, "no data files found: the check would pass on anything"
    missing = [p for p in data if p not in names]
    assert not missing, missing
    for needed in ("conformance/diagnosis/scan_calibration.json", "conformance/verify/quantization_calibration.json"):
        assert needed in names


def ghosts(names: list[str], root: Path) -> list[str]:
    """The wheel's modules that the source tree does not hold."""
    return sorted(n for n in names if n.endswith(".py") and n.startswith(PACKAGES) and not (root / n).is_file())


def test_the_wheel_holds_the_sources_modules_and_no_ghost_of_an_earlier_build(installed):
    _, _, names = installed
    assert ghosts(names, ROOT) == [], "modules an earlier build left in build/lib (setup.py's CleanBuildPy)"
    sources = [str(p.relative_to(ROOT)) for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")]
    assert not [s for s in sources if "__pycache__" not in s and s not in names]
    # the companion: the module planted in build/lib, had it shipped, is named
    assert ghosts([*names, str(GHOST.relative_to(GHOST.parents[2]))], ROOT) == [
        "conformance/verify/ghost_of_a_moved_module.py"
    ]


def test_the_installed_package_is_the_wheels_not_the_checkouts(installed):
    python, elsewhere, _ = installed
    code, out = _run(
        [str(python), "-c", "import conformance, impls; print(conformance.__file__, impls.__file__)"], elsewhere
    )
    assert code == 0 and str(ROOT) not in out and "venv" in out, out


def test_verify_in_bfloat16_runs_installed(installed):
    python, elsewhere, _ = installed
    code, out = _run([str(python), "-m", "conformance", "verify", "torch", "--dtype", "bfloat16"], elsewhere)
    assert code == 0 and "CONFORMANT" in out, out[-2000:]


def test_the_quantized_example_runs_installed(installed):
    python, elsewhere, _ = installed
    spec = "conformance.examples.quantized:mlx_image_4bit"
    code, out = _run([str(python), "-m", "conformance", "verify", spec, "--preset", "vit_test_quantized"], elsewhere)
    assert code == 0 and "CONFORMANT" in out and "SQNR dB" in out, out[-2000:]


def test_the_plugin_runs_installed_on_a_shipped_example(installed):
    python, elsewhere, _ = installed
    cmd = [str(python), "-m", "pytest", "-p", "no:cacheprovider", "-q", "--pyargs", "conformance.tests.test_model"]
    cmd += ["--port", "conformance.examples.timm_vit:port", "--only-given-ports", "-k", "test_every_tap_of_every_port"]
    code, out = _run(cmd, elsewhere)
    assert code == 0 and " passed" in out and "failed" not in out, out[-2000:]


def test_docs_installed_is_exit_2_saying_it_needs_a_checkout(installed):
    python, elsewhere, _ = installed
    code, out = _run([str(python), "-m", "conformance", "docs", "--check"], elsewhere)
    assert code == 2 and "a checkout's docs" in out, out[-1000:]
