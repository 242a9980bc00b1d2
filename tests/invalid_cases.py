# ruff: noqa: E501 -- the catalogue of invalid cases reads best one case per line
"""A catalogue of invalid inputs: mutations of a valid problem. Each case must raise an error
whose message matches its pattern (eqgp's own message, naming the offending argument).
Run with the jaxtyping hook by test_properties and without it by test_checks."""

import itertools

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax

import eqgp
from eqgp import kernels
from eqgp.ops import sumcumprod


def _valid(D=2, N=4):
    X = np.random.default_rng(0).uniform(-1, 1, (N, D))
    return X, np.sin(X[:, 0]), np.cos(X)


def invalid_cases():
    cases = []
    X, y, G = _valid()
    # Points: rank, dtype, D mismatch.
    for shape in [(), (4,), (4, 2, 1), (1, 4, 2)]:
        cases.append((f"X shape {shape}", lambda s=shape: eqgp.Observations.values(np.ones(s), y), r"`X`"))
    for dt in [np.int32, np.int64, np.bool_, np.complex64, np.float16, jnp.bfloat16]:
        cases.append(
            (
                f"X dtype {np.dtype(dt).name}",
                lambda dt=dt: eqgp.Observations.values(jnp.asarray(X).astype(dt), y),
                r"`X`",
            )
        )
    for d in [1, 3, 5]:
        Z = np.ones((3, d))
        cases.append(
            (
                f"group D {d}",
                lambda Z=Z: eqgp.Observations((eqgp.Value(), X, y), (eqgp.Value(), Z, np.ones(3))),
                r"dimension|`X`",
            )
        )
    # Targets: every wrong shape around the right one, per operator.
    for op, P in [(eqgp.Value(), 1), (eqgp.Gradient(), 2), (eqgp.ValueAndGradient(), 3), (eqgp.Hessian(), 3)]:
        for shape in [
            (3,),
            (5,),
            (4, P + 1),
            (4, P - 1) if P > 1 else (4, 3),
            (4, P, 1),
            (),
            (P, 4) if P != 4 else (5, 4),
        ]:
            if shape in [(4, P)] or (P == 1 and shape == (4,)):
                continue
            cases.append(
                (
                    f"targets {type(op).__name__} {shape}",
                    lambda op=op, s=shape: eqgp.ObservationGroup(op, X, np.ones(s)),
                    r"`targets`",
                )
            )
        for dt in [np.int32, np.complex64]:
            cases.append(
                (
                    f"targets dtype {np.dtype(dt).name} {type(op).__name__}",
                    lambda op=op, dt=dt, P=P: eqgp.ObservationGroup(op, X, np.ones((4, P) if P > 1 else (4,), dt)),
                    r"`targets`",
                )
            )
    # Partial dims out of range / invalid; Directional of the wrong dimension.
    for dims in [(2,), (0, 2), (5,), (3, 1)]:
        cases.append(
            (
                f"Partial{dims} in D=2",
                lambda dims=dims: eqgp.ObservationGroup(eqgp.Partial(dims), X, np.ones((4, len(dims)))),
                r"dimension",
            )
        )
    for dims in [(-1,), (0, 0), (), (1.5,)]:
        cases.append((f"Partial{dims}", lambda dims=dims: eqgp.Partial(dims), r"`dims`"))
    for v in [np.ones(3), np.ones((2, 3)), np.ones(1)]:
        cases.append(
            (
                f"Directional {v.shape} in D=2",
                lambda v=v: eqgp.ObservationGroup(eqgp.Directional(v), X, np.ones(4)),
                r"dimension",
            )
        )
    cases.append(("Directional rank 3", lambda: eqgp.Directional(np.ones((1, 2, 2))), r"`v`"))
    # Known noise of a group: shape, sign, NaN/inf.
    for n in [np.ones(2), np.ones((4,)), np.ones((1, 3)), -1.0, np.nan, np.inf, [0.1, -0.1, 0.1]]:
        cases.append(
            (
                f"group noise {n!r}",
                lambda n=n: eqgp.ObservationGroup(eqgp.ValueAndGradient(), X, np.ones((4, 3)), noise=n),
                r"`noise`",
            )
        )
    # Model noise: values and shapes.
    for n in [0.0, -1e-3, np.nan, np.inf, np.ones((2, 2)), "a", []]:
        cases.append((f"model noise {n!r}", lambda n=n: eqgp.GaussianProcess(kernels.RBF(), noise=n), r"`noise"))
    for n in [[np.ones(4)], [0.1, 0.2]]:
        cases.append(
            (
                f"noise entries {len(n)} vs groups",
                lambda n=n: eqgp.GaussianProcess(kernels.RBF(), noise=n).log_marginal_likelihood(
                    eqgp.Observations.values_and_gradients(X, y, G)
                ),
                r"noise",
            )
        )
    for f in [-1.0, np.nan, "x"]:
        cases.append(
            (f"noise_floor {f!r}", lambda f=f: eqgp.GaussianProcess(kernels.RBF(), noise_floor=f), r"`noise_floor`")
        )
    # Hyper-parameters of every kernel: zero, negative, NaN, inf, wrong rank, not a number.
    ctors = {
        "RBF.lengthscale": lambda v: kernels.RBF(v),
        "RBF.variance": lambda v: kernels.RBF(1.0, variance=v),
        "Matern52.lengthscale": lambda v: kernels.Matern52(v),
        "Matern32.variance": lambda v: kernels.Matern32(1.0, variance=v),
        "RationalQuadratic.alpha": lambda v: kernels.RationalQuadratic(1.0, alpha=v),
        "Periodic.period": lambda v: kernels.Periodic(1.0, period=v),
        "Linear.variance": lambda v: kernels.Linear(v),
        "Polynomial.offset": lambda v: kernels.Polynomial(2, offset=v),
        "Constant.variance": lambda v: kernels.Constant(v),
    }
    for (name, ctor), v in itertools.product(ctors.items(), [0.0, -1.0, np.nan, np.inf, np.ones((2, 2)), "x"]):
        field = name.split(".")[1]
        cases.append((f"{name} = {v!r}", lambda ctor=ctor, v=v: ctor(v), rf"`{field}`"))
    # ARD lengthscales of the wrong length at call time; Polynomial degree.
    for ls in [[1.0, 2.0, 3.0], [1.0]]:
        if len(ls) == 2:
            continue
        cases.append((f"ARD {len(ls)} in D=2", lambda ls=ls: eqgp.gram(kernels.RBF(ls), X, X), r"`lengthscale`"))
    for deg in [0, -1, 1.5, True]:
        cases.append((f"degree {deg!r}", lambda deg=deg: kernels.Polynomial(deg), r"`degree`"))
    # Gram functions: kernel, layout, points.
    for bad in [None, 1.0, "rbf", lambda a, b: 1.0]:
        cases.append((f"kernel {bad!r}", lambda bad=bad: eqgp.gram(bad, X, X), r"`kernel`"))
    for layout in ["block", "", None]:
        cases.append(
            (
                f"layout {layout!r}",
                lambda layout=layout: eqgp.gradient_gram(kernels.RBF(), X, X, layout=layout),
                r"`layout`",
            )
        )
    cases.append(("X2 D mismatch", lambda: eqgp.gram(kernels.RBF(), X, np.ones((3, 3))), r"`X2`"))
    cases.append(("obs1 not pairs", lambda: eqgp.operator_gram(kernels.RBF(), [X], [(eqgp.Value(), X)]), r"`obs1"))
    cases.append(("obs2 empty", lambda: eqgp.operator_gram(kernels.RBF(), [(eqgp.Value(), X)], []), r"`obs2`"))
    # Posterior queries.
    post = eqgp.GaussianProcess(kernels.RBF(), noise=1e-2).condition(eqgp.Observations.values_and_gradients(X, y, G))
    for Xs in [np.ones((3, 3)), np.ones(3), np.ones((3, 2), np.int32), np.ones((3, 2), np.float32)]:
        cases.append((f"Posterior X {Xs.shape} {Xs.dtype}", lambda Xs=Xs: post.mean(Xs), r"`X`"))
    for g in [5, -1, 1.5, "0"]:
        cases.append((f"noise_group {g!r}", lambda g=g: post.variance(X, noise_group=g), r"`noise_group"))
    cases.append(
        ("noise_group operator mismatch", lambda: post.variance(X, eqgp.Gradient(), noise_group=0), r"`noise_group")
    )
    cases.append(("operator not an operator", lambda: post.mean(X, "value"), r"`operator`"))
    # Values only visible at run time, under jit: NaN/inf in X, targets, hyper-parameters.
    gp = eqgp.GaussianProcess(kernels.RBF(), noise=1e-2)
    lml = eqx.filter_jit(lambda m, o: m.log_marginal_likelihood(o))
    for where, bad in itertools.product(["X", "y", "G"], [np.nan, np.inf]):

        def run(where=where, bad=bad):
            Xb, yb, Gb = X.copy(), y.copy(), G.copy()
            {"X": Xb, "y": yb, "G": Gb}[where].flat[1] = bad
            return lml(gp, eqgp.Observations.values_and_gradients(Xb, yb, Gb)).block_until_ready()

        cases.append((f"jit {where} = {bad}", run, r"points `X`|targets"))
    for leaf, bad in itertools.product(["raw_lengthscale", "raw_variance"], [np.nan, np.inf]):

        def run(leaf=leaf, bad=bad):
            m = eqx.tree_at(lambda m: getattr(m.kernel, leaf), gp, jnp.asarray(bad))
            return lml(m, eqgp.Observations.values_and_gradients(X, y, G)).block_until_ready()

        cases.append((f"jit kernel {leaf} = {bad}", run, r"kernel hyper-parameter"))
    for bad in [np.nan, np.inf]:

        def run(bad=bad):
            m = eqx.tree_at(lambda m: m.raw_noise, gp, (jnp.asarray(bad),))
            return lml(m, eqgp.Observations.values_and_gradients(X, y, G)).block_until_ready()

        cases.append((f"jit noise = {bad}", run, r"noise variance"))
    # Smoothness and kernel shape.
    for k, op in [
        (kernels.Matern12(), eqgp.Gradient()),
        (kernels.Matern32(), eqgp.Hessian()),
        (kernels.Matern12() + kernels.RBF(), eqgp.ValueAndGradient()),
    ]:
        cases.append(
            (
                f"{type(k).__name__} with {type(op).__name__}",
                lambda k=k, op=op: eqgp.operator_gram(k, (op, X), (op, X)),
                r"kernel \w+ is only",
            )
        )
    # Solvers and fit options.
    for kw in [dict(jitter=-1.0), dict(max_tries=-1), dict(max_tries=1.5)]:
        cases.append((f"Cholesky {kw}", lambda kw=kw: eqgp.Cholesky(**kw), "`" + next(iter(kw)) + "`"))
    for kw in [dict(rtol=-1.0), dict(max_steps=0), dict(num_probes=0), dict(on_failure="ignore")]:
        cases.append(
            (f"ConjugateGradient {kw}", lambda kw=kw: eqgp.ConjugateGradient(**kw), "`" + next(iter(kw)) + "`")
        )
    for steps in [-1, 1.5, True]:
        cases.append(
            (
                f"fit steps {steps!r}",
                lambda steps=steps: eqgp.fit(gp, lambda m: 0.0, optax.adam(1e-2), steps),
                r"`steps`",
            )
        )
    # sumcumprod.
    for bad in [np.ones(3, np.int32), np.ones(3, np.complex64), np.float32(1.0), "x", np.ones(3, np.int8)]:
        cases.append((f"sumcumprod {bad!r}", lambda bad=bad: sumcumprod(bad), r"`x`"))
    cases.append(("sumcumprod axis 1.0", lambda: sumcumprod(np.ones((2, 3)), axis=1.0), r"`axis` must be an int"))
    cases.append(
        ("sumcumprod reverse 'yes'", lambda: sumcumprod(np.ones(3), reverse="yes"), r"`reverse` must be a Python bool")
    )
    # Solvers and optimisers given as classes, factories or strings.
    for bad in [eqgp.Cholesky, "cg", None.__class__]:
        cases.append((f"solver {bad!r}", lambda bad=bad: eqgp.GaussianProcess(kernels.RBF(), solver=bad), r"`solver`"))
    cases.append(
        (
            "fit compiler_options list",
            lambda: eqgp.fit(gp, lambda m: 0.0, optax.adam(1e-2), 1, compiler_options=["x"]),
            r"`compiler_options` must be None or a dict",
        )
    )
    cov = eqgp.Covariance(kernels.RBF(), ((eqgp.Value(), jnp.asarray(X)),), jnp.full(4, 0.1))
    cases.append(
        (
            "likelihood solver class",
            lambda: eqgp.log_marginal_likelihood(cov, jnp.zeros(4), eqgp.Cholesky),
            r"`solver` must be an eqgp solver instance",
        )
    )
    cases.append(
        (
            "likelihood cov matrix",
            lambda: eqgp.log_marginal_likelihood(np.eye(4), jnp.zeros(4), eqgp.Cholesky()),
            r"`cov` must be an eqgp.Covariance",
        )
    )
    cases.append(("fit optimizer factory", lambda: eqgp.fit(gp, lambda m: 0.0, optax.adam, 1), r"`optimizer`.*call it"))
    cases.extend(_round2_cases(X, y, G, gp, post))
    cases.extend(_hyperparameter_cases(X, y, G, gp))
    return cases


