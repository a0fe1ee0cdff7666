"""llama.cpp's own tools (llama-server, llama-perplexity, llama-batched-bench) run with the engine's buffer
settings, so that a comparison is like with like and a tool runs wherever the engine runs.

The engine loads its model with extra buffer types (weight repacking) off unless --extra-bufts
(engine/backends/llama_backend.py: llama.cpp's repacking dies of an illegal instruction, signal 4, on the
AMX Xeons these machines often are). The tools' default is repacking on: `--no-repack` (`-nr`) is the
engine's setting. Each bench prints `tool_settings_line()` beside its figures.
"""

import subprocess
from pathlib import Path

HERE = Path(__file__).resolve().parent


def engine_buffer_flags() -> list[str]:
    """The flags that give a llama.cpp tool the engine's default buffer settings (no --extra-bufts)."""
    return ["--no-repack"]


def tool_settings_line() -> str:
    return "llama.cpp tools run as the engine does by default: weight repacking off (--no-repack), model memory-mapped"


def build_tool(target: str, backend: str = "cpu") -> str:
    """The tool built from the pinned sdist (bench/build_llama_server.sh); its path."""
    out = subprocess.run([str(HERE / "build_llama_server.sh"), target, backend], check=True,
                         stdout=subprocess.PIPE, text=True)
    return out.stdout.strip().splitlines()[-1]
