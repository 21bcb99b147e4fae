#!/usr/bin/env bash
# Every GPU run of catsdogs, on the H100 of ../shared/GPU.md (JAX and PyTorch, no TensorFlow, no
# network): catsdogs from its source tree on Keras's JAX backend, the Keras wheels carried in .whl/.
#
#   bash scripts/h100.sh STAGE...                      run these stages, in this order
#   bash scripts/h100.sh [--budget SECONDS] all        every stage, in priority order, within the budget
#   bash scripts/h100.sh --dry-run all                 print what would run, and what is left
#   OUT=dir bash scripts/h100.sh --cpu-smoke           every stage small (40 px) on a CPU: under 3 minutes
#
# Stages, in priority order (each sized for one 10-minute call of the device tool):
#   prepare        the article's data at 200 px (synthetic source), once per machine
#   reproduce      `reproduce --seeds 10`: 140 trials, determinism off, TF32 on (the 122 s reference's
#                  settings; target <= 150 s)
#   profile-tf32   profile 16-2048, determinism off, TF32 on; the PyTorch reference at the same TF32
#                  setting in the same call (target: catsdogs' best images/s >= PyTorch's)
#   find           find-batch-size on the GPU's memory (XLA's share), determinism off, TF32 on
#   reproduce-det  the same 140 trials with determinism on: what it costs
#   profile-fp32   profile and the PyTorch reference with TF32 forbidden
#   profile-det    profile with determinism on, TF32 on
#   profile-bf16   profile at mixed_bfloat16 and PyTorch under bfloat16 autocast
#   time-to-target the critical plan (64 px, until val_loss 0.49) and find-batch-size on its data,
#                  Adam and SGD, then the report: measured time to the target against the predicted
#
# `all` runs the stages in that order while each one's estimated time still fits in --budget
# (default 540 s: one call), skips the rest and prints the exact commands for them, grouped into
# calls. Each stage logs to $OUT/STAGE.log, adds its wall time to $OUT/timings.txt and its part to
# $OUT/summary.md (scripts/h100_summary.py). The prerequisites are checked first; what is missing
# is named in one line.
set -euo pipefail
cd "$(dirname "$0")/.."

ORDER=(prepare reproduce profile-tf32 find reproduce-det profile-fp32 profile-det profile-bf16 time-to-target)
declare -A ESTIMATE=(  # seconds on the H100, for --budget: compilation included (18-53 s a large probe)
    [prepare]=60 [reproduce]=240 [profile-tf32]=300 [find]=240 [reproduce-det]=360
    [profile-fp32]=300 [profile-det]=300 [profile-bf16]=240 [time-to-target]=480)
GPU_BATCHES="16 64 256 1024 2048"

usage() { sed -n '2,28p' "$0" | sed 's/^# \{0,1\}//'; }

DRY=0 SMOKE=0 BUDGET=540 STAGES=()
while [ $# -gt 0 ]; do
    case $1 in
    --dry-run) DRY=1 ;;
    --cpu-smoke) SMOKE=1 ;;
    --budget) [ $# -ge 2 ] || { echo "h100.sh: --budget needs a number of seconds" >&2; exit 2; }
        BUDGET=$2; shift ;;
    --budget=*) BUDGET=${1#*=} ;;
    -h | --help) usage; exit 0 ;;
    -*) echo "h100.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    *) STAGES+=("$1") ;;
    esac
    shift
