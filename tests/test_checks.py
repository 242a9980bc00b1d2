"""Trace-time validation (`eqgp._checks`) and the catalogue of invalid inputs with eqgp's own
messages: the suite runs under jaxtyping's import hook, whose beartype checks speak first for
annotated arguments, so the catalogue is also run once in a process without the hook."""

import pathlib
import subprocess
import sys
import textwrap
import warnings

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from eqgp._checks import as_points, check_same_dtype


def test_as_points_converts_lists_and_keeps_float_arrays():
    X = as_points("X", [[0.0, 1.0], [2.0, 3.0]])
    assert X.shape == (2, 2) and X.dtype == jnp.float64
    Y = as_points("Y", np.ones((0, 3), np.float32), dim=3)  # no rows is fine
    assert Y.shape == (0, 3) and Y.dtype == jnp.float32


@pytest.mark.parametrize(
    "value, dim, error, message",
    [
        (np.ones((3, 2), np.int32), None, TypeError, r"`Z` must be a floating-point array .* got dtype int32"),
        (np.ones((3, 2), np.float16), None, TypeError, r"`Z` has dtype float16; .* float32 or float64"),
        (np.ones(3), None, ValueError, r"`Z` must have shape \(N, D\); got shape \(3,\)\. .* `Z\[:, None\]`"),
        (np.ones((1, 2, 3)), None, ValueError, r"`Z` must have shape \(N, D\); got shape \(1, 2, 3\)\.$"),
        (np.ones((3, 2)), 4, ValueError, r"`Z` has 2 input dimensions \(shape \(3, 2\)\) but 4 were expected"),
        (object(), None, TypeError, r"`Z` must be .* of shape \(N, D\)"),
    ],
)
def test_as_points_names_the_argument_and_what_was_given(value, dim, error, message):
    with pytest.raises(error, match=message):
        as_points("Z", value, dim)


def test_check_same_dtype_lists_every_dtype():
    check_same_dtype(a=jnp.ones(2), b=jnp.zeros(3))
    with pytest.raises(TypeError, match="a: float64, b: float32"):
        check_same_dtype(a=jnp.ones(2), b=jnp.zeros(3, jnp.float32))


_RUNNER = textwrap.dedent(
    """
    import re, sys
    import jax
    jax.config.update("jax_enable_x64", True)
    jax.config.update("jax_numpy_dtype_promotion", "strict")
    sys.path.insert(0, sys.argv[1])
    from invalid_cases import invalid_cases
    import eqgp._gp  # not instrumented: no jaxtyping import hook in this process
    assert "jaxtyping" not in vars(eqgp._gp), "the jaxtyping hook is active"
    bad = []
    cases = invalid_cases()
    for name, fn, pattern in cases:
        try:
            fn()
        except Exception as e:  # noqa: BLE001
            text = str(e)
            if not re.search(pattern, text):
                bad.append(f"{name}: {type(e).__name__}: {text[:300]}")
        else:
            bad.append(f"{name}: no error")
    print("CASES", len(cases))
    print("\\n".join(bad))
    """
)


def test_every_invalid_input_gets_eqgps_own_message_without_the_jaxtyping_hook():
    tests = str(pathlib.Path(__file__).parent)
    out = subprocess.run([sys.executable, "-c", _RUNNER, tests], capture_output=True, text=True, timeout=600, cwd=tests)
    assert out.returncode == 0, out.stderr[-3000:]
    head, _, failures = out.stdout.partition("\n")
    assert int(head.split()[1]) >= 150
    assert failures.strip() == "", failures


# Misuse that must not be silent (tests/misuse_cases.py): each case raises or warns.


def _misuse():
    sys.path.insert(0, str(pathlib.Path(__file__).parent))
    from misuse_cases import misuse_cases

    return misuse_cases()


_MISUSE = _misuse()


def test_the_misuse_catalogue_has_40_distinct_cases():
    assert len({name for name, _ in _MISUSE}) == len(_MISUSE) >= 40


@pytest.mark.parametrize("index", range(len(_MISUSE)), ids=[name for name, _ in _MISUSE])
def test_misuse_is_never_silent(index):
    name, fn = _MISUSE[index]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            jax.block_until_ready(eqx.filter(fn(), eqx.is_array))
        except Exception:  # noqa: BLE001 - an error of any kind is what is asked
            return
    assert caught, f"{name}: returned without an error or a warning"
