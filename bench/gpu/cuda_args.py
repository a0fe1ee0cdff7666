"""Extra CMake arguments a CUDA build of llama.cpp needs where the CUDA toolkit is partial.

A toolkit assembled from NVIDIA's pip packages (nvcc, the runtime) may lack cuBLAS and the driver stub
libcuda.so, which CMake's FindCUDAToolkit then cannot find (`CUDA::cublas ... target was not found`).
The same image usually carries cuBLAS as the `nvidia-cublas` wheel (PyTorch's), and the driver's own
libcuda.so.1. This prints the cache entries that point CMake at them, nothing where the toolkit is whole:

    python bench/gpu/cuda_args.py cmake   # -D... arguments, space-separated (notes on stderr)
    python bench/gpu/cuda_args.py ld      # folders the built library needs on LD_LIBRARY_PATH ('' if none)
"""

import glob
import os
import shutil
import subprocess
import sys
from pathlib import Path

TARGET = "targets/x86_64-linux"


def toolkit_root() -> Path | None:
    for env in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(env):
            return Path(os.environ[env])
    if Path("/usr/local/cuda/bin/nvcc").exists():
        return Path("/usr/local/cuda")
    nvcc = shutil.which("nvcc")
    return Path(nvcc).resolve().parent.parent if nvcc else None


def _first(patterns: list[str]) -> Path | None:
    for pat in patterns:
        hits = sorted(glob.glob(pat))
        if hits:
            return Path(hits[0])
    return None


def toolkit_lib(root: Path, name: str, stubs: bool = False) -> Path | None:
    dirs = ["lib64", "lib", f"{TARGET}/lib"]
    if stubs:
        dirs += ["lib64/stubs", "lib/stubs", f"{TARGET}/lib/stubs"]
    return _first([str(root / d / f"lib{name}.so") for d in dirs])


def toolkit_has_cublas(root: Path) -> bool:
    header = _first([str(root / "include/cublas_v2.h"), str(root / TARGET / "include/cublas_v2.h")])
    return header is not None and toolkit_lib(root, "cublas") is not None


def wheel_cublas(paths: list[str]) -> tuple[Path, Path] | None:
    """(include, lib) folders of an nvidia-cublas wheel on these sys.path entries (cu13 or cu12 layout)."""
    for base in paths:
        for layout in ("nvidia/cu*", "nvidia/cublas"):
            for d in sorted(glob.glob(os.path.join(base, layout))):
                inc, lib = Path(d, "include"), Path(d, "lib")
                if (inc / "cublas_v2.h").is_file() and glob.glob(str(lib / "libcublas.so*")):
                    return inc, lib
    return None


def driver_lib() -> Path | None:
    """The driver's libcuda.so.1 (a GPU machine has it; a build machine may have only the toolkit's stub)."""
    try:
        out = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        out = ""
    for line in out.splitlines():
        if line.strip().startswith("libcuda.so.1 ") and "x86-64" in line:
            return Path(line.rsplit("=>", 1)[1].strip())
    return _first(["/usr/local/nvidia/lib64/libcuda.so.1", "/usr/lib/x86_64-linux-gnu/libcuda.so.1",
                   "/usr/lib64/libcuda.so.1", "/usr/local/nvidia/lib/libcuda.so.1"])


def plan(root: Path | None, paths: list[str]) -> tuple[list[str], list[str], list[str]]:
    """(cmake args, LD_LIBRARY_PATH folders, notes)."""
    if root is None:
        raise SystemExit("cuda_args: no CUDA toolkit found (no nvcc, CUDA_HOME unset)")
    args: list[str] = []
    ld: list[str] = []
    notes: list[str] = [f"CUDA toolkit: {root}"]
    if toolkit_has_cublas(root):
        notes.append("cuBLAS: in the toolkit")
    else:
        found = wheel_cublas(paths)
        if found is None:
            raise SystemExit(f"cuda_args: no cuBLAS in {root} and no nvidia-cublas wheel on this Python's path")
        inc, lib = found
        cublas = _first([str(lib / "libcublas.so"), str(lib / "libcublas.so.*")])
        cublas_lt = _first([str(lib / "libcublasLt.so"), str(lib / "libcublasLt.so.*")])
        args += [f"-DCUDA_cublas_LIBRARY={cublas}", f"-DCMAKE_CUDA_FLAGS=-I{inc}"]
        if cublas_lt is not None:
            args.append(f"-DCUDA_cublasLt_LIBRARY={cublas_lt}")
        ld.append(str(lib))
        notes.append(f"cuBLAS: from the nvidia-cublas wheel, {inc.parent}")
    if toolkit_lib(root, "cuda", stubs=True) is not None:
        notes.append("libcuda: the toolkit's")
    else:
        drv = driver_lib()
        if drv is not None:
            args.append(f"-DCUDA_cuda_driver_LIBRARY={drv}")
            notes.append(f"libcuda: the driver's, {drv}")
        else:
            args.append("-DGGML_CUDA_NO_VMM=on")
            notes.append("libcuda: none found; building without CUDA VMM (the legacy memory pool)")
    return args, ld, notes


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv not in (["cmake"], ["ld"]):
        print("usage: cuda_args.py cmake|ld", file=sys.stderr)
        return 2
    args, ld, notes = plan(toolkit_root(), sys.path)
    if argv == ["cmake"]:
        for n in notes:
            print(n, file=sys.stderr)
        print(" ".join(args))
    else:
        print(":".join(ld))
    return 0


if __name__ == "__main__":
    sys.exit(main())
