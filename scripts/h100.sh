#!/usr/bin/env bash
# The title question on a GPU machine without TensorFlow (the H100 of ../shared/GPU.md): catsdogs
# from its source tree on Keras 3's JAX backend, the Keras wheels carried in .whl/.
#
#   bash scripts/h100.sh STAGE...     stages: prepare profile profile-bf16 find reproduce
#
# Each stage writes its results flat under $OUT (what the device tool brings back: at most 8
# files) and appends its wall time to $OUT/timings.txt. Data is prepared once per machine in
# /tmp/catsdogs-data (200 px, the article's 1,000 images per class, synthetic source); every
# stage but `prepare` prepares it first if it is not there (a no-op when it is).
#
# A profile probe at batch 1,024-4,096 compiles for 18-53 s on the H100 (XLA's autotuner), so
# the stages are sized for one 10-minute call each: `prepare profile profile-bf16`, `find`, `reproduce`.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/catsdogs-out}
DATA=/tmp/catsdogs-data
RUNS=/tmp/catsdogs-runs
mkdir -p "$OUT" "$RUNS"

if [ ! -d /tmp/site/keras ]; then
    python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
fi
export PYTHONPATH=/tmp/site:$PWD KERAS_BACKEND=jax XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1

timed() {  # timed NAME COMMAND...: run it, log its output to $OUT/NAME.log, its wall time to timings.txt
    local name=$1 start end rc=0
    shift
    start=$(date +%s%N)
    "$@" >>"$OUT/$name.log" 2>&1 || rc=$?
    end=$(date +%s%N)
    printf '%s\t%d ms\texit %s\t%s\n' "$name" $(((end - start) / 1000000)) "$rc" "$*" | tee -a "$OUT/timings.txt"
}

prepare() {
    timed prepare python3 -m catsdogs prepare --source synthetic --data-dir "$DATA" --quiet
}

for stage in "$@"; do
    case $stage in
    prepare)
        nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader >"$OUT/gpu.txt" || true
        python3 -c "import jax, keras; print('jax', jax.__version__, jax.devices(), 'keras', keras.__version__)" >>"$OUT/gpu.txt"
        prepare ;;
    profile)  # the article's batch sizes and past them, float32; NVML sampled over >= 2 s a probe
        [ -f "$DATA/manifest.json" ] || prepare
        timed profile python3 -m catsdogs profile --data-dir "$DATA" --out "$RUNS" --name h100-fp32 \
            --batch-size 4 8 16 32 64 128 256 512 1024 2048 4096 --steps 20
        cp "$RUNS/h100-fp32/profile.csv" "$OUT/profile-fp32.csv" ;;
    profile-bf16)
        [ -f "$DATA/manifest.json" ] || prepare
        timed profile-bf16 python3 -m catsdogs profile --data-dir "$DATA" --out "$RUNS" --name h100-bf16 \
            --precision mixed_bfloat16 --batch-size 16 64 256 1024 4096 --steps 20
        cp "$RUNS/h100-bf16/profile.csv" "$OUT/profile-bf16.csv" ;;
    find)  # the largest batch size in XLA's share of the GPU, predicted (XLA's plan) and measured
        [ -f "$DATA/manifest.json" ] || prepare
        timed find python3 -m catsdogs find-batch-size --data-dir "$DATA" --out "$RUNS" --name h100-find \
            --start 2048
        cp "$RUNS/h100-find/find_batch_size.json" "$OUT/find_batch_size.json" ;;
    reproduce)  # the target: the article's 14 configurations x 10 seeds in <= 150 s, data prepared
        [ -f "$DATA/manifest.json" ] || prepare
        timed reproduce python3 -m catsdogs reproduce --source synthetic --seeds 10 --data-dir "$DATA" \
            --out "$RUNS" --name h100-reproduce --quiet
        cp "$RUNS/h100-reproduce/results.md" "$OUT/reproduce-results.md"
        cp "$RUNS/h100-reproduce/results.csv" "$OUT/reproduce-results.csv" ;;
    *)
        echo "unknown stage $stage: prepare profile profile-bf16 find reproduce" >&2
        exit 2 ;;
    esac
done
