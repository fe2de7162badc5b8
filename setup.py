"""What pyproject.toml cannot say: the wheel is built from a clean ``build/lib``.

setuptools copies the packages into ``build/lib`` and zips whatever is there, so a module deleted
or moved since the checkout's last build would ship as a ghost, importable at its old path
(pypa/setuptools#1871: 18 of them, the old ``conformance.verify`` sandbox among them, in a wheel
built from a checkout that had been built before the move). tests/test_wheel.py holds it."""

import shutil

from setuptools import setup
from setuptools.command.build_py import build_py


class CleanBuildPy(build_py):
    """build_py that first removes what an earlier build left (an editable install builds in a
    temporary directory of its own: nothing to remove)."""

    def run(self):
        if not self.editable_mode:
            shutil.rmtree(self.build_lib, ignore_errors=True)
        super().run()


setup(cmdclass={"build_py": CleanBuildPy})