done
[[ $BUDGET =~ ^[0-9]+$ ]] || { echo "h100.sh: --budget takes whole seconds, got '$BUDGET'" >&2; exit 2; }
if [ $SMOKE = 1 ]; then
    [ ${#STAGES[@]} -eq 0 ] || { echo "h100.sh: --cpu-smoke runs every stage; give no stage" >&2; exit 2; }
    STAGES=(all)
    BUDGET=100000  # every stage, small
fi
[ ${#STAGES[@]} -gt 0 ] || { usage >&2; exit 2; }
for stage in "${STAGES[@]}"; do
    [ "$stage" = all ] || [ -n "${ESTIMATE[$stage]+x}" ] || {
        echo "h100.sh: unknown stage '$stage'; stages: all ${ORDER[*]}" >&2; exit 2; }
    [ "$stage" != all ] || [ ${#STAGES[@]} -eq 1 ] || {
        echo "h100.sh: 'all' runs every stage: give it alone" >&2; exit 2; }
done
if [ "${STAGES[*]}" = all ]; then STAGES=("${ORDER[@]}"); ALL=1; else ALL=0; fi

OUT=${OUT:-/tmp/catsdogs-out}
if [ $SMOKE = 1 ]; then
    # The quick plan's images (40 px, 120 a class), so `reproduce --config quick` finds them prepared
    WORK=$OUT/smoke-work DATA=$OUT/smoke-work/data RUNS=$OUT/smoke-work/runs
    PREPARE_ARGS=(--per-class 120 --split 72,24,24 --size 40)
    REPRODUCE_ARGS=(--config quick --seeds 1)
    PROFILE_ARGS=(--batch-size 4 8 --steps 2 --warmup 1)
    FIND_ARGS=(--start 8 --max 32 --steps 1)
    TORCH_ARGS=(--size 40 --batch-size 4 8 --steps 2 --warmup 1)
    # the critical plan's kind on the quick data: two batch sizes, two rates, one epoch at most
    CRITICAL_RUN="sweep --data-dir $(printf %q "$DATA") --name critical --opt adam sgd --batch-size 4 8 --lr 0.001 0.01 \
--seeds 1 --until val_loss=0.9 --eval-every 32 --max-epochs 1 --noise-scale"
    CRITICAL_DATA=$DATA CRITICAL_FIND=(--start 4 --max 16 --steps 1)
    PY=${PYTHON:-python3}
    export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} KERAS_BACKEND=jax PYTHONUNBUFFERED=1
    export CATSDOGS_COMPILE_CACHE=$OUT/smoke-work/jax-cache  # not the user's: a smoke leaves nothing behind
else
    WORK=/tmp/catsdogs DATA=/tmp/catsdogs/data RUNS=/tmp/catsdogs/runs
    PREPARE_ARGS=(--size 200)
    REPRODUCE_ARGS=(--source synthetic --seeds 10)
    read -r -a BATCHES <<<"$GPU_BATCHES"
    PROFILE_ARGS=(--batch-size "${BATCHES[@]}" --steps 20)
    FIND_ARGS=(--start 2048)
    TORCH_ARGS=(--batch-size "${BATCHES[@]}")
    CRITICAL_DATA=$WORK/critical-data
    CRITICAL_RUN="reproduce --config critical --data-dir $(printf %q "$CRITICAL_DATA") --quiet"
    CRITICAL_FIND=(--max 4096)  # 64 px on 80 GB: the memory limit lies far above any size worth training
    PY=python3
    export PYTHONPATH=/tmp/site:$PWD KERAS_BACKEND=jax XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
fi
FAST=(--no-deterministic --tf32)  # the reference's settings: no deterministic ops, TF32 allowed

# The command of each stage: catsdogs' own, then the PyTorch reference's where there is one. The
# paths are quoted: the commands run through eval, and OUT may hold a space.
stage_commands() {
    local c="$PY -m catsdogs" data runs out
    data=$(printf %q "$DATA") runs=$(printf %q "$RUNS") out=$(printf %q "$OUT")
    case $1 in
    prepare) echo "$c prepare --source synthetic --data-dir $data --quiet ${PREPARE_ARGS[*]}" ;;
    reproduce) echo "$c reproduce ${REPRODUCE_ARGS[*]} ${FAST[*]} --data-dir $data --out $runs --name h100-reproduce --quiet" ;;
    reproduce-det) echo "$c reproduce ${REPRODUCE_ARGS[*]} --deterministic --tf32 --data-dir $data --out $runs --name h100-reproduce-det --quiet" ;;
    profile-tf32) echo "$c profile --data-dir $data --out $runs --name h100-profile-tf32 ${PROFILE_ARGS[*]} ${FAST[*]}"
        echo "$PY scripts/torch_reference.py ${TORCH_ARGS[*]} --tf32 --json $out/torch-tf32.json" ;;
    profile-fp32) echo "$c profile --data-dir $data --out $runs --name h100-profile-fp32 ${PROFILE_ARGS[*]} --no-deterministic --no-tf32"
        echo "$PY scripts/torch_reference.py ${TORCH_ARGS[*]} --no-tf32 --json $out/torch-fp32.json" ;;
    profile-det) echo "$c profile --data-dir $data --out $runs --name h100-profile-det ${PROFILE_ARGS[*]} --deterministic --tf32" ;;
    profile-bf16) echo "$c profile --data-dir $data --out $runs --name h100-profile-bf16 ${PROFILE_ARGS[*]} --precision mixed_bfloat16 ${FAST[*]}"
        echo "$PY scripts/torch_reference.py ${TORCH_ARGS[*]} --tf32 --bf16 --json $out/torch-bf16.json" ;;
    find) echo "$c find-batch-size --data-dir $data --out $runs --name h100-find ${FIND_ARGS[*]} ${FAST[*]}" ;;
    time-to-target) echo "$c $CRITICAL_RUN --out $runs ${FAST[*]}"
        for opt in adam sgd; do
            echo "$c find-batch-size --data-dir $(printf %q "$CRITICAL_DATA") --out $runs --name h100-find-critical-$opt --opt $opt ${CRITICAL_FIND[*]} ${FAST[*]}"
        done
        echo "$c report --name critical --out $runs" ;;
    esac
}