def _hyperparameter_cases(X, y, G, gp):
    """minimize, initialise, fit_hyperparameters, the profile likelihood, leave-one-out."""
    cases = []
    obs = eqgp.Observations.values_and_gradients(X, y, G)
    nll = lambda m, o: -m.log_marginal_likelihood(o)  # noqa: E731
    for name, kw in [
        ("max_steps", dict(max_steps=-1)),
        ("max_steps", dict(max_steps=1.5)),
        ("max_steps", dict(max_steps=True)),
        ("memory_size", dict(memory_size=0)),
        ("linesearch_steps", dict(linesearch_steps=0)),
        ("chunk", dict(chunk=0)),
        ("gtol", dict(gtol=np.nan)),
        ("gtol", dict(gtol=-1.0)),
        ("gtol", dict(gtol="1e-5")),
        ("ftol", dict(ftol=np.inf)),
        ("ftol", dict(ftol=-1e-9)),
        ("starts", dict(starts=0)),
    ]:
        cases.append((f"minimize {kw!r}", lambda kw=kw: eqgp.minimize(gp, nll, obs, **kw), f"`{name}`"))
    cases.append(
        ("minimize starts without a batch", lambda: eqgp.minimize(gp, nll, obs, starts=3), r"leading axis of size 3")
    )
    cases.append(("minimize loss None", lambda: eqgp.minimize(gp, None, obs), r"`loss` must be a callable"))
    cases.append(("minimize loss string", lambda: eqgp.minimize(gp, "nll", obs), r"`loss` must be a callable"))
    cases.append(
        (
            "minimize under jit",
            lambda: jax.jit(lambda o: eqgp.minimize(gp, nll, o, max_steps=1)[1].loss)(obs),
            r"eqgp.minimize cannot run under jit",
        )
    )
    cases.append(
        ("initialise kernel", lambda: eqgp.initialise(kernels.RBF(), obs), r"`gp` must be an eqgp.GaussianProcess")
    )
    cases.append(("initialise obs tuple", lambda: eqgp.initialise(gp, (X, y)), r"`obs` must be an eqgp.Observations"))
    cases.append(("initialise starts 0", lambda: eqgp.initialise(gp, obs, starts=0), r"`starts`"))
    cases.append(("initialise starts float", lambda: eqgp.initialise(gp, obs, starts=2.0), r"`starts`"))
    cases.append(
        (
            "fit_hyperparameters objective",
            lambda: eqgp.fit_hyperparameters(gp, obs, objective="nll"),
            r"`objective` must be one of",
        )
    )
    cases.append(("fit_hyperparameters starts", lambda: eqgp.fit_hyperparameters(gp, obs, starts=-2), r"`starts`"))
    cases.append(("profile not a bool", lambda: gp.log_marginal_likelihood(obs, profile="yes"), r"`profile`"))
    cases.append(
        (
            "leave_one_out combine_groups",
            lambda: gp.leave_one_out(obs, combine_groups=1),
            r"`combine_groups` must be a bool",
        )
    )
    cases.append(
        (
            "leave_one_out_log_density combine_groups",
            lambda: gp.leave_one_out_log_density(obs, combine_groups="no"),
            r"`combine_groups` must be a bool",
        )
    )
    cases.append(("leave_one_out obs", lambda: gp.leave_one_out((X, y)), r"`obs`"))
    return cases


