# ruff: noqa: E501 -- the catalogue of invalid cases reads best one case per line
"""Property-based tests (hypothesis) of the public entry points.

Profiles (tests/conftest.py): `ci` (default; the counts below) and `long`
(`HYPOTHESIS_PROFILE=long pytest tests/test_properties.py`, ten times as many examples).

- `sumcumprod` (1 010 examples under ci: 836 + 150 + 24): random ranks 1-4, last-axis lengths 0-70, float32/float64, non-contiguous
  layouts, zeros, negatives, inf and NaN, under jit / vmap over any axis / nested vmap /
  jvp / grad / jacfwd / jacrev, against an independent float64 numpy recurrence.
- The GP API: random kernels, observation groups (any operator the kernel's smoothness
  allows, empty groups included) and D, against a dense reference built from the kernel's
  derivative "jet" by nested `jax.jacfwd` alone (no eqgp operator code), for the gram, the
  matrix-free product and the exact NLML; random invalid inputs must raise an error that
  names the offending argument.
- Every kernel and composite: gradient grams symmetric PSD, derivative blocks within 1e-6
  of central finite differences at random and coincident points.
"""

import itertools
import math
import re

import equinox as eqx
import jax
import jax.numpy as jnp
import jaxtyping
import numpy as np
import pytest
from helpers import ALL_KERNELS, fd_cross_cov
from hypothesis import HealthCheck, given, settings, strategies as st
from invalid_cases import invalid_cases

import eqgp
from eqgp import kernels
from eqgp.ops import sumcumprod, sumcumprod_reference

SCALE = settings().max_examples / 100  # 1 under the ci profile, 10 under long


