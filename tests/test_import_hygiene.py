"""The engine never imports the UI: each engine module is imported alone in a fresh interpreter."""

import subprocess
import sys
from pathlib import Path

import pytest

ENGINE = Path(__file__).resolve().parent.parent / "engine"
MODULES = sorted(f"engine.{p.stem}" for p in ENGINE.glob("*.py") if p.stem != "__init__") + ["engine"]


@pytest.mark.parametrize("module", MODULES)
def test_engine_module_does_not_import_textual(module):
    code = f"import sys, {module}; print('textual' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ENGINE.parent, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"
