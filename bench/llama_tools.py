"""llama.cpp's own tools (llama-server, llama-perplexity, llama-batched-bench) run with the engine's buffer
settings, so that a comparison is like with like and a tool runs wherever the engine runs.

The engine loads its model with extra buffer types (weight repacking) off unless SWARMTUNE_EXTRA_BUFTS=1
(engine/backends/llama_backend.py: llama.cpp's repacking dies of an illegal instruction, signal 4, on the
AMX Xeons these machines often are). The tools' default is repacking on: `--no-repack` (`-nr`) is the
engine's setting. Each bench prints `tool_settings_line()` beside its figures.
"""

import os
import subprocess
from pathlib import Path

HERE = Path(__file__).resolve().parent


def repack_on() -> bool:
    """The engine's own default (llama_backend.default_use_extra_bufts), read the same way."""
    return os.environ.get("SWARMTUNE_EXTRA_BUFTS", "0") == "1"


def engine_buffer_flags() -> list[str]:
    """The flags that give a llama.cpp tool the engine's buffer settings."""
    return [] if repack_on() else ["--no-repack"]


def tool_settings_line() -> str:
    return ("llama.cpp tools run as the engine does: weight repacking "
            + ("on (SWARMTUNE_EXTRA_BUFTS=1)" if repack_on() else "off (--no-repack), model memory-mapped"))


def build_tool(target: str, backend: str = "cpu") -> str:
    """The tool built from the pinned sdist (bench/build_llama_server.sh); its path."""
    out = subprocess.run([str(HERE / "build_llama_server.sh"), target, backend], check=True,
                         stdout=subprocess.PIPE, text=True)
    return out.stdout.strip().splitlines()[-1]
