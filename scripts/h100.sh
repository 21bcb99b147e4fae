#!/usr/bin/env bash
# Every GPU run of catsdogs, on the H100 or H200 of ../shared/GPU.md (JAX and PyTorch, no TensorFlow,
# no network): catsdogs from its source tree on Keras's JAX backend, the Keras wheels carried in .whl/.
#
#   bash scripts/h100.sh all                 the GPU check: the stages that matter, most important
#                                            first, in at most 8 minutes (one call of the device tool)
#   bash scripts/h100.sh STAGE...            these stages, in this order, each under its own timeout
#   bash scripts/h100.sh --dry-run all       print what would run, with each stage's timeout
#   OUT=dir bash scripts/h100.sh --cpu-smoke every stage small (40 px) on a CPU: about 5 minutes
#
# The stages of `all`, in order, each with its timeout (seconds; 460 in all, and the report's 20):
#   prepare        (40)  the article's data at 200 px (synthetic source), once per machine
#   reproduce      (170) `reproduce --seeds 10`: 140 trials, determinism off, TF32 on (target <= 120 s)
#   profile-tf32   (70)  profile at 64, 256, 1024, determinism off, TF32 on; the PyTorch reference at
#                        the same sizes and TF32 setting in the same call (target: catsdogs >= PyTorch)
#   find           (80)  find-batch-size with its defaults, determinism off, TF32 on (target <= 60 s)
#   time-to-target (100) the critical plan's data (64 px), find-batch-size there (SGD), then the
#                        critical plan cut to one seed and one rate a batch size (configs/critical-gpu-
#                        check.toml: 6 trials until val_loss 0.49), and the report: the time to the
#                        target measured beside the predicted (the report within 60 s more)
# More, one call each when there is time: reproduce-det (determinism on: what it costs), profile-fp32
# (TF32 forbidden), profile-det, profile-bf16 (mixed_bfloat16, PyTorch under autocast), find-limit
# (find-batch-size --max 4096: the limit of a worker whose pool the probes grew), find-limit-fresh
# (the same with --isolate: every probe a fresh process, as a training run starts; issue 63), race
# (at 64 px, the critical plan's data: find-batch-size --race to val_loss 0.49, SGD, target at most
# 90 s of race; then the critical plan's SGD half, its ground truth (configs/critical-sgd.toml, 100
# trials); about 5 minutes).
#
# A stage that runs past its timeout is stopped (SIGINT, as Ctrl-C: a sweep gives its running trial
# back and keeps what finished) and named as cut in the summary; a stage with less than 20 s of the
# budget left is not started, and named. Each stage logs to STAGE.log; its wall time goes to
# timings.txt, its part to summary.md (scripts/h100_summary.py). What comes back is two files in
# $OUT: summary.md and h100-results.tar.gz (every log, CSV and JSON), remade after each stage.
set -euo pipefail
cd "$(dirname "$0")/.."

ALL=(prepare reproduce profile-tf32 find time-to-target)
MORE=(reproduce-det profile-fp32 profile-det profile-bf16 find-limit find-limit-fresh race)
declare -A TIMEOUT=(  # seconds on the H100/H200, compilation included
    [prepare]=40 [reproduce]=170 [profile-tf32]=70 [find]=80 [time-to-target]=100
    [reproduce-det]=400 [profile-fp32]=120 [profile-det]=300 [profile-bf16]=120 [find-limit]=400 [find-limit-fresh]=500 [race]=400)
GPU_BATCHES="64 256 1024"
MIN_STAGE=20  # a stage with less of the budget left is not started

usage() { sed -n '2,33p' "$0" | sed 's/^# \{0,1\}//'; }

