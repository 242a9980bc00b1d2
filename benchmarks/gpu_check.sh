#!/usr/bin/env bash
# One-shot GPU check for a machine with an NVIDIA GPU and no network (jax[cuda], equinox,
# jaxtyping, optax, lineax, pybind11, scikit-build-core, cmake, nvcc preinstalled; beartype and
# matfree as wheels in .whl/ if missing). Run from the repository root:
#   bash benchmarks/gpu_check.sh [seconds]     (a deadline for the whole run; default 450)
#   ONLY="build op-tests" bash benchmarks/gpu_check.sh   (only the named stages)
# Stages, most important first, each bounded by what is left of the deadline; a failed stage
# is reported and the next one runs. The log goes to $OUT/gpu_check.log when OUT is set.
#  1. build eqgp with the CUDA handlers (no build isolation: uses what is installed);
#  2. the op / layer / linear-algebra tests with JAX on the GPU;
#  3. sumcumprod (16384, 16384) etc. float32: native forward vs a device copy (bandwidth);
#  4. compute-sanitizer memcheck, racecheck and synccheck on small cases (both directions, both row paths);
#  5. the covariance / solver tests, then the rest of the suite (not the docs build);
#  6. benchmarks: derivative grams and the likelihood (GPyTorch on the same GPU), matrix-free,
#     multi-start L-BFGS batched with vmap against one start after another.
set -uo pipefail
cd "$(dirname "$0")/.."
DEADLINE=$(( $(date +%s) + ${1:-450} ))
LOG=${OUT:-/tmp}/gpu_check.log
SUMMARY=""
exec > >(tee "$LOG") 2>&1
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false CI=true
export PY=python3

