#!/usr/bin/env bash
# A second environment whose llama.cpp is built for AVX2 alone (no AVX-512, no AMX): on a machine that has
# them, it shows the other balance of q8_0 against f16 (on AVX2-only CPUs q8_0's decode attention costs
# about 1.2x f16's; with AVX-512 and AMX 0.3-0.45x). bench/autotune.py --avx2-python .venv-avx2/bin/python
# runs its real-model conditions there too. About 12 minutes on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${1:-.venv-avx2}
python3 -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --upgrade pip
flags="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON"
flags="$flags -DGGML_AVX_VNNI=OFF -DGGML_AVX512=OFF -DGGML_AVX512_VBMI=OFF -DGGML_AVX512_VNNI=OFF"
flags="$flags -DGGML_AVX512_BF16=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF"
CMAKE_ARGS="$flags" "$venv/bin/python" -m pip install --quiet --no-cache-dir --no-binary llama-cpp-python \
  "llama-cpp-python==0.3.36"
"$venv/bin/python" -m pip install --quiet -e .  # this checkout, as the bench runs it
echo "built: $venv (llama.cpp for AVX2 without AVX-512 or AMX)"