DRY=0 SMOKE=0 BUDGET= STAGES=()
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
[[ -z $BUDGET || $BUDGET =~ ^[0-9]+$ ]] || { echo "h100.sh: --budget takes whole seconds, got '$BUDGET'" >&2; exit 2; }
if [ $SMOKE = 1 ]; then
    [ ${#STAGES[@]} -eq 0 ] || { echo "h100.sh: --cpu-smoke runs every stage; give no stage" >&2; exit 2; }
    STAGES=("${ALL[@]}" "${MORE[@]}")
    BUDGET=${BUDGET:-100000}  # every stage, small; each under ten times its GPU timeout
    for s in "${!TIMEOUT[@]}"; do TIMEOUT[$s]=$((TIMEOUT[$s] * 10)); done
fi
BUDGET=${BUDGET:-480}  # 8 minutes: one call of the device tool, with room for the machine's start
[ ${#STAGES[@]} -gt 0 ] || { usage >&2; exit 2; }
for stage in "${STAGES[@]}"; do
    [ "$stage" = all ] || [ -n "${TIMEOUT[$stage]+x}" ] || {
        echo "h100.sh: unknown stage '$stage'; stages: all ${ALL[*]} ${MORE[*]}" >&2; exit 2; }
    [ "$stage" != all ] || [ ${#STAGES[@]} -eq 1 ] || {
        echo "h100.sh: 'all' runs its stages: give it alone" >&2; exit 2; }
done
[ "${STAGES[*]}" != all ] || STAGES=("${ALL[@]}")

OUT=${OUT:-/tmp/catsdogs-out}
if [ $SMOKE = 1 ]; then
    # The quick plan's images (40 px, 120 a class), so `reproduce --config quick` finds them prepared
    WORK=$OUT/smoke-work DATA=$OUT/smoke-work/data RUNS=$OUT/smoke-work/runs
    PREPARE_ARGS=(--per-class 120 --split 72,24,24 --size 40)
    REPRODUCE_ARGS=(--config quick --seeds 1)
    PROFILE_ARGS=(--batch-size 4 8 --steps 2 --warmup 1)
    FIND_ARGS=(--start 8 --steps 1)
    LIMIT_ARGS=(--start 8 --max 32 --steps 1)
    TORCH_ARGS=(--size 40 --batch-size 4 8 --steps 2 --warmup 1)
    # the critical plan's kind on the quick data: two batch sizes, two rates, one epoch at most
    CRITICAL_RUN="sweep --data-dir $(printf %q "$DATA") --name critical --opt adam sgd --batch-size 4 8 --lr 0.001 0.01 \
--seeds 1 --until val_loss=0.9 --eval-every 32 --max-epochs 1 --noise-scale"
    CRITICAL_DATA=$DATA CRITICAL_FIND=(--start 4 --steps 1)
    # the race on the quick data: batch sizes up to 8, a target met at once, a budget
    RACE_ARGS=(--start 4 --max 8 --steps 1 --until val_loss=0.9 --race-budget 60) RACE_TRUTH=""
    PY=${PYTHON:-python3}
    export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} KERAS_BACKEND=jax PYTHONUNBUFFERED=1
    export CATSDOGS_COMPILE_CACHE=$OUT/smoke-work/jax-cache  # not the user's: a smoke leaves nothing behind
else
    WORK=/tmp/catsdogs DATA=/tmp/catsdogs/data RUNS=/tmp/catsdogs/runs
    PREPARE_ARGS=(--size 200)
    REPRODUCE_ARGS=(--source synthetic --seeds 10)
    read -r -a BATCHES <<<"$GPU_BATCHES"
    PROFILE_ARGS=(--batch-size "${BATCHES[@]}" --steps 20)
    FIND_ARGS=()
    LIMIT_ARGS=(--max 4096)
    TORCH_ARGS=(--batch-size "${BATCHES[@]}")
    CRITICAL_DATA=$WORK/critical-data
    CRITICAL_RUN="reproduce --config configs/critical-gpu-check.toml --data-dir $(printf %q "$CRITICAL_DATA") --quiet"
    CRITICAL_FIND=()
    RACE_ARGS=(--until val_loss=0.49)
    RACE_TRUTH="reproduce --config configs/critical-sgd.toml --data-dir $(printf %q "$CRITICAL_DATA") --quiet"
    PY=python3
    export PYTHONPATH=/tmp/site:$PWD KERAS_BACKEND=jax XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
fi
FAST=(--no-deterministic --tf32)  # the reference's settings: no deterministic ops, TF32 allowed
LOGS=$WORK/stages  # every stage's files, archived into $OUT/h100-results.tar.gz after each stage

# The command of each stage: catsdogs' own, then the PyTorch reference's where there is one. The
# paths are quoted: the commands run through eval, and OUT may hold a space.
stage_commands() {
    local c="$PY -m catsdogs" data runs logs
    data=$(printf %q "$DATA") runs=$(printf %q "$RUNS") logs=$(printf %q "$LOGS")
    case $1 in
    prepare) echo "$c prepare --source synthetic --data-dir $data --quiet ${PREPARE_ARGS[*]}" ;;
    reproduce) echo "$c reproduce ${REPRODUCE_ARGS[*]} ${FAST[*]} --data-dir $data --out $runs --name h100-reproduce --quiet" ;;
    reproduce-det) echo "$c reproduce ${REPRODUCE_ARGS[*]} --deterministic --tf32 --data-dir $data --out $runs --name h100-reproduce-det --quiet" ;;
    profile-tf32) echo "$c profile --data-dir $data --out $runs --name h100-profile-tf32 ${PROFILE_ARGS[*]} ${FAST[*]}"
        echo "$PY scripts/torch_reference.py ${TORCH_ARGS[*]} --tf32 --json $logs/torch-tf32.json" ;;
    profile-fp32) echo "$c profile --data-dir $data --out $runs --name h100-profile-fp32 ${PROFILE_ARGS[*]} --no-deterministic --no-tf32"
        echo "$PY scripts/torch_reference.py ${TORCH_ARGS[*]} --no-tf32 --json $logs/torch-fp32.json" ;;
    profile-det) echo "$c profile --data-dir $data --out $runs --name h100-profile-det ${PROFILE_ARGS[*]} --deterministic --tf32" ;;
    profile-bf16) echo "$c profile --data-dir $data --out $runs --name h100-profile-bf16 ${PROFILE_ARGS[*]} --precision mixed_bfloat16 ${FAST[*]}"
        echo "$PY scripts/torch_reference.py ${TORCH_ARGS[*]} --tf32 --bf16 --json $logs/torch-bf16.json" ;;
    find) echo "$c find-batch-size --data-dir $data --out $runs --name h100-find ${FIND_ARGS[*]} ${FAST[*]}" ;;
    find-limit) echo "$c find-batch-size --data-dir $data --out $runs --name h100-find-limit ${LIMIT_ARGS[*]} ${FAST[*]}" ;;
    find-limit-fresh) echo "$c find-batch-size --data-dir $data --out $runs --name h100-find-limit-fresh --isolate ${LIMIT_ARGS[*]} ${FAST[*]}" ;;
    time-to-target)  # the prediction first, then the trials it is held against (reproduce reports on both)
        [ $SMOKE = 1 ] || echo "$c prepare --source synthetic --size 64 --data-dir $(printf %q "$CRITICAL_DATA") --quiet"
        echo "$c find-batch-size --data-dir $(printf %q "$CRITICAL_DATA") --out $runs --name h100-find-critical-sgd --opt sgd ${CRITICAL_FIND[*]} ${FAST[*]}"
        echo "$c $CRITICAL_RUN --out $runs ${FAST[*]}" ;;
    race)  # the race, then the critical plan's SGD half as its ground truth (not in the smoke: time-to-target's stands in)
        [ $SMOKE = 1 ] || echo "$c prepare --source synthetic --size 64 --data-dir $(printf %q "$CRITICAL_DATA") --quiet"
        echo "$c find-batch-size --data-dir $(printf %q "$CRITICAL_DATA") --out $runs --name h100-race --opt sgd --race ${RACE_ARGS[*]} ${FAST[*]}"
        [ -z "$RACE_TRUTH" ] || echo "$c $RACE_TRUTH --out $runs ${FAST[*]}" ;;
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
    find) echo "find-batch-size with its defaults, determinism off, TF32 on" ;;
    find-limit) echo "find-batch-size --max 4096: the device's limit past the data" ;;
    find-limit-fresh) echo "find-batch-size --max 4096 --isolate: the limit of a fresh process, every probe its own" ;;
    time-to-target) echo "time to the target: one seed of the critical plan measured, find-batch-size's prediction beside it" ;;
    race) echo "the race: find-batch-size --race to val_loss 0.49 (SGD, 64 px), the critical plan's SGD half its ground truth" ;;
    esac
}