stage() {  # stage NAME MAX_SECONDS COMMAND...
  local name=$1 max=$2; shift 2
  if [[ -n ${ONLY:-} && " $ONLY " != *" $name "* ]]; then SUMMARY+="$name: not asked for (ONLY)"$'\n'; return 0; fi
  local left=$(( DEADLINE - $(date +%s) ))
  (( left < max )) && max=$left
  if (( max < 15 )); then SUMMARY+="$name: SKIPPED (deadline)"$'\n'; return; fi
  echo "=== $name (up to ${max}s) ==="
  local t0=$(date +%s)
  timeout "$max" bash -c '"$@"' _ "$@"; local rc=$?  # functions are exported to the child
  local dt=$(( $(date +%s) - t0 ))
  local verdict=ok; (( rc != 0 )) && verdict="FAILED rc=$rc"; (( rc == 124 )) && verdict="TIMED OUT"
  SUMMARY+="$name: $verdict (${dt}s)"$'\n'
  echo "=== $name: $verdict (${dt}s) ==="
  return $rc
}

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv || true
if ls .whl/*.whl >/dev/null 2>&1; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site
fi
build() {
  EQGP_CUDA=ON CMAKE_BUILD_PARALLEL_LEVEL=16 $PY -m pip install --no-build-isolation --no-deps -q . &&
  (cd /tmp && $PY - <<'PY'
import jax, eqgp
print("jax", jax.__version__, "devices:", jax.devices(), "native platforms:", eqgp.ops.NATIVE_PLATFORMS)
assert jax.default_backend() == "gpu", "JAX does not see the GPU"
assert "cuda" in eqgp.ops.NATIVE_PLATFORMS, "CUDA handlers not built/loaded"
PY
  )
}
export -f build
stage build 240 build || { echo "$SUMMARY"; exit 1; }

# The installed package, not the source tree (which has no compiled modules): run from /tmp.
export T=$PWD/tests ROOT=$PWD
pytest_gpu() { (cd /tmp && $PY -m pytest -q -rfE -p no:cacheprovider -c "$ROOT/pyproject.toml" --rootdir "$ROOT" "$@"); }
export -f pytest_gpu
stage op-tests 150 pytest_gpu -n 8 "$T/test_ops.py" "$T/test_nn.py" "$T/test_linalg.py" \
  "$T/test_properties.py" -k "not test_properties.py or sumcumprod"

bandwidth() { (cd /tmp && $PY - <<'PY'
import statistics, time
import jax, jax.numpy as jnp
from eqgp.ops import sumcumprod, sumcumprod_reference

def med(fn, x, n=20):
    jax.block_until_ready(fn(x)); jax.block_until_ready(fn(x))
    ts = []
    for _ in range(n):
        t0 = time.perf_counter(); jax.block_until_ready(fn(x)); ts.append(time.perf_counter() - t0)
    return statistics.median(ts)

result = None
for shape in [(16384, 16384), (4096, 4096), (1 << 20, 64), (16, 1 << 22), (4096,)]:
    x = jax.random.uniform(jax.random.key(0), shape, jnp.float32, 0.2, 1.0)
    nbytes = 2 * x.size * 4  # read + write
    fwd = jax.jit(sumcumprod)
    copy = jax.jit(lambda v: v * 1.0 + 0.0)
    grad = jax.jit(jax.grad(lambda v: jnp.sum(sumcumprod(v))))
    scan = jax.jit(sumcumprod_reference)
    got, ref = fwd(x), scan(x)
    assert jnp.allclose(got, ref, rtol=1e-4, atol=1e-6), "GPU result differs from the reference"
    tf, tc, tg, ts = med(fwd, x), med(copy, x), med(grad, x), med(scan, x)
    print(f"{shape}: forward {tf*1e3:.3f} ms ({nbytes/tf/1e9:.0f} GB/s) | device copy {tc*1e3:.3f} ms "
          f"({nbytes/tc/1e9:.0f} GB/s) | forward/copy {tf/tc:.2f} | grad/copy {tg/tc:.2f} | "
          f"associative scan/forward {ts/tf:.1f}")
    if shape == (16384, 16384):
        result = tc / tf
print(f"RESULT sumcumprod_gpu_bandwidth_fraction {result:.3f}")
PY
); }
export -f bandwidth
stage bandwidth 90 bandwidth

cat > /tmp/eqgp_memcheck.py <<'PY'
import jax
jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp
from eqgp.ops import linear_recurrence, sumcumprod
for shape in [(3, 5), (7, 300), (2, 3000), (1, 0), (0, 4), (5000,)]:
    for dt in (jnp.float32, jnp.float64):
        a = jax.random.uniform(jax.random.key(0), shape, dt, 0.2, 1.0)
        for rev in (True, False):
            jax.block_until_ready(linear_recurrence(a, a, reverse=rev))
        jax.block_until_ready(jax.grad(lambda v: jnp.sum(sumcumprod(v)))(a))  # J^T t (scratch z)
        jax.block_until_ready(jax.jvp(sumcumprod, (a,), (a,)))  # J t
print("memcheck workload done")
PY
memcheck() {
  set -o pipefail
  (cd /tmp && for tool in memcheck racecheck synccheck; do  # out-of-bounds, shared-memory races, barriers
    echo "--- $tool"; compute-sanitizer --tool $tool --error-exitcode 3 $PY /tmp/eqgp_memcheck.py 2>&1 | tail -8 || exit 3
  done)
}
export -f memcheck
stage memcheck 180 memcheck

stage solver-tests 120 pytest_gpu -n 8 "$T/test_covariance.py" "$T/test_solvers.py" "$T/test_structured.py"
stage rest-of-suite 200 pytest_gpu -n 12 "$T" --ignore="$T/test_docs.py" --ignore="$T/test_ops.py" \
  --ignore="$T/test_nn.py" --ignore="$T/test_linalg.py" --ignore="$T/test_covariance.py" \
  --ignore="$T/test_solvers.py" --ignore="$T/test_structured.py"
B=$PWD/benchmarks
stage derivative-gram 120 bash -c "cd /tmp && $PY $B/derivative_gram.py"
stage gp-likelihood 120 bash -c "cd /tmp && $PY $B/gp_likelihood.py"
stage matrix-free 150 bash -c "cd /tmp && $PY $B/matrix_free.py"
stage multistart 90 bash -c "cd /tmp && $PY $B/multistart.py"
echo "=== summary ==="
echo "$SUMMARY"
grep '^RESULT' "$LOG" || true
