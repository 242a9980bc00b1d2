#!/usr/bin/env bash
# One-shot GPU check for a machine with an NVIDIA GPU and no network (jax[cuda], equinox,
# jaxtyping, optax, pybind11, scikit-build-core, cmake, nvcc preinstalled). Run from the
# repository root: bash benchmarks/gpu_check.sh
#  1. builds eqgp with the CUDA handlers (no build isolation: uses what is installed),
#  2. runs the op and linear-algebra tests with JAX on the GPU,
#  3. compute-sanitizer memcheck on a small case (both directions, both row paths),
#  4. benchmarks (16384, 16384) float32: native forward vs a device copy (bandwidth).
set -euo pipefail
cd "$(dirname "$0")/.."
nvidia-smi --query-gpu=name,memory.total --format=csv || true
EQGP_CUDA=ON pip install --no-build-isolation --no-deps --quiet .
python - <<'PY'
import jax, eqgp
print("devices:", jax.devices(), "native platforms:", eqgp.ops.NATIVE_PLATFORMS)
assert jax.default_backend() == "gpu", "JAX does not see the GPU"
assert "cuda" in eqgp.ops.NATIVE_PLATFORMS, "CUDA handlers not built/loaded"
PY
python -m pytest -q -x tests/test_ops.py tests/test_nn.py tests/test_linalg.py -p no:cacheprovider
cat > /tmp/eqgp_memcheck.py <<'PY'
import jax
jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp
from eqgp.ops import linear_recurrence, sumcumprod
for shape in [(3, 5), (7, 300), (2, 3000), (1, 0)]:
    for dt in (jnp.float32, jnp.float64):
        a = jax.random.uniform(jax.random.key(0), shape, dt, 0.2, 1.0)
        for rev in (True, False):
            jax.block_until_ready(linear_recurrence(a, a, reverse=rev))
        jax.block_until_ready(jax.grad(lambda v: jnp.sum(sumcumprod(v)))(a))  # J^T t (scratch z)
        jax.block_until_ready(jax.jvp(sumcumprod, (a,), (a,)))  # J t
print("memcheck workload done")
PY
XLA_PYTHON_CLIENT_PREALLOCATE=false compute-sanitizer --tool memcheck --leak-check no \
  python /tmp/eqgp_memcheck.py 2>&1 | tail -5
python - <<'PY'
import statistics, time
import jax, jax.numpy as jnp
from eqgp.ops import sumcumprod, sumcumprod_reference

def med(fn, x, n=20):
    jax.block_until_ready(fn(x)); jax.block_until_ready(fn(x))
    ts = []
    for _ in range(n):
        t0 = time.perf_counter(); jax.block_until_ready(fn(x)); ts.append(time.perf_counter() - t0)
    return statistics.median(ts)

for shape in [(16384, 16384), (4096, 4096), (1 << 20, 64), (16, 1 << 22)]:
    x = jax.random.uniform(jax.random.key(0), shape, jnp.float32, 0.2, 1.0)
    nbytes = 2 * x.size * 4  # read + write
    fwd = jax.jit(sumcumprod)
    copy = jax.jit(lambda v: v * 1.0 + 0.0)
    grad = jax.jit(jax.grad(lambda v: jnp.sum(sumcumprod(v))))
    ref = sumcumprod_reference(x[:8])
    assert jnp.allclose(fwd(x)[:8], ref, rtol=1e-4), "GPU result differs from the reference"
    tf, tc, tg = med(fwd, x), med(copy, x), med(grad, x)
    print(f"{shape}: forward {tf*1e3:.3f} ms ({nbytes/tf/1e9:.0f} GB/s) | device copy {tc*1e3:.3f} ms "
          f"({nbytes/tc/1e9:.0f} GB/s) | forward bandwidth = {tc/tf*100:.0f}% of copy | grad {tg*1e3:.3f} ms")
    if shape == (16384, 16384):
        result = tc / tf
print(f"RESULT sumcumprod_gpu_bandwidth_fraction {result:.3f}")
PY
# The matrix-free solver on the GPU: the covariance/solver tests, then the benchmark with the
# >= 1e6-row cases (D = 10 000 gradient observations at N = 100, exact by StructuredGradients and
# stochastic by ConjugateGradient) and the 100 000-row likelihood.
python -m pytest -q -x tests/test_covariance.py tests/test_solvers.py tests/test_structured.py -p no:cacheprovider
python benchmarks/matrix_free.py --large
