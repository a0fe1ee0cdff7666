"""The layers point one way: the import contract in pyproject.toml (import-linter, which reads every
import statement, those inside functions included) holds on the package as the wheel lays it out, and
breaks when the engine imports the dashboard, even inside a function."""

import ast
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


# the layers above the core: they may read an agent, never change it (issue 34: agents own their state)
ABOVE_THE_CORE = ("swarmtune/server", "swarmtune/sources", "tui", "swarmtune/commands", "swarmtune/cli.py",
                  "swarmtune/factories.py", "swarmtune/parsing.py")
MUTATORS = {"append", "extend", "clear", "pop", "remove", "insert", "add", "update", "discard", "sort"}


def _writes(paths: list[Path], names: set[str], calls: bool) -> list[tuple[str, ast.Attribute]]:
    """Each attribute named in `names` that a module assigns (and, with calls, changes by a mutating call
    such as `.append`): "path:line" and the attribute's node."""
    out = []
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text())):
            targets = node.targets if isinstance(node, ast.Assign) else \
                [node.target] if isinstance(node, ast.AugAssign | ast.AnnAssign) else []
            if calls and isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                    and node.func.attr in MUTATORS:
                targets = [node.func.value]
            out += [(f"{path.relative_to(ROOT)}:{node.lineno}", x) for t in targets for x in ast.walk(t)
                    if isinstance(x, ast.Attribute) and x.attr in names]
    return out


def test_no_module_above_the_core_writes_an_agents_field():
    """An assignment to, or a mutating call on, an attribute named as one of Agent's fields, on anything but
    `self`, in a module above the core. (By name: `id` is left out, as every record has one.)"""
    import dataclasses

    from swarmtune.engine.agents.agent import Agent

    fields = {f.name for f in dataclasses.fields(Agent)} - {"id"}
    files = [p for top in ABOVE_THE_CORE for p in ([ROOT / top] if top.endswith(".py") else (ROOT / top).rglob("*.py"))]
    assert len(files) > 20, files  # the folders are where this test thinks they are
    writes = [f"{where}: {ast.unparse(x)}" for where, x in _writes(files, fields, calls=True)
              if not (isinstance(x.value, ast.Name) and x.value.id == "self")]
    assert not writes, writes


def test_only_the_agent_changes_its_state():
    """An agent's state, its residency and what it waits for change only through its transitions
    (engine/agents/agent.py): no other module of the engine, the server or the sources assigns them."""
    files = [p for top in ("engine", "swarmtune/server", "swarmtune/sources") for p in (ROOT / top).rglob("*.py")
             if p != ROOT / "engine" / "agents" / "agent.py"]
    # `self.s.residency` is the setting, not an agent's
    writes = [f"{where}: {ast.unparse(x)}"
              for where, x in _writes(files, {"state", "residency", "tool_ready_at", "tool_pending"}, calls=False)
              if not (isinstance(x.value, ast.Attribute) and x.value.attr == "s")]
    assert not writes, writes


def test_what_drives_the_agents_edits_no_cells_itself():
    """The synthetic swarm, the served conversations, the server and the sources ask engine/agents/cells.py
    (begin again, continue from k cells, copy another agent's, cut) and call no backend method that changes
    a sequence's cells: an agent's history and its cells cannot part."""
    editing = {"drop", "truncate", "cut", "copy", "paste", "save_seq", "restore_seq"}
    files = [p for top in ("engine/agents", "swarmtune/server", "swarmtune/sources") for p in (ROOT / top).rglob("*.py")
             if p.name != "cells.py"]
    calls = [f"{p.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node.func)}" for p in files
             for node in ast.walk(ast.parse(p.read_text()))
             if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in editing
             and "backend" in ast.unparse(node.func.value)]
    assert not calls, calls


def test_only_the_control_path_writes_the_settings_in_force():
    """The settings in force change in one place: `ControlPath` (engine/control.py), and the KV type where
    the rebuild to it was made (engine/kv/switch.py). Every other module of the engine, the server and the
    sources reads them: an assignment to a setting's field on `s`, `self.s` or `settings` is found by name."""
    import dataclasses

    from swarmtune.engine.settings import EngineSettings

    fields = {f.name for f in dataclasses.fields(EngineSettings)}
    files = [p for top in ("engine", "swarmtune/server", "swarmtune/sources", "swarmtune/commands")
             for p in (ROOT / top).rglob("*.py")]
    writes = [(where, ast.unparse(x)) for where, x in _writes(files, fields, calls=False)
              if ast.unparse(x.value) in ("s", "self.s", "settings", "engine.s", "e.s")]
    assert writes, "the check finds no write at all: it is looking in the wrong place"
    elsewhere = [w for w in writes if not w[0].startswith(("engine/control.py", "engine/kv/switch.py"))]
    assert not elsewhere, elsewhere
    assert {x for where, x in writes if where.startswith("engine/kv/switch.py")} == {"self.s.kv"}