if [ $DRY = 1 ]; then
    used=0
    for stage in "${STAGES[@]}"; do
        t=${TIMEOUT[$stage]}
        [ $((BUDGET - used)) -ge $MIN_STAGE ] || { echo "# $stage: not started (the $BUDGET s budget is spent)"; continue; }
        [ "$t" -le $((BUDGET - used)) ] || t=$((BUDGET - used))
        used=$((used + t))
        echo "# $stage (timeout $t s)"
        stage_commands "$stage"
    done
    echo "# at most $used s in all"
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
command -v timeout >/dev/null || missing+=("coreutils' timeout")
if [ ${#missing[@]} -gt 0 ]; then
    echo "h100.sh: missing: $(IFS=';'; echo "${missing[*]}" | sed 's/;/; /g')" >&2
    exit 1
fi
HAVE_TORCH=1
$PY -c "import torch" 2>/dev/null || HAVE_TORCH=0

mkdir -p "$OUT" "$WORK" "$RUNS"
rm -rf "$LOGS" && mkdir -p "$LOGS"  # this call's stages only
SUMMARY=$OUT/summary.md
[ -f "$SUMMARY" ] || {
    echo "# catsdogs on $([ $SMOKE = 1 ] && echo "a CPU (the smoke: every stage small)" || nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
    echo
    $PY -c "import jax, keras, catsdogs; print(f'catsdogs {catsdogs.__version__}, Keras {keras.__version__}, JAX {jax.__version__} ({jax.default_backend()})')"
    echo
} >"$SUMMARY"

archive() {  # every stage's files, in one archive beside the summary
    tar -czf "$OUT/h100-results.tar.gz.tmp" -C "$WORK" stages && mv "$OUT/h100-results.tar.gz.tmp" "$OUT/h100-results.tar.gz"
}

run_stage() {  # run_stage STAGE TIMEOUT: its commands within TIMEOUT seconds; 0 done, 124 cut, else failed
    local stage=$1 limit=$2 start end seconds rc=0 cmd deadline left torch_json=""
    start=$(date +%s%N)
    deadline=$(($(date +%s) + limit))
    while IFS= read -r cmd; do
        if [[ $cmd == *scripts/torch_reference.py* ]]; then  # the PyTorch reference
            if [ $HAVE_TORCH = 0 ]; then
                echo "$stage: PyTorch is not installed here: its reference is skipped" | tee -a "$LOGS/$stage.log"
                continue
            fi
            torch_json="$LOGS/torch-${stage#profile-}.json"
        fi
        left=$((deadline - $(date +%s)))
        [ $left -gt 0 ] || { rc=124; break; }
        echo "\$ $cmd" >>"$LOGS/$stage.log"
        # SIGINT first (Ctrl-C: a sweep keeps what finished), then SIGKILL 15 s later
        timeout -s INT -k 15 "$left" bash -c "$cmd" >>"$LOGS/$stage.log" 2>&1 || rc=$?
        [ $rc = 0 ] || break
    done < <(stage_commands "$stage")
    end=$(date +%s%N)
    seconds=$(((end - start) / 1000000000))
    local outcome="exit $rc"
    [ $rc != 124 ] && [ $rc != 130 ] && [ $rc != 137 ] || { rc=124; outcome="cut at its ${limit} s timeout"; }
    printf '%s\t%d s\t%s\n' "$stage" "$seconds" "$outcome" | tee -a "$LOGS/timings.txt"
    summarize "$stage" "$seconds" "$rc" "$torch_json" "$outcome" || true
    archive
    return $rc
}

summarize() {  # the stage's part of summary.md
    local stage=$1 seconds=$2 rc=$3 torch_json=$4 outcome=$5 label
    label="$(label "$stage")"
    [ "$rc" = 0 ] || label="$label — $outcome after $seconds s"
    case $stage in
    prepare) [ "$rc" = 0 ] || printf '## %s\n\n' "$label" >>"$SUMMARY" ;;
    reproduce | reproduce-det)
        local target=""
        [ "$stage" = reproduce ] && [ $SMOKE = 0 ] && target="--target 120"
        $PY scripts/h100_summary.py reproduce --out "$RUNS" --name "h100-$stage" --seconds "$seconds" $target \
            --label "$label" >>"$SUMMARY"
        cp "$RUNS/h100-$stage/results.csv" "$LOGS/$stage-results.csv" 2>/dev/null || true ;;
    profile-*)
        $PY scripts/h100_summary.py profile --csv "$RUNS/h100-$stage/profile.csv" ${torch_json:+--torch "$torch_json"} \
            --label "$label" >>"$SUMMARY" || printf '## %s\n\nno profile.csv\n\n' "$label" >>"$SUMMARY"
        cp "$RUNS/h100-$stage/profile.csv" "$LOGS/$stage.csv" 2>/dev/null || true ;;
    find | find-limit | find-limit-fresh)
        local target=""
        [ "$stage" = find ] && [ $SMOKE = 0 ] && target="--target 60"
        $PY scripts/h100_summary.py find --json "$RUNS/h100-$stage/find_batch_size.json" $target --label "$label" \
            >>"$SUMMARY" || printf '## %s\n\nno find_batch_size.json\n\n' "$label" >>"$SUMMARY"
        cp "$RUNS/h100-$stage/find_batch_size.json" "$LOGS/$stage.json" 2>/dev/null || true ;;
    race)
        $PY scripts/h100_summary.py race --json "$RUNS/h100-race/find_batch_size.json" --out "$RUNS" --label "$label" \
            >>"$SUMMARY" || printf '## %s\n\nno race in find_batch_size.json\n\n' "$label" >>"$SUMMARY"
        cp "$RUNS/h100-race/find_batch_size.json" "$LOGS/$stage.json" 2>/dev/null || true ;;
    time-to-target)  # the report's own section, as it stands (reported again when the trials were cut)
        [ "$rc" = 0 ] && [ -f "$RUNS/critical/results.md" ] ||
            timeout -s INT -k 5 60 $PY -m catsdogs report --name critical --out "$RUNS" >>"$LOGS/$stage.log" 2>&1 || true
        { echo "## $label"; echo; awk '/^## Time to the target/{on=1; next} /^## /{on=0} on' "$RUNS/critical/results.md"
        } >>"$SUMMARY" 2>/dev/null || printf '## %s\n\nno report\n\n' "$label" >>"$SUMMARY"
        cp "$RUNS/critical/results.md" "$LOGS/critical-results.md" 2>/dev/null || true ;;
    esac
}