def examples(n: int):
    return settings(
        max_examples=max(1, int(n * SCALE)),
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


# ---------------------------------------------------------------------------------------
# sumcumprod


def _recurrence(x: np.ndarray, axis: int, reverse: bool) -> np.ndarray:
    """z_i = x_i z_{i+1} + x_i (reverse) in float64 numpy, with the op's operation order
    (so NaN/inf land where the op's do), and the same recurrence on |x| (an error bound)."""
    xm = np.moveaxis(np.asarray(x, np.float64), axis, -1)
    z = np.zeros_like(xm)
    bound = np.zeros_like(xm)
    acc = np.zeros(xm.shape[:-1])
    accb = np.zeros(xm.shape[:-1])
    n = xm.shape[-1]
    with np.errstate(all="ignore"):
        for i in range(n - 1, -1, -1) if reverse else range(n):
            acc = xm[..., i] * acc + xm[..., i]
            accb = np.abs(xm[..., i]) * accb + np.abs(xm[..., i])
            z[..., i], bound[..., i] = acc, accb
    return np.moveaxis(z, -1, axis), np.moveaxis(bound, -1, axis)


def _check_same(got, want, bound, dtype, n):
    got = np.asarray(got, np.float64)
    finite = np.isfinite(want)
    if jax.default_backend() == "cpu":  # a sequential recurrence per row, as the reference
        assert np.array_equal(np.isnan(got), np.isnan(want)), "NaN in different places"
        assert np.array_equal(got[np.isinf(want)], want[np.isinf(want)]), "inf in different places"
    else:  # a parallel scan: products of inf and 0 come in another order (NaN or inf)
        assert np.array_equal(np.isfinite(got), finite), "non-finite values in different places"
    eps = np.finfo(dtype).eps
    tol = 8 * (n + 2) * eps * np.where(np.isfinite(bound), bound, 0.0) + np.finfo(dtype).tiny
    err = np.abs(got[finite] - want[finite])
    assert np.all(err <= tol[finite]), float(np.max(err - tol[finite], initial=0.0))


_SPECIAL = [0.0, -0.0, 1.0, -1.0, np.inf, -np.inf, np.nan]


@st.composite
def _arrays(draw, finite: bool = False, max_len: int = 70, max_rank: int = 4):
    dtype = draw(st.sampled_from([np.float32, np.float64]))
    rank = draw(st.integers(1, max_rank))
    lead = draw(st.lists(st.integers(0, 4), min_size=rank - 1, max_size=rank - 1))
    n = draw(st.integers(0, max_len))
    shape = (*lead, n)
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    x = rng.uniform(-1.3, 1.3, shape)
    if not finite and x.size and draw(st.booleans()):
        mask = rng.random(shape) < 0.1
        x[mask] = rng.choice(_SPECIAL, size=int(mask.sum()))
    elif x.size and draw(st.booleans()):
        x[rng.random(shape) < 0.1] = 0.0
    layout = draw(st.sampled_from(["contiguous", "transposed", "strided", "broadcast"]))
    return x.astype(dtype), layout


def _laid_out(x: np.ndarray, layout: str):
    """The same values as `x`, reached through a non-contiguous view inside the jit."""
    if layout == "transposed":
        return jax.device_put(np.ascontiguousarray(np.swapaxes(x, 0, -1))), lambda v: jnp.swapaxes(v, 0, -1)
    if layout == "strided":
        big = np.repeat(x, 2, axis=-1)
        return jax.device_put(big), lambda v: v[..., ::2]
    if layout == "broadcast" and x.ndim >= 2:
        return jax.device_put(x[:1]), lambda v: jnp.broadcast_to(v, x.shape)
    return jax.device_put(x), lambda v: v


@pytest.mark.slow  # ~25 s on 2 cores: CI's slow stage (keeps the main suite near 5 min)
@examples(836)
@given(data=_arrays(), reverse=st.booleans(), how=st.sampled_from(["eager", "jit", "vmap", "vmap2"]))
def test_sumcumprod_matches_the_recurrence(data, reverse, how):
    x, layout = data
    if layout == "broadcast" and x.ndim >= 2:
        x = np.broadcast_to(x[:1], x.shape).copy()
    n = x.shape[-1]
    want, bound = _recurrence(x, -1, reverse)
    arg, view = _laid_out(x, layout)
    op = lambda v: sumcumprod(view(v), reverse=reverse)  # noqa: E731
    if how == "eager":
        got = sumcumprod(jax.device_put(x), reverse=reverse)
    elif how == "jit":
        got = jax.jit(op)(arg)
    elif x.ndim >= 2 and how == "vmap":  # over any axis, the last included
        ax = int(np.random.default_rng(x.size).integers(0, x.ndim))
        got = jax.vmap(lambda r: sumcumprod(r, reverse=reverse), in_axes=ax, out_axes=ax)(jax.device_put(x))
        if ax == x.ndim - 1:  # each slice's last axis is then the original second-to-last
            want, bound = _recurrence(x, x.ndim - 2, reverse)
            n = x.shape[-2]
    elif x.ndim >= 3 and how == "vmap2":
        got = jax.vmap(jax.vmap(lambda r: sumcumprod(r, reverse=reverse)))(jax.device_put(x))
    else:
        got = jax.jit(op)(arg)
    assert got.dtype == x.dtype and got.shape == x.shape
    _check_same(got, want, bound, x.dtype, n)


@examples(150)
@given(data=_arrays(finite=True, max_len=12, max_rank=3), axis=st.integers(-3, 2), reverse=st.booleans())
def test_sumcumprod_axis_matches_the_recurrence(data, axis, reverse):
    x, _ = data
    if not -x.ndim <= axis < x.ndim:
        with pytest.raises(ValueError, match="`axis`"):
            sumcumprod(jax.device_put(x), axis=axis)
        return
    want, bound = _recurrence(x, axis, reverse)
    _check_same(sumcumprod(jax.device_put(x), axis=axis, reverse=reverse), want, bound, x.dtype, x.shape[axis])


@examples(24)
@given(
    data=_arrays(finite=True, max_len=9, max_rank=2),
    reverse=st.booleans(),
    seed=st.integers(0, 2**31 - 1),
    how=st.sampled_from(["jvp", "grad", "jacfwd", "jacrev"]),
)
def test_sumcumprod_derivatives_match_the_reference(data, reverse, seed, how):
    x, _ = data
    x = jax.device_put(x)
    ops = lambda v: sumcumprod(v, reverse=reverse)  # noqa: E731
    ref = lambda v: sumcumprod_reference(v, reverse=reverse)  # noqa: E731
    t = jax.random.normal(jax.random.key(seed), x.shape, x.dtype)
    rtol, atol = (2e-4, 2e-4) if x.dtype == jnp.float32 else (1e-10, 1e-11)
    transform = {
        "jvp": lambda f: lambda x: jax.jvp(f, (x,), (t,))[1],
        "grad": lambda f: jax.grad(lambda v: jnp.sum(jnp.sin(f(v)))),
        "jacfwd": jax.jacfwd,
        "jacrev": jax.jacrev,
    }[how]
    got, want = transform(ops)(x), jax.jit(transform(ref))(x)  # the reference compiled (eager it is slow)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=rtol, atol=atol)


# ---------------------------------------------------------------------------------------
# The GP API against an independent dense reference


@eqx.filter_jit
def _jet(kernel, x1, x2):
    """Covariances of [f, grad f, vec(hess f)] at x1 with the same at x2: nested jacfwd
    of the scalar kernel only, shape (1 + D + D^2, 1 + D + D^2)."""
    D = x1.shape[0]

    def up_to_second(g, x):  # g: (D,) -> (...); returns [g, dg, d2g] stacked on axis 0
        val = g(x)
        d1 = jax.jacfwd(g)(x)
        d2 = jax.jacfwd(jax.jacfwd(g))(x)
        v = val.reshape(1, -1)
        return jnp.concatenate(
            [v, jnp.moveaxis(d1, -1, 0).reshape(D, -1), jnp.moveaxis(d2, (-2, -1), (0, 1)).reshape(D * D, -1)]
        )

    inner = lambda a: up_to_second(lambda b: kernel(a, b)[None], x2)[:, 0]  # noqa: E731
    return up_to_second(inner, x1)


def _selection(op, D):
    """The rows of the jet an operator takes: a (P, 1 + D + D^2) matrix."""
    J = 1 + D + D * D
    E = np.eye(J)
    if isinstance(op, eqgp.Value):
        return E[:1]
    if isinstance(op, eqgp.Gradient):
        return E[1 : 1 + D]
    if isinstance(op, eqgp.ValueAndGradient):
        return E[: 1 + D]
    if isinstance(op, eqgp.Partial):
        return E[[1 + d for d in op.dims]]
    if isinstance(op, eqgp.Directional):
        S = np.zeros((op.directions.shape[0], J))
        S[:, 1 : 1 + D] = np.asarray(op.directions)
        return S
    if isinstance(op, eqgp.Hessian):
        I, K = op.pairs(D)
        return E[[1 + D + i * D + k for i, k in zip(I, K)]]
    raise AssertionError(op)


def _dense_reference(kernel, groups):
    blocks = []
    for op1, X1 in groups:
        row = []
        for op2, X2 in groups:
            D = X1.shape[1]
            S1, S2 = _selection(op1, D), _selection(op2, D)
            B = np.zeros((S1.shape[0], X1.shape[0], S2.shape[0], X2.shape[0]))
            for i, j in itertools.product(range(X1.shape[0]), range(X2.shape[0])):
                B[:, i, :, j] = S1 @ np.asarray(_jet(kernel, X1[i], X2[j])) @ S2.T
            row.append(B.reshape(S1.shape[0] * X1.shape[0], S2.shape[0] * X2.shape[0]))
        blocks.append(np.concatenate(row, axis=1))
    return np.concatenate(blocks, axis=0)


_GP_KERNELS = {
    "rbf": lambda D: kernels.RBF(np.linspace(0.7, 1.3, D)),
    "m32": lambda D: kernels.Matern32(1.1),
    "m52": lambda D: kernels.Matern52(np.linspace(0.8, 1.2, D), variance=0.7),
    "rq": lambda D: kernels.RationalQuadratic(0.9, alpha=1.5),
    "sum": lambda D: kernels.RBF(1.0) + 0.5 * kernels.Matern52(1.4),
    "product": lambda D: kernels.RBF(1.2) * kernels.Periodic(1.0, period=2.5),
    "active": lambda D: kernels.ActiveDims(kernels.RBF(0.8), [D - 1]),
}


@st.composite
def _problem(draw):
    D = draw(st.integers(1, 3))
    name = draw(st.sampled_from(sorted(_GP_KERNELS)))
    kernel = _GP_KERNELS[name](D)
    ops = [eqgp.Value(), eqgp.Gradient(), eqgp.ValueAndGradient()]
    ops.append(eqgp.Partial(draw(st.permutations(range(D)))[: draw(st.integers(1, D))]))
    direction = st.lists(st.floats(-1, 1), min_size=D, max_size=D).filter(lambda v: np.linalg.norm(v) > 0.1)
    ops.append(eqgp.Directional(np.asarray(draw(direction))))  # zero directions are refused (tests/invalid_cases.py)
    if kernel.smoothness >= 2:
        ops += [eqgp.Hessian(), eqgp.Hessian(diagonal=True)]
    seed = draw(st.integers(0, 2**31 - 1))
    rng = np.random.default_rng(seed)
    groups = []
    for _ in range(draw(st.integers(1, 3))):
        op = draw(st.sampled_from(ops))
        N = draw(st.integers(0, 3))
        X = rng.uniform(-1.5, 1.5, (N, D))
        if N and groups and draw(st.booleans()) and groups[0][1].shape[0]:  # a coincident point
            X[0] = groups[0][1][0]
        groups.append((op, X))
    if all(X.shape[0] == 0 for _, X in groups):
        groups.append((eqgp.Value(), rng.uniform(-1.5, 1.5, (1, D))))
    return kernel, groups, seed


@pytest.mark.slow  # ~27s on 2 cores: CI's slow stage
@examples(5)
@given(problem=_problem())
def test_gp_api_matches_the_dense_reference(problem):
    kernel, groups, seed = problem
    groups = [(op, jnp.asarray(X)) for op, X in groups]
    ref = _dense_reference(kernel, groups)
    K = eqgp.operator_gram(kernel, groups, groups)
    np.testing.assert_allclose(np.asarray(K), ref, rtol=1e-9, atol=1e-11)
    rng = np.random.default_rng(seed + 1)
    R = ref.shape[0]
    targets = [
        rng.normal(size=(X.shape[0], op.size(X.shape[1]))) if op.size(X.shape[1]) > 1 else rng.normal(size=X.shape[0])
        for op, X in groups
    ]
    obs = eqgp.Observations(*[(op, X, jnp.asarray(t)) for (op, X), t in zip(groups, targets)])
    noise = 0.3
    gp = eqgp.GaussianProcess(kernel, noise=noise, noise_floor=0.0)
    A = ref + noise * np.eye(R)
    y = np.asarray(obs.flat_targets())
    sign, logdet = np.linalg.slogdet(A)
    want = -0.5 * (y @ np.linalg.solve(A, y) + logdet + R * math.log(2 * math.pi))
    np.testing.assert_allclose(float(gp.log_marginal_likelihood(obs)), want, rtol=1e-9)
    cov = eqgp.Covariance(kernel, tuple(groups), jnp.full((R,), noise))
    v = rng.normal(size=R)
    np.testing.assert_allclose(np.asarray(cov.mv(jnp.asarray(v))), A @ v, rtol=1e-9, atol=1e-10)


# Invalid inputs: the catalogue of tests/invalid_cases.py (eqgp's own messages are pinned,
# without the jaxtyping hook, by tests/test_checks.py).

_CASES = invalid_cases()


def test_the_catalogue_has_150_distinct_invalid_cases():
    assert len({name for name, _, _ in _CASES}) == len(_CASES) >= 150


@examples(len(_CASES))
@given(index=st.sampled_from(range(len(_CASES))))
def test_invalid_inputs_raise_errors_naming_the_argument(index):
    name, fn, pattern = _CASES[index]
    with pytest.raises(Exception) as info:  # noqa: PT011 - the message is what is checked
        fn()
    text = str(info.value)
    if isinstance(info.value, jaxtyping.TypeCheckError):  # the suite's beartype hook spoke first:
        hooked = re.search(r"parameter '(\w+)'", text)  # it must name the same argument
        assert hooked and hooked.group(1) in pattern, f"{name}: {text[:400]}"
        return
    assert re.search(pattern, text), f"{name}: {type(info.value).__name__}: {text[:400]}"


# ---------------------------------------------------------------------------------------
# Every kernel and composite


@examples(100)
@given(
    name=st.sampled_from(sorted(set(ALL_KERNELS) - {"m12", "white"})),
    seed=st.integers(0, 2**31 - 1),
    coincident=st.booleans(),
)
def test_kernels_gradient_grams_are_psd_and_match_finite_differences(name, seed, coincident):
    kernel = ALL_KERNELS[name]()
    rng = np.random.default_rng(seed)
    X = rng.uniform(-1.5, 1.5, (4, 3))
    G = np.asarray(eqgp.gradient_gram(kernel, jnp.asarray(X), jnp.asarray(X)))
    np.testing.assert_allclose(G, G.T, rtol=1e-10, atol=1e-12)
    ev = np.linalg.eigvalsh(G)
    assert ev.min() >= -1e-8 * max(ev.max(), 1.0)
    x1 = X[0]
    x2 = X[0].copy() if coincident else X[1]
    blocks = np.asarray(eqgp.gradient_gram(kernel, jnp.asarray(x1[None]), jnp.asarray(x2[None]), layout="interleaved"))
    # A once-differentiable process (Matérn-3/2) has a cusp in d2k/dx1dx2 at r = 0, where
    # central differences converge only at O(step) = 1e-4 (its exact value there is checked
    # against the closed form 3 / l^2 in test_gram).
    tol = 2e-3 if coincident and kernel.smoothness < 2 else 1e-6
    np.testing.assert_allclose(blocks, fd_cross_cov(kernel, x1, x2), rtol=tol, atol=tol)


# ---------------------------------------------------------------------------------------
# The solvers agree: on the same random valid problem (kernels, operators, groups incl. empty
# ones, coincident points, the three noise layouts) every solver gives Cholesky's likelihood
# within its tolerance (posteriors: tests/test_solvers.py, tests/test_structured.py), or refuses the problem with its own
# clear error (StructuredGradients' domain: one gradient group, a stationary kernel).

_STRUCTURED_REFUSALS = (
    r"eqgp.StructuredGradients needs|kernel \w+ is only \d+ time|a noise that is the same|StructuredGradients"
)


def _noise(layout, groups, D, rng):
    if layout == "scalar":
        return 0.2
    if layout == "per_group":
        return [float(rng.uniform(0.1, 0.4)) for _ in groups]
    return [rng.uniform(0.1, 0.4, op.size(D)) if op.size(D) > 1 else float(rng.uniform(0.1, 0.4)) for op, _ in groups]


@pytest.mark.slow  # ~100 compiled problems: CI's slow stage
@examples(100)
@given(problem=_problem(), layout=st.sampled_from(["scalar", "per_group", "per_output"]))
def test_every_solver_agrees_with_cholesky_or_refuses_clearly(problem, layout):
    kernel, groups, seed = problem
    rng = np.random.default_rng(seed + 2)
    D = groups[0][1].shape[1]
    obs = eqgp.Observations(
        *[
            (
                op,
                jnp.asarray(X),
                jnp.asarray(rng.normal(size=(X.shape[0], op.size(D)) if op.size(D) > 1 else X.shape[0])),
            )
            for op, X in groups
        ]
    )
    noise = _noise(layout, groups, D, rng)

    def answers(solver):  # the likelihood holds both a solve (y^T K^-1 y) and the log-determinant
        gp = eqgp.GaussianProcess(kernel, mean=0.1, noise=noise, noise_floor=0.0, solver=solver)
        return (gp.log_marginal_likelihood(obs),)

    want = answers(eqgp.Cholesky())
    # CG with a preconditioner of rank >= the number of rows (every problem here): exact up to
    # its residual; its stochastic log-determinant is checked in tests/test_solvers.py.
    got = answers(eqgp.ConjugateGradient(rtol=1e-10, preconditioner_rank=128))
    for g, w in zip(got, want):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-5, atol=1e-7)
    try:
        got = answers(eqgp.StructuredGradients())
    except (TypeError, ValueError) as e:
        assert re.search(_STRUCTURED_REFUSALS, str(e)), str(e)
    else:
        for g, w in zip(got, want):
            np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-7, atol=1e-9)
