#!/usr/bin/env bash
# The checks that need a GPU, in one run: scripts/gpu-check.sh [--quick] [--bundle DIR] [--part P]
#
#   1. the fused-kernel and GPU pool tests (tests/gpu/): fail unless every one runs, none skipped
#      (a missing `cuda-kernels` extra skips them: install it, `pip install -e .[cuda-kernels]`);
#      among them: the decode step as CUDA graphs against the eager step, host pools and the
#      copier's staging buffer pinned, bf16 state copies of slots over 32 MiB both ways;
#   2. the engine, pool, parking, migration and padded-decode tests with every engine and pool
#      fixture on CUDA (SESSION_ROUTER_TEST_DEVICE=cuda; their decode steps run as CUDA graphs);
#   3. bench.decode, bench.step_calls, bench.state_update, bench.park_restore and
#      bench.vs_transformers on the GPU, their tables printed.
# Every step runs (a GPU's time is scarce: one run tells everything); the failed ones are listed
# at the end and the check fails. None of it needs Ray.
#
# --part P: only part of it, for a machine whose calls are time-limited: `kernels` (the CUDA
# check and the bundle's build), `tests` (1 and 2) or `bench` (3); default `all`.
#
# --bundle DIR: a directory made by scripts/gpu-bundle.sh, for a machine that has PyTorch and
# Triton but not the extra and cannot download it: its Python files go on PYTHONPATH, and
# causal-conv1d is built from its source for this GPU first (scripts/causal_conv1d_build.py)
# into .gpu-build/ (ignored by git), which a later run on the same machine finds built.
#
# Fails at once, saying why, on a machine without CUDA. Python: $PYTHON, else .venv/bin/python.
# Logs and JUnit reports go to $GPU_CHECK_OUT (default: a fresh temporary directory).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
QUICK=()
BUNDLE=
PART=all
USAGE="usage: scripts/gpu-check.sh [--quick] [--bundle DIR] [--part all|kernels|tests|bench]"
while [ $# -gt 0 ]; do
    case $1 in
        --quick) QUICK=(--quick) ;;
        --bundle) BUNDLE=$(cd "$2" && pwd); shift ;;
        --part)
            case ${2:-} in
                all | kernels | tests | bench) PART=$2 ;;
                *) echo "$USAGE" >&2; exit 2 ;;
            esac
            shift
            ;;
        *) echo "$USAGE" >&2; exit 2 ;;
    esac
    shift
done
part() { [ "$PART" = all ] || [ "$PART" = "$1" ]; }
OUT=${GPU_CHECK_OUT:-$(mktemp -d)}
mkdir -p "$OUT"

FAILED=()
fail() {
    echo "gpu-check: FAILED: $*" >&2
    FAILED+=("$*")
}
step() { echo; echo "=== gpu-check: $* ==="; }

step "CUDA"
"$PY" - <<'EOF' || { fail "no CUDA device here: this check runs only where torch sees a GPU"; exit 1; }
import sys

import torch

if not torch.cuda.is_available():
    print(f"torch {torch.__version__} (CUDA build {torch.version.cuda}) sees no CUDA device",
          file=sys.stderr)
    sys.exit(1)
props = torch.cuda.get_device_properties(0)
print(f"{props.name}, {props.total_memory / 2**30:.0f} GiB, sm_{props.major}{props.minor}; "
      f"torch {torch.__version__}, CUDA {torch.version.cuda}")
EOF

if [ -n "$BUNDLE" ]; then
    step "the bundle's kernels ($BUNDLE)"
    BUILT=$PWD/.gpu-build  # not in the bundle: a later run with a fresh copy of it finds it built
    mkdir -p "$BUILT"
    export PYTHONPATH="$BUNDLE/python:$BUILT${PYTHONPATH:+:$PYTHONPATH}"
    if ! "$PY" -c "import causal_conv1d" 2> /dev/null; then
        for sdist in "$BUNDLE"/causal_conv1d-*.tar.gz; do
            timeout 420 "$PY" scripts/causal_conv1d_build.py "$sdist" "$BUILT" \
                > "$OUT/causal-conv1d-build.log" 2>&1 \
                || fail "causal-conv1d's build (log: $OUT/causal-conv1d-build.log)"
            tail -n 1 "$OUT/causal-conv1d-build.log"
        done
    fi
    "$PY" -c "import mamba_ssm.ops.triton.ssd_combined, fla.ops.gated_delta_rule, causal_conv1d" \
        || fail "the bundle's kernels do not import"
fi

# pytest with a JUnit report; fails unless everything passed and nothing was skipped.
run_tests() {
    local name=$1
    shift
    local report="$OUT/$name.xml"
    "$PY" -m pytest -q -rs -p no:cacheprovider --junitxml="$report" "$@" \
        || { fail "$name: tests failed (report: $report)"; return; }
    "$PY" - "$report" <<'EOF' || fail "$name: tests were skipped; every one must run on a GPU"
import sys
import xml.etree.ElementTree as ET

suites = ET.parse(sys.argv[1]).getroot().iter("testsuite")
counts = [(int(s.get("tests", 0)), int(s.get("skipped", 0))) for s in suites]
tests, skipped = sum(t for t, _ in counts), sum(s for _, s in counts)
print(f"{tests} tests, {skipped} skipped")
sys.exit(1 if skipped or not tests else 0)
EOF
}

if part tests; then
    step "fused kernels and GPU pools (tests/gpu), none skipped"
    run_tests gpu tests/gpu

    step "engine, pool, parking and migration tests on CUDA"
    export SESSION_ROUTER_TEST_DEVICE=cuda
    run_tests engine-on-cuda \
        tests/test_engine.py tests/test_engine_churn.py tests/test_engine_peer.py \
        tests/test_engine_state_machine.py tests/test_batched_prefill.py \
        tests/test_pools.py tests/test_pool_state_machine.py tests/test_slot_allocator.py \
        tests/test_state_copy.py tests/test_parking.py tests/test_parking_exact.py \
        tests/test_migration_exact.py \
        tests/test_decode_padding.py tests/test_decode_graphs.py \
        tests/models/test_family_engine.py tests/models/test_family_dtypes.py
    unset SESSION_ROUTER_TEST_DEVICE
fi

# one benchmark on the GPU: its table printed and kept in $OUT/bench-NAME.txt
gpu_bench() {
    local name=$1
    shift
    step "bench.$name (cuda)"
    "$PY" -m "bench.$name" --device cuda "$@" | tee "$OUT/bench-${name//_/-}.txt" \
        || fail "bench.$name"
}

if part bench; then
    gpu_bench decode "${QUICK[@]}"
    gpu_bench step_calls "${QUICK[@]}"
    gpu_bench state_update "${QUICK[@]}"  # the kernels in place vs on a gathered copy
    gpu_bench park_restore "${QUICK[@]}"
    ROUNDS=3
    [ ${#QUICK[@]} -gt 0 ] && ROUNDS=1
    gpu_bench vs_transformers --dtype bfloat16 --rounds "$ROUNDS"
fi

echo
if [ ${#FAILED[@]} -gt 0 ]; then
    echo "gpu-check: FAILED (logs in $OUT):"
    printf '  - %s\n' "${FAILED[@]}"
    exit 1
fi
echo "gpu-check: passed ($PART; logs in $OUT)"