began=$(date +%s) skipped=() cut=() failed=0
for stage in "${STAGES[@]}"; do
    left=$((BUDGET - ($(date +%s) - began)))
    if [ $left -lt $MIN_STAGE ]; then skipped+=("$stage"); continue; fi
    # every stage trains on the prepared data but the critical plan's, which prepares its own (64 px)
    if [ "$stage" != prepare ] && { { [ "$stage" != time-to-target ] && [ "$stage" != race ]; } || [ $SMOKE = 1 ]; } &&
        [ ! -f "$DATA/manifest.json" ]; then
        run_stage prepare "${TIMEOUT[prepare]}" || { failed=1; break; }
        left=$((BUDGET - ($(date +%s) - began)))
    fi
    limit=${TIMEOUT[$stage]}
    [ "$limit" -le "$left" ] || limit=$left
    rc=0
    run_stage "$stage" "$limit" || rc=$?
    if [ $rc = 124 ]; then cut+=("$stage"); elif [ $rc != 0 ]; then failed=1; echo "$stage: exit $rc (see $LOGS/$stage.log)" >&2; fi
done
{
    echo "## What ran"
    echo
    echo "In $(($(date +%s) - began)) s of a $BUDGET s budget:"
    sed 's/^/- /; s/\t/: /g' "$LOGS/timings.txt"
    [ ${#cut[@]} -eq 0 ] || echo "- cut at their timeout: ${cut[*]}"
    [ ${#skipped[@]} -eq 0 ] || echo "- not started (the budget was spent): ${skipped[*]}; run them in a later call: bash scripts/h100.sh ${skipped[*]}"
    echo
} >>"$SUMMARY"
archive
echo "summary: $SUMMARY; every file: $OUT/h100-results.tar.gz"
exit $failed
