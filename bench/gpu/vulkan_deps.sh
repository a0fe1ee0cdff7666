#!/usr/bin/env bash
# What a Vulkan build of the pinned llama.cpp needs on Debian 12, and the device it runs on here:
#   - Mesa's lavapipe ("llvmpipe": Vulkan on the CPU) from bookworm-backports (mesa-vulkan-drivers 25.0.7):
#     Debian 12's own 22.3.6 crashes in its worker thread on the engine's first mixed prefill/decode steps
#     (a segmentation fault inside libvulkan_lvp.so, docs/device.md); backports are Debian's own packages,
#     pinned below the release by default, so nothing else moves to them;
#   - Debian 12's packages: libvulkan-dev
#     (the loader), glslc and glslang-tools (the shader compilers), vulkan-tools (vulkaninfo), spirv-headers
#     (the CMake config ggml-vulkan's find_package(SPIRV-Headers) needs);
#   - newer Vulkan headers: the pinned ggml-vulkan.cpp uses VK_EXT_layer_settings (vk::LayerSettingEXT),
#     which Debian 12's headers (1.3.239) lack. Debian 13's libvulkan-dev (1.4.309) has it: its .deb is
#     fetched through a private apt list (the system's apt sources and pins are not touched) and unpacked
#     into a folder; only its headers are used. The loader, the driver and glslc stay Debian 12's.
# Prints the include folder to pass as -DVulkan_INCLUDE_DIR on its last line.
# Usage: bench/gpu/vulkan_deps.sh          (as root, or with sudo; ~15 s with a warm apt cache)
set -euo pipefail
dest="${VULKAN_HEADERS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/swarmtune/vulkan-headers}"
as_root=""; [ "$(id -u)" -eq 0 ] || as_root="sudo"
need=()
for pkg in libvulkan-dev glslc glslang-tools vulkan-tools spirv-headers; do
  dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
done
mesa=$(dpkg-query -W -f '${Version}' mesa-vulkan-drivers 2>/dev/null || true)
new_mesa=1
case "$mesa" in 2[5-9].*|[3-9]*) new_mesa=0 ;; esac
if [ ${#need[@]} -gt 0 ] || [ "$new_mesa" -eq 1 ]; then
  bpo=/etc/apt/sources.list.d/bookworm-backports.list
  if grep -q bookworm /etc/os-release && ! grep -rqs "bookworm-backports" /etc/apt/sources.list /etc/apt/sources.list.d; then
    echo "deb http://deb.debian.org/debian bookworm-backports main" | $as_root tee "$bpo" >/dev/null
  fi
  $as_root apt-get update -qq >&2
  if [ ${#need[@]} -gt 0 ]; then
    DEBIAN_FRONTEND=noninteractive $as_root apt-get install -y -qq --no-install-recommends "${need[@]}" >&2
  fi
  if [ "$new_mesa" -eq 1 ]; then  # -t: its dependencies may come from backports too (a newer libdrm, say)
    DEBIAN_FRONTEND=noninteractive $as_root apt-get install -y -qq --no-install-recommends \
      -t bookworm-backports mesa-vulkan-drivers >&2
  fi
fi
if [ ! -f "$dest/usr/include/vulkan/vulkan.hpp" ] || ! grep -q "LayerSettingEXT" -r "$dest/usr/include/vulkan" 2>/dev/null; then
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  mkdir -p "$work/lists/partial" "$work/cache/archives/partial"
  echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian trixie main" \
    > "$work/trixie.list"
  opts=(-o "Dir::Etc::SourceList=$work/trixie.list" -o Dir::Etc::SourceParts=/dev/null
        -o "Dir::State::Lists=$work/lists" -o "Dir::Cache=$work/cache" -o Dir::Etc::Preferences=/dev/null
        -o Dir::Etc::PreferencesParts=/dev/null -o APT::Sandbox::User=root)
  apt-get "${opts[@]}" update -qq >&2
  (cd "$work" && apt-get "${opts[@]}" download libvulkan-dev/trixie >&2)
  rm -rf "$dest" && mkdir -p "$dest"
  dpkg -x "$work"/libvulkan-dev_*.deb "$dest"
fi
echo "$dest/usr/include"
