"""The layers point one way: the import contract in pyproject.toml (import-linter, which reads every
import statement, those inside functions included) holds on the package as the wheel lays it out, and
breaks when the engine imports the dashboard, even inside a function."""

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _lay_out(dest: Path) -> Path:
    """The package as the wheel installs it: swarmtune/ with its links to engine/ and tui/ followed."""
    pkg = dest / "swarmtune"
    shutil.copytree(ROOT / "swarmtune", pkg, ignore=shutil.ignore_patterns("__pycache__"))
    return pkg


def _lint(tree: Path) -> subprocess.CompletedProcess:
    lint = Path(sys.executable).with_name("lint-imports")
    return subprocess.run([str(lint), str(ROOT / "pyproject.toml"), "--no-cache"], capture_output=True, text=True,
                          cwd=tree, env={"PYTHONPATH": str(tree), "PATH": str(lint.parent)}, timeout=120)


def test_the_contract_holds(tmp_path):
    out = _lint(_lay_out(tmp_path).parent)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "3 kept, 0 broken" in out.stdout


def test_an_import_inside_a_function_breaks_it(tmp_path):
    pkg = _lay_out(tmp_path)
    engine = pkg / "engine" / "engine.py"
    engine.write_text(engine.read_text() + "\n\ndef _peek():\n    import swarmtune.tui.app  # noqa\n")
    out = _lint(tmp_path)
    assert out.returncode != 0
    assert "swarmtune.engine.engine -> swarmtune.tui.app" in out.stdout
