#!/usr/bin/env bash
# llama.cpp's own tools, built from the llama-cpp-python sdist swarmtune pins (so both run the same
# llama.cpp), into bench/.llama.cpp/ (ignored by git). About 11 minutes on 2 cores for the first CPU
# tool, a few more for another; a Vulkan build about 5 minutes more (its shaders).
# Usage: bench/build_llama_server.sh [TARGET] [BACKEND]   -> prints the binary's path on its last line
#   TARGET: llama-server (the default), llama-perplexity or llama-batched-bench
#   BACKEND: cpu (the default), vulkan (bench/gpu/vulkan_deps.sh first), cuda, or rocm (hipcc)
# The tools run with the engine's buffer settings: bench/llama_tools.py says which flags.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
target="${1:-llama-server}"
backend="${2:-cpu}"
case "$target" in llama-server|llama-perplexity|llama-batched-bench) ;; *) echo "unknown target: $target" >&2; exit 2;; esac
flags=()
case "$backend" in
  cpu) ;;
  vulkan) flags+=(-DGGML_VULKAN=ON "-DVulkan_INCLUDE_DIR=$("$here/gpu/vulkan_deps.sh" | tail -1)") ;;
  cuda) flags+=(-DGGML_CUDA=ON) ;;
  rocm) flags+=(-DGGML_HIP=ON) ;;
  *) echo "unknown backend: $backend (cpu, vulkan, cuda or rocm)" >&2; exit 2;;
esac
out="$here/.llama.cpp"
build="$out/build"; [[ "$backend" == cpu ]] || build="$out/build-$backend"
bin="$build/bin/$target"
if [[ -x "$bin" ]]; then echo "$bin"; exit 0; fi
pin="$(grep -o 'llama-cpp-python==[0-9.]*' "$here/../pyproject.toml" | head -1)"
mkdir -p "$out"
if [[ ! -d "$out/src" ]]; then
  python -m pip download "$pin" --no-binary :all: --no-deps -d "$out/dl" -q
  mkdir -p "$out/src"
  tar -xzf "$out"/dl/llama_cpp_python-*.tar.gz -C "$out/src" --strip-components=1
fi
cmake -S "$out/src/vendor/llama.cpp" -B "$build" -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TOOLS=ON \
  -DGGML_NATIVE=ON "${flags[@]}" >/dev/null
cmake --build "$build" --target "$target" -j "$(nproc)" >/dev/null
echo "$bin"
