import os

import jax
import pytest

jax.config.update("jax_enable_x64", True)
jax.config.update("jax_numpy_rank_promotion", "raise")
jax.config.update("jax_numpy_dtype_promotion", "strict")
if jax.default_backend() == "gpu":
    # JAX's default float32 products on a GPU are TF32: the tests' own references (K @ v, ...)
    # must be exact. eqgp's products are full precision by themselves, which test_jit checks
    # on CPU (there this setting would make that check vacuous).
    jax.config.update("jax_default_matmul_precision", "highest")


def pytest_sessionstart(session):
    # The build is checked once, before any test: without the native extension every op test
    # would fail on its own, far from the cause.
    from eqgp import _native

    missing = []
    if "cpu" not in _native.BUILT_PLATFORMS:
        missing.append("the CPU module `eqgp._native_cpu` (reinstall: `pip install .`)")
    elif not _native.HAVE_NATIVE_INVERSE:
        missing.append("LAPACK ?potri from scipy (`pip install scipy`)")
    if missing:
        pytest.exit(f"eqgp is not fully built: missing {'; '.join(missing)}.", returncode=3)


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
settings.register_profile("dev", max_examples=10, deadline=None)  # a quick local run: a tenth of the examples
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