def _round2_cases(X, y, G, gp, post):
    """Bayesian optimisation, the solvers' settings, keys, fit under a trace, saving."""
    cases = []
    obs = eqgp.Observations.values_and_gradients(X, y, G)
    ei = lambda X_: eqgp.log_expected_improvement(post, X_, 0.0)  # noqa: E731
    key = jax.random.key(0)
    lo, hi = np.zeros(2), np.ones(2)
    # The maximiser: the box, the ascent's settings, the acquisition's output, the key.
    for lower, upper, what in [
        (np.array([0.0, -np.inf]), hi, "infinite lower"),
        (lo, np.array([1.0, np.inf]), "infinite upper"),
        (lo, np.array([1.0, np.nan]), "NaN upper"),
        (np.ones(2), np.ones(2), "lower == upper"),
        (np.ones(2), np.zeros(2), "lower > upper"),
        (np.zeros(3), np.ones(2), "shapes differ"),
        (np.zeros((2, 2)), np.ones((2, 2)), "2-D box"),
    ]:
        pattern = r"`lower` and `upper` must|`lower` must be below"
        cases.append(
            (f"maximize box {what}", lambda a=lower, b=upper: eqgp.maximize_acquisition(ei, a, b, key), pattern)
        )
    for name, kw in [
        ("learning_rate", dict(learning_rate=-0.1)),
        ("learning_rate", dict(learning_rate=0.0)),
        ("learning_rate", dict(learning_rate=np.nan)),
        ("learning_rate", dict(learning_rate=np.inf)),
        ("learning_rate", dict(learning_rate="0.1")),
        ("num_starts", dict(num_starts=0)),
        ("num_starts", dict(num_starts=2.5)),
        ("num_starts", dict(num_starts=True)),
        ("steps", dict(steps=-1)),
        ("steps", dict(steps=1.5)),
    ]:
        cases.append((f"maximize {kw!r}", lambda kw=kw: eqgp.maximize_acquisition(ei, lo, hi, key, **kw), f"`{name}`"))
    cases.append(
        (
            "maximize acquisition scalar",
            lambda: eqgp.maximize_acquisition(lambda X_: jnp.sum(X_), lo, hi, key, steps=2),
            r"`acquisition` must return one value per point",
        )
    )
    cases.append(
        (
            "maximize acquisition (N, 1)",
            lambda: eqgp.maximize_acquisition(lambda X_: X_[:, :1], lo, hi, key, steps=2),
            r"`acquisition` must return one value per point",
        )
    )
    cases.append(
        (
            "maximize acquisition not callable",
            lambda: eqgp.maximize_acquisition("ei", lo, hi, key),
            r"`acquisition` must be a function",
        )
    )
    cases.append(
        (
            "maximize acquisition NaN everywhere",
            lambda: eqgp.maximize_acquisition(lambda X_: jnp.full(X_.shape[0], jnp.nan), lo, hi, key, steps=2)[
                1
            ].block_until_ready(),
            r"NaN or -inf at every start",
        )
    )
    for bad in ["key", 1.5, np.ones(3, np.float32)]:
        cases.append(
            (
                f"maximize key {bad!r}",
                lambda bad=bad: eqgp.maximize_acquisition(ei, lo, hi, bad),
                r"`key` must be a jax.random key",
            )
        )
    # Acquisitions: the posterior, the incumbent, beta, maximize.
    for fn in [eqgp.expected_improvement, eqgp.log_expected_improvement]:
        label = fn.__name__
        cases.append(
            (
                f"{label} on a GaussianProcess",
                lambda fn=fn: fn(gp, X, 0.0),
                r"`posterior` must be an eqgp.Posterior; got a GaussianProcess",
            )
        )
        cases.append((f"{label} on None", lambda fn=fn: fn(None, X, 0.0), r"`posterior` must be an eqgp.Posterior"))
        for best in [np.nan, np.inf, -np.inf]:
            cases.append(
                (
                    f"{label} best_f {best}",
                    lambda fn=fn, best=best: fn(post, X, best).block_until_ready(),
                    r"`best_f` must be finite",
                )
            )
        cases.append((f"{label} best_f (2,)", lambda fn=fn: fn(post, X, np.zeros(2)), r"`best_f` must be a scalar"))
        cases.append((f"{label} best_f 'x'", lambda fn=fn: fn(post, X, "x"), r"`best_f` must be a number"))
        for m in ["min", 1, None]:
            cases.append(
                (
                    f"{label} maximize {m!r}",
                    lambda fn=fn, m=m: fn(post, X, 0.0, maximize=m),
                    r"`maximize` must be a bool",
                )
            )
    for beta in [-1.0, np.nan, np.inf]:
        cases.append(
            (
                f"ucb beta {beta}",
                lambda beta=beta: eqgp.upper_confidence_bound(post, X, beta).block_until_ready(),
                r"`beta` must be finite and >= 0",
            )
        )
    cases.append(
        ("ucb beta (2,)", lambda: eqgp.upper_confidence_bound(post, X, np.ones(2)), r"`beta` must be a scalar")
    )
    cases.append(
        (
            "ucb maximize 'yes'",
            lambda: eqgp.upper_confidence_bound(post, X, maximize="yes"),
            r"`maximize` must be a bool",
        )
    )
    cases.append(
        (
            "ucb on a GaussianProcess",
            lambda: eqgp.upper_confidence_bound(gp, X),
            r"`posterior` must be an eqgp.Posterior",
        )
    )
    # Solver settings.
    for kw, name in [
        (dict(rtol=2.0), "rtol"),
        (dict(rtol=1.0), "rtol"),
        (dict(rtol=0.0), "rtol"),
        (dict(rtol="1e-6"), "rtol"),
        (dict(rtol=np.nan), "rtol"),
        (dict(atol=-1.0), "atol"),
        (dict(atol=np.inf), "atol"),
        (dict(shard="yes"), "shard"),
        (dict(num_lanczos=0), "num_lanczos"),
        (dict(preconditioner_rank=-1), "preconditioner_rank"),
        (dict(preconditioner_rank=2.0), "preconditioner_rank"),
        (dict(tile_bytes=0), "tile_bytes"),
        (dict(max_steps=True), "max_steps"),
    ]:
        cases.append((f"ConjugateGradient {kw!r}", lambda kw=kw: eqgp.ConjugateGradient(**kw), f"`{name}`"))
    for kw, name in [
        (dict(jitter=np.nan), "jitter"),
        (dict(jitter="1e-6"), "jitter"),
        (dict(jitter=True), "jitter"),
        (dict(max_tries=True), "max_tries"),
    ]:
        cases.append((f"Cholesky {kw!r}", lambda kw=kw: eqgp.Cholesky(**kw), f"`{name}`"))
    # Keys.
    for bad in ["key", 1.5, np.ones(3, np.float32), np.ones(2, np.int32)]:
        cases.append(
            (f"condition key {bad!r}", lambda bad=bad: gp.condition(obs, key=bad), r"`key` must be a jax.random key")
        )
    cases.append(("sample key 'k'", lambda: post.sample("k", X), r"`key` must be a jax.random key"))
    cases.append(
        ("sample num_samples 0", lambda: post.sample(key, X, num_samples=0), r"`num_samples` must be an int >= 1")
    )
    # Posterior.update.
    structured = eqgp.GaussianProcess(kernels.RBF(), noise=1e-2, solver=eqgp.StructuredGradients())
    spost = structured.condition(eqgp.Observations.gradients(X, G))
    cases.append(
        (
            "update with StructuredGradients",
            lambda: spost.update(eqgp.Observations.gradients(X + 0.1, G)),
            r"StructuredGradients cannot extend",
        )
    )
    cases.append(
        (
            "update obs not Observations",
            lambda: post.update((eqgp.Value(), X, y)),
            r"`obs` must be an eqgp.Observations",
        )
    )
    cases.append(
        (
            "update D mismatch",
            lambda: post.update(eqgp.Observations.values(np.ones((2, 3)), np.ones(2))),
            r"`obs` must have D = 2",
        )
    )
    cases.append(
        (
            "update dtype mismatch",
            lambda: post.update(eqgp.Observations.values(np.ones((2, 2), np.float32), np.ones(2, np.float32))),
            r"`obs` must have dtype float64",
        )
    )
    # Structured with a kernel whose process has no gradients.
    rough = eqgp.GaussianProcess(kernels.Matern12(), noise=1e-2, solver=eqgp.StructuredGradients())
    cases.append(
        (
            "StructuredGradients Matern12",
            lambda: rough.log_marginal_likelihood(eqgp.Observations.gradients(X, G)),
            r"kernel Matern12 is only 0 time",
        )
    )
    # Directions.
    cases.append(
        (
            "Directional zero row",
            lambda: eqgp.Directional(np.array([[1.0, 0.0], [0.0, 0.0]])),
            r"`v` holds a zero direction \(row\(s\) \[1\]\)",
        )
    )
    cases.append(("Directional NaN", lambda: eqgp.Directional(np.array([1.0, np.nan])), r"`v` must be finite"))
    # fit under a trace.
    cases.append(
        (
            "fit under jit",
            lambda: jax.jit(lambda m: eqgp.fit(m, lambda m: 0.0, optax.adam(1e-2), 1)[1])(gp),
            r"eqgp.fit cannot run under jit",
        )
    )

    # fit: the loss and the model, before any step.
    cases.append(("fit loss a string", lambda: eqgp.fit(gp, "nlml", optax.adam(1e-2), 1), r"`loss` must be a callable"))
    cases.append(
        (
            "fit model without arrays",
            lambda: eqgp.fit(object(), lambda m: 0.0, optax.adam(1e-2), 1),
            r"`model` has no inexact",
        )
    )
    # Prediction points that are not finite (checked under jit).
    for what, bad in [("NaN", np.nan), ("inf", np.inf)]:
        cases.append(
            (
                f"mean at {what} points",
                lambda bad=bad: post.mean(np.full((2, 2), bad)).block_until_ready(),
                r"the prediction points `X` hold NaN or inf",
            )
        )
    cases.append(
        (
            "maximize acquisition +inf",
            lambda: eqgp.maximize_acquisition(
                lambda X_: jnp.where(X_[:, 0] > 0.5, jnp.inf, X_[:, 1]), lo, hi, key, steps=2
            )[1].block_until_ready(),
            r"the acquisition is \+inf at the point it chose",
        )
    )
    cases.append(
        (
            "molecular_permutations coincident atoms",
            lambda: eqgp.molecular_permutations([1, 1, 8], np.zeros((3, 3))),
            r"atoms 0 and 1 are 0 Å apart",
        )
    )

    # Saving into another structure.
    def load_into(like):
        import os
        import tempfile

        path = os.path.join(tempfile.mkdtemp(), "gp.eqgp")
        eqgp.save(path, gp)
        return eqgp.load(path, like)

    def load_cut_short():
        import os
        import tempfile

        path = os.path.join(tempfile.mkdtemp(), "gp.eqgp")
        eqgp.save(path, gp)
        with open(path, "r+b") as f:
            f.truncate(os.path.getsize(path) - 8)
        return eqgp.load(path, gp)

    cases.append(("load a file cut short", load_cut_short, r"is damaged: its arrays do not read back"))
    cases.append(
        (
            "load into Matern52",
            lambda: load_into(eqgp.GaussianProcess(kernels.Matern52(), noise=1e-2)),
            r"`like` does not have the structure",
        )
    )
    cases.append(
        (
            "load into ARD",
            lambda: load_into(eqgp.GaussianProcess(kernels.RBF([1.0, 2.0]), noise=1e-2)),
            r"`like`'s array 0 has shape \(2,\)",
        )
    )
    cases.append(
        (
            "load into two noises",
            lambda: load_into(eqgp.GaussianProcess(kernels.RBF(), noise=[1e-2, 1e-2])),
            r"`like` does not have the structure",
        )
    )
    # Invariant kernels and the symmetry helper.
    base = kernels.Matern52(1.0)
    swap = [[0, 1, 2, 3], [0, 1, 3, 2]]
    for name, make, pattern in [
        (
            "Invariant of a non-kernel",
            lambda: kernels.Invariant(lambda a, b: 1.0, swap),
            r"`kernel` must be an eqgp kernel",
        ),
        ("Invariant without a group", lambda: kernels.Invariant(base), r"exactly one of `permutations`"),
        (
            "Invariant with both groups",
            lambda: kernels.Invariant(base, swap, maps=np.eye(4)[None]),
            r"exactly one of `permutations`",
        ),
        (
            "Invariant float permutations",
            lambda: kernels.Invariant(base, np.asarray(swap, float)),
            r"`permutations` must be a non-empty \(G, D\) array of integers",
        ),
        (
            "Invariant non-permutation row",
            lambda: kernels.Invariant(base, [[0, 1, 2, 3], [0, 0, 2, 3]]),
            r"every row must be a permutation of range\(4\)",
        ),
        ("Invariant without identity", lambda: kernels.Invariant(base, [[0, 1, 3, 2]]), r"must contain the identity"),
        ("Invariant repeated rows", lambda: kernels.Invariant(base, [[0, 1, 2, 3], [0, 1, 2, 3]]), r"repeated rows"),
        (
            "Invariant not a group",
            lambda: kernels.Invariant(base, [[0, 1, 2, 3], [1, 2, 3, 0]]),
            r"not closed under composition",
        ),
        (
            "Invariant one_sided not bool",
            lambda: kernels.Invariant(base, swap, one_sided=1),
            r"`one_sided` must be a bool",
        ),
        (
            "Invariant maps not square",
            lambda: kernels.Invariant(base, maps=np.ones((2, 4, 3))),
            r"`maps` must be a non-empty \(G, D, D\) float array",
        ),
        (
            "Invariant points of another D",
            lambda: eqgp.gram(kernels.Invariant(base, swap), np.ones((2, 3)), np.ones((2, 3))),
            r"acts on 4 dimensions; the points have 3",
        ),
        (
            "Invariant warped points of another D",
            lambda: eqgp.gradient_gram(
                kernels.Invariant(kernels.Warped(base, jnp.sin), swap), np.ones((2, 3)), np.ones((2, 3))
            ),
            r"acts on 4 dimensions; the points have 3",
        ),
        (
            "molecular_permutations numbers 2-D",
            lambda: eqgp.molecular_permutations(np.ones((2, 2), int), np.zeros((2, 3))),
            r"`numbers` must be a \(n,\) array",
        ),
        (
            "molecular_permutations positions shape",
            lambda: eqgp.molecular_permutations([1, 1], np.zeros((3, 3))),
            r"`positions` must be \(n, 3\) or \(m, n, 3\) with n = 2",
        ),
        (
            "molecular_permutations unknown element",
            lambda: eqgp.molecular_permutations([1, 250], np.zeros((2, 3))),
            r"no covalent radius",
        ),
        (
            "molecular_permutations tolerance",
            lambda: eqgp.molecular_permutations([1, 1], np.eye(2, 3), tolerance=0),
            r"`tolerance` must be a number > 0",
        ),
    ]:
        cases.append((name, make, pattern))
    return cases
