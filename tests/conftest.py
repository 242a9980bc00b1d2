import os

# The suite is compile-bound (hundreds of small XLA programs, a few large ones): LLVM's
# backend optimisation is switched off for the tests (~30 % less compile time; the same HLO
# runs, as less optimised machine code). Set before jax starts its backend; an explicit
# level in the caller's XLA_FLAGS wins. Benchmarks and examples run with XLA's defaults.
if "--xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_backend_optimization_level=0").strip()

import jax  # noqa: E402
import pytest  # noqa: E402

jax.config.update("jax_enable_x64", True)
jax.config.update("jax_numpy_rank_promotion", "raise")
jax.config.update("jax_numpy_dtype_promotion", "strict")
if jax.default_backend() == "gpu":
    # JAX's default float32 products on a GPU are TF32: the tests' own references (K @ v, ...)
    # must be exact. eqgp's products are full precision by themselves, which test_jit checks
    # on CPU (there this setting would make that check vacuous).
    jax.config.update("jax_default_matmul_precision", "highest")


@pytest.fixture
def getkey():
    keys = iter(jax.random.split(jax.random.key(0), 1000))
    return lambda: next(keys)


# Hypothesis: a quick profile for CI (the default) and a long one for local runs:
# HYPOTHESIS_PROFILE=long pytest tests/test_properties.py  (ten times the examples).
# The tests scale their example counts by max_examples / 100.
from hypothesis import settings  # noqa: E402

settings.register_profile("ci", max_examples=100, deadline=None, derandomize=True)
settings.register_profile("long", max_examples=1000, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
