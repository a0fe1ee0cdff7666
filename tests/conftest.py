import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import swarmtune.engine
from swarmtune.engine.backends.sim_backend import SimBackend
from swarmtune.engine.engine import Engine, EngineSettings
from swarmtune.engine.kv.types import KVSetting
from swarmtune.engine.model.default_model import default_model_path
from swarmtune.engine.model.profiles import profile

KV = KVSetting.parse  # a KV setting as a flag spells it

# Every engine in the tests (and every CLI they start) checks after each step that each agent's cache
# holds exactly its history: a slip that would make the numbers fiction fails the test that made it.
os.environ["SWARMTUNE_CHECK"] = "1"

ROOT = Path(__file__).resolve().parent.parent

SIM = "rx9070xt-qwen3.5-9b"
# a test that takes one of these runs the real default model: the fast lane (-m "not model") leaves it out
MODEL_FIXTURES = {"model_path", "llama_backend", "fresh"}


def pytest_sessionstart(session: pytest.Session) -> None:
    """The tests run this checkout or nothing: an installed copy would be tested instead, and an edit to the
    working tree would change nothing."""
    here = Path(swarmtune.engine.__file__).resolve().parent
    if here != ROOT / "engine":
        pytest.exit(f"these tests would run the swarmtune installed at {here}, not this checkout: run "
                    f"pip install -e '.[test]' in {ROOT}", returncode=4)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if MODEL_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.model)


def run_cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "swarmtune", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)


def until(cond, timeout: float = 20.0, every_s: float = 0.05) -> bool:
    """Poll cond() until it holds (or the timeout passes); the caller asserts the result."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(every_s)
    return cond()


async def wait_for(pilot, cond, timeout: float = 10.0) -> bool:
    """Let the app run until cond() holds (or the timeout passes); the caller asserts the result."""
    for _ in range(int(timeout / 0.05)):
        if cond():
            return True
        await pilot.pause(0.05)
    return cond()


@pytest.fixture
def sim_engine():
    p = profile(SIM)
    e = Engine(SimBackend(p), EngineSettings(ctx_per_agent=p.context_per_agent, kv_budget_bytes=p.kv_budget_bytes))
    yield e
    e.close()


@pytest.fixture(scope="session")
def model_path() -> Path:
    return default_model_path()


@pytest.fixture(scope="session")
def llama_backend(model_path):
    from swarmtune.engine.backends.llama_backend import LlamaBackend
    from swarmtune.engine.model.model_facts import read_model_facts

    b = LlamaBackend(read_model_facts(model_path), n_threads=2)
    yield b
    b.close()


@pytest.fixture(scope="session")
def fresh(model_path):
    """A second llama.cpp context on the same model: what an untouched cache computes."""
    from swarmtune.engine.backends.llama_backend import LlamaBackend
    from swarmtune.engine.model.model_facts import read_model_facts

    b = LlamaBackend(read_model_facts(model_path), n_threads=2)
    yield b
    b.close()


def prefill_code(b, n_seqs: int = 2) -> tuple[list[int], int, tuple[int, int], object]:
    """A live f16 cache whose sequence 0 holds 120 tokens of code: (its tokens, a next token, its cells, the
    next-token logits there). What a test that moves or sets aside a cache compares against."""
    b.open(KV("f16"), n_seqs, 512)
    b.steps.seed_sampler(0, 1)
    tokens = b.text.tokenize("def add(a, b):\n    return a + b\n\nprint(add(2, 3))\n" * 4)[:120]
    b.steps.prefill(0, tokens, 0)
    nxt = b.text.tokenize(" #")[0]
    return tokens, nxt, b.cells.span(0), b.steps.next_logits(0, nxt, len(tokens))
