"""The chat templates vendored in the llama.cpp that swarmtune pins (the llama-cpp-python sdist's
vendor/llama.cpp/models/templates/): the templates llama.cpp's own tests hold its parsers to. The sdist is
unpacked where bench/build_llama_server.sh unpacks it, and fetched from PyPI the first time."""

import fcntl
import re
import subprocess
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "bench" / ".llama.cpp" / "src"


def templates_dir() -> Path:
    where = SRC / "vendor" / "llama.cpp" / "models" / "templates"
    done = SRC.parent / ".templates.done"  # written once the unpacking has ended: a half-unpacked tree is not it
    if done.exists():
        return where
    SRC.parent.mkdir(parents=True, exist_ok=True)
    with open(SRC.parent / ".templates.lock", "w") as lock:  # test workers (-n) fetch it once between them
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not where.is_dir():  # under the lock, a tree that is there is whole (or bench/build_llama_server.sh's)
            _fetch()
        done.touch()
    return where


def _fetch() -> None:
    pin = re.search(r"llama-cpp-python==[0-9.]+", (ROOT / "pyproject.toml").read_text())
    assert pin, "pyproject.toml pins llama-cpp-python"
    dl = SRC.parent / "dl"
    subprocess.run([sys.executable, "-m", "pip", "download", pin.group(0), "--no-binary", ":all:", "--no-deps",
                    "-d", str(dl), "-q"], check=True, timeout=600)
    sdist = next(dl.glob("llama_cpp_python-*.tar.gz"))
    SRC.mkdir(parents=True, exist_ok=True)
    with tarfile.open(sdist) as tar:
        for member in tar.getmembers():
            parts = Path(member.name).parts[1:]
            if not parts:
                continue
            member.name = str(Path(*parts))
            tar.extract(member, SRC, filter="data")


def template(name: str) -> str:
    return (templates_dir() / name).read_text()