label() {
    case $1 in
    prepare) echo "prepare" ;;
    reproduce) echo "reproduce: the article's 14 configurations x 10 seeds, determinism off, TF32 on" ;;
    reproduce-det) echo "reproduce with determinism on, TF32 on: what determinism costs" ;;
    profile-tf32) echo "profile, determinism off, TF32 allowed; PyTorch with TF32 allowed" ;;
    profile-fp32) echo "profile, determinism off, TF32 forbidden; PyTorch with TF32 forbidden" ;;
    profile-det) echo "profile, determinism on, TF32 allowed" ;;
    profile-bf16) echo "profile at mixed_bfloat16, determinism off; PyTorch under bfloat16 autocast" ;;
    find) echo "find-batch-size, determinism off, TF32 on" ;;
    time-to-target) echo "time to the target: the critical plan measured, find-batch-size's prediction beside it" ;;
    esac
}

if [ $DRY = 1 ]; then
    used=0 left=()
    for stage in "${STAGES[@]}"; do
        if [ $ALL = 1 ] && [ $((used + ESTIMATE[$stage])) -gt "$BUDGET" ]; then left+=("$stage"); continue; fi
        used=$((used + ESTIMATE[$stage]))
        echo "# $stage (about ${ESTIMATE[$stage]} s on the H100)"
        stage_commands "$stage"
    done
    [ ${#left[@]} -eq 0 ] || echo "# left for later calls: ${left[*]}"
    exit 0
fi

# --- prerequisites, named in one line -----------------------------------------------------------
missing=()
if [ $SMOKE = 1 ]; then
    $PY -c "import catsdogs, jax, keras" 2>/dev/null || missing+=("catsdogs with Keras and JAX in $PY (pip install -e '.[jax]')")
else
    command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1 || missing+=("an NVIDIA GPU (nvidia-smi)")
    wheels=()
    for w in keras namex optree; do compgen -G ".whl/$w-*.whl" >/dev/null || wheels+=("$w"); done
    [ ${#wheels[@]} -eq 0 ] || missing+=("the ${wheels[*]} wheels in .whl/ (fetched here: docs/gpu.md)")
    if [ ${#missing[@]} -eq 0 ] && [ ! -d /tmp/site/keras ]; then
        python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl || missing+=("the wheels installed into /tmp/site")
    fi
    python3 -c "import jax, sys; sys.exit(jax.default_backend() != 'gpu')" 2>/dev/null || missing+=("JAX with its GPU backend")
fi
if [ ${#missing[@]} -gt 0 ]; then
    echo "h100.sh: missing: $(IFS=';'; echo "${missing[*]}" | sed 's/;/; /g')" >&2
    exit 1
fi
HAVE_TORCH=1
$PY -c "import torch" 2>/dev/null || HAVE_TORCH=0

mkdir -p "$OUT" "$WORK" "$RUNS"
SUMMARY=$OUT/summary.md
[ -f "$SUMMARY" ] || {
    echo "# catsdogs on $([ $SMOKE = 1 ] && echo "a CPU (the smoke: every stage small)" || nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
    echo
    $PY -c "import jax, keras, catsdogs; print(f'catsdogs {catsdogs.__version__}, Keras {keras.__version__}, JAX {jax.__version__} ({jax.default_backend()})')"
    echo
} >"$SUMMARY"

run_logged() {  # run_logged STAGE COMMAND: append its output to $OUT/STAGE.log; its exit status
    local stage=$1 rc=0
    shift
    echo "\$ $*" >>"$OUT/$stage.log"
    eval "$*" >>"$OUT/$stage.log" 2>&1 || rc=$?
    return $rc
}

run_stage() {
    local stage=$1 start end seconds rc=0 cmd torch_json=""
    # every stage trains on the prepared data but the critical plan's, which prepares its own (64 px)
    if [ "$stage" != prepare ] && { [ "$stage" != time-to-target ] || [ $SMOKE = 1 ]; } &&
        [ ! -f "$DATA/manifest.json" ]; then run_stage prepare; fi
    start=$(date +%s%N)
    while IFS= read -r cmd; do
        if [[ $cmd == *scripts/torch_reference.py* ]]; then  # the PyTorch reference
            if [ $HAVE_TORCH = 0 ]; then
                echo "$stage: PyTorch is not installed here: its reference is skipped" | tee -a "$OUT/$stage.log"
                continue
            fi
            torch_json="$OUT/torch-${stage#profile-}.json"
        fi
        run_logged "$stage" "$cmd" || rc=$?
    done < <(stage_commands "$stage")
    end=$(date +%s%N)
    seconds=$(((end - start) / 1000000000))
    printf '%s\t%d s\texit %s\n' "$stage" "$seconds" "$rc" | tee -a "$OUT/timings.txt"
    local label
    label="$(label "$stage")"
    case $stage in
    prepare) ;;
    reproduce | reproduce-det)
        local target=""
        [ "$stage" = reproduce ] && [ $SMOKE = 0 ] && target="--target 150"
        $PY scripts/h100_summary.py reproduce --out "$RUNS" --name "h100-$stage" --seconds "$seconds" $target \
            --label "$label" >>"$SUMMARY" || rc=$?
        cp "$RUNS/h100-$stage/results.csv" "$OUT/$stage-results.csv" 2>/dev/null || true ;;
    profile-*)
        $PY scripts/h100_summary.py profile --csv "$RUNS/h100-$stage/profile.csv" ${torch_json:+--torch "$torch_json"} \
            --label "$label" >>"$SUMMARY" || rc=$?
        cp "$RUNS/h100-$stage/profile.csv" "$OUT/$stage.csv" 2>/dev/null || true ;;
    find)
        $PY scripts/h100_summary.py find --json "$RUNS/h100-find/find_batch_size.json" --label "$label" >>"$SUMMARY" || rc=$?
        cp "$RUNS/h100-find/find_batch_size.json" "$OUT/find_batch_size.json" 2>/dev/null || true ;;
    time-to-target)  # the report's own section, as it stands
        { echo "## $label"; echo; awk '/^## Time to the target/{on=1; next} /^## /{on=0} on' "$RUNS/critical/results.md"
        } >>"$SUMMARY" 2>/dev/null || rc=1
        cp "$RUNS/critical/results.md" "$OUT/critical-results.md" 2>/dev/null || true ;;
    esac
    [ $rc = 0 ] || echo "$stage: exit $rc (see $OUT/$stage.log)" >&2
    return $rc
}

began=$(date +%s) left=() failed=0
for stage in "${STAGES[@]}"; do
    elapsed=$(($(date +%s) - began))
    if [ $ALL = 1 ] && [ $((elapsed + ESTIMATE[$stage])) -gt "$BUDGET" ]; then
        left+=("$stage")
        continue
    fi
    run_stage "$stage" || failed=1
done
if [ ${#left[@]} -gt 0 ]; then  # the commands for what is left, one call each
    echo "Left for later calls (each fits $BUDGET s):"
    call=() used=0
    for stage in "${left[@]}"; do
        if [ ${#call[@]} -gt 0 ] && [ $((used + ESTIMATE[$stage])) -gt "$BUDGET" ]; then
            echo "  bash scripts/h100.sh ${call[*]}"
            call=() used=0
        fi
        call+=("$stage")
        used=$((used + ESTIMATE[$stage]))
    done
    echo "  bash scripts/h100.sh ${call[*]}"
fi
echo "summary: $SUMMARY"
exit $failed
