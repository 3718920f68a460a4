#!/usr/bin/env bash
# Everything the GPU rows of docs/performance-gpu.md need, on a lent GPU, in three calls of under
# ten minutes each. "first": the device loop's blocks against the plain loop (benchmarks/run.py
# --only blocks: ratios to the scan with the same records, and device-to-host copies per step
# counted in a profiler trace), the tests that must hold on the card (the blocks' bits and trip
# counts, the examples' speed test), the long, sparse and fixed sections. "second": the plain loop
# with XLA's command buffers, jl.benchmark's device timer, the memory bound. "third": the suites
# and the accelerator section. Each step has its own time limit; tables go to stdout and to $OUT
# (or $TMPDIR/jaxlog-device).
#
#     bash benchmarks/device_check.sh [first] [second] [third]   # on the machine with the GPU, from the repository root
set -u
cd "$(dirname "$0")/.."
out=${OUT:-${TMPDIR:-/tmp}/jaxlog-device}
mkdir -p "$out"
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
py=${PYTHON:-python3}
# the card's image has jax, h5py, tqdm, pytest, hypothesis; what it lacks travels as wheels in .whl/
# (perfetto, and this package's own wheel: `pip wheel --no-deps -w .whl .`, which registers the plugin)
if ls .whl/*.whl >/dev/null 2>&1; then
    $py -m pip install -q --no-index --no-deps --no-compile --target /tmp/jaxlog-site .whl/*.whl &&
        export PYTHONPATH=/tmp/jaxlog-site${PYTHONPATH:+:$PYTHONPATH}
else
    $py -m pip install -q --no-deps --no-build-isolation -e . >/dev/null
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null
$py -c "import jax; print('jax', jax.__version__, jax.devices())"

part() {  # part NAME SECONDS COMMAND...: one measurement, its limit, its output kept
    local name=$1 limit=$2 t0
    shift 2
    t0=$(date +%s)
    echo "== $name"
    timeout "$limit" "$@" 2>&1 | tee "$out/$name.txt"
    echo "== $name: exit ${PIPESTATUS[0]} after $(($(date +%s) - t0)) s"
}

# Three calls, each within one command's 10 minutes: `bash benchmarks/device_check.sh first`, then
# `... second`, `... third` (no argument: all). Seconds seen on one H100 (2026-11-28): blocks 92, gpu-tests 15,
# long 43, sparse 122, fixed over 35, command-buffers 15; on one H200 (the same day): fixed 56, long 45,
# sparse 123, device-timer 90, memory 41, suite over 225 (its own call).
want() { [ $# -eq 0 ] || [[ " $WANT " == *" $1 "* ]]; }
WANT=${*:-first second third}
if want first; then
    part blocks 120 $py benchmarks/run.py --only blocks --json "$out/blocks.json"
    part gpu-tests 40 $py -m pytest -q -p no:cacheprovider tests/test_blocks.py \
        examples/test_performance.py::test_lj_is_not_slower_than_a_bare_scan
    part long 80 $py benchmarks/run.py --only long
    part sparse 160 $py benchmarks/run.py --only sparse
    part fixed 100 $py benchmarks/run.py --only fixed
fi
if want second; then
    # the plain loop with XLA's command buffers (CUDA graphs) taking the loops: device-side loop conditions
    part command-buffers 40 env XLA_FLAGS="--xla_gpu_enable_command_buffer=FUSION,CUBLAS,CUBLASLT,CUSTOM_CALL,CUDNN,WHILE,CONDITIONAL" \
        $py benchmarks/run.py --only blocks --quick
    # jl.benchmark's device timer (the devices' busy seconds from a profiler trace) beside wall time
    part device-timer 150 $py benchmarks/device_timer.py
    # docs/memory.md's bound with the record buffers on the device
    part memory 120 $py benchmarks/memory.py --mb 16,64 --sinks hdf5,drop
fi
if want third; then  # whole pytest suites in fresh processes: over 225 s on an H200, a call of its own
    part suite 330 $py benchmarks/run.py --only suite --suite-repeats 3
    # LJ-4,096 and 10^6 oscillators: 4 GB of records a run, against the same bytes moved and written raw
    part accelerator 250 $py benchmarks/run.py --only accelerator
fi
