#!/usr/bin/env bash
# llama.cpp's own tools, built from the llama-cpp-python sdist swarmtune pins (so both run the same
# llama.cpp), into bench/.llama.cpp/ (ignored by git). CPU build; about 11 minutes on 2 cores for the
# first tool, a few more for another.
# Usage: bench/build_llama_server.sh [TARGET]   -> prints the binary's path on its last line
#   TARGET: llama-server (the default) or llama-perplexity
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
target="${1:-llama-server}"
case "$target" in llama-server|llama-perplexity) ;; *) echo "unknown target: $target" >&2; exit 2;; esac
out="$here/.llama.cpp"
bin="$out/build/bin/$target"
if [[ -x "$bin" ]]; then echo "$bin"; exit 0; fi
pin="$(grep -o 'llama-cpp-python==[0-9.]*' "$here/../pyproject.toml" | head -1)"
mkdir -p "$out"
if [[ ! -d "$out/src" ]]; then
  python -m pip download "$pin" --no-binary :all: --no-deps -d "$out/dl" -q
  mkdir -p "$out/src"
  tar -xzf "$out"/dl/llama_cpp_python-*.tar.gz -C "$out/src" --strip-components=1
fi
cmake -S "$out/src/vendor/llama.cpp" -B "$out/build" -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TOOLS=ON \
  -DGGML_NATIVE=ON >/dev/null
cmake --build "$out/build" --target "$target" -j "$(nproc)" >/dev/null
echo "$bin"
