"""The package's types are checked: a signature that drifts from its protocol (a source's `request`
without a control the others take) fails here, not in a user's hands."""

import subprocess
import sys

from tests.conftest import ROOT


def test_the_type_checker_passes_over_the_package():
    out = subprocess.run([sys.executable, "-m", "mypy"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "Success: no issues found" in out.stdout
