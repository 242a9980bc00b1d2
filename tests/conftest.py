import os

import jax
import pytest

jax.config.update("jax_enable_x64", True)
jax.config.update("jax_numpy_rank_promotion", "raise")
jax.config.update("jax_numpy_dtype_promotion", "strict")


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
