import contextlib

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from helpers import assert_close

import eqgp
from eqgp import kernels


def _f(x):
    return jnp.sin(2 * x[0]) * jnp.cos(x[1]) + 0.3 * x[1]


def _obs(N=12, D=2, scale=1.0, shift=0.0, yscale=1.0, yshift=0.0):
    X = jax.random.uniform(jax.random.key(0), (N, D), jnp.float64, -2, 2)
    y = jax.vmap(_f)(X) * yscale + yshift
    G = jax.vmap(jax.grad(_f))(X) * yscale / scale
    return eqgp.Observations.values_and_gradients(X * scale + shift, y, G)


def _gp(D=2, **kw):
    return eqgp.GaussianProcess(kernels.RBF(jnp.ones(D)), mean=0.0, noise=1e-3, **kw)


def test_leave_one_out_equals_refits_without_each_point():
    obs = _obs(8)
    gp = eqgp.GaussianProcess(kernels.Matern52([0.9, 1.2], variance=1.3), mean=0.2, noise=1e-3)
    ((residual, cov),) = gp.leave_one_out(obs).blocks
    g = obs.groups[0]
    for i in range(g.X.shape[0]):
        keep = np.arange(g.X.shape[0]) != i
        rest = eqgp.Observations((g.operator, g.X[keep], g.targets[keep]))
        post = gp.condition(rest)
        x = g.X[i : i + 1]
        mean = jnp.concatenate([post.mean(x), post.mean(x, eqgp.Gradient())[0]])
        assert_close(residual[i], g.targets[i] - mean, rtol=0, atol=1e-8)
        full = post.covariance(x, eqgp.ValueAndGradient()) + 1e-3 * jnp.eye(3)  # plus the noise
        assert_close(cov[i], full, rtol=0, atol=1e-8)
    # The objective: the sum of the held-out Gaussian log densities.
    expected = sum(jax.scipy.stats.multivariate_normal.logpdf(residual[i], jnp.zeros(3), cov[i]) for i in range(8))
    assert_close(gp.leave_one_out_log_density(obs), expected, rtol=1e-10)


def test_leave_one_out_combines_groups_given_as_separate_values_and_gradients():
    X = jax.random.uniform(jax.random.key(1), (6, 2), jnp.float64, -2, 2)
    y, G = jax.vmap(_f)(X), jax.vmap(jax.grad(_f))(X)
    gp = _gp()
    joint = gp.leave_one_out(eqgp.Observations.values_and_gradients(X, y, G)).blocks[0]
    split = gp.leave_one_out(
        eqgp.Observations((eqgp.Value(), X, y), (eqgp.Gradient(), X, G)), combine_groups=True
    ).blocks[0]
    assert_close(split[0], joint[0], rtol=1e-9, atol=1e-12)
    with pytest.raises(ValueError, match="same number of points"):
        gp.leave_one_out(eqgp.Observations((eqgp.Value(), X, y), (eqgp.Gradient(), X[:3], G[:3])), combine_groups=True)


def test_profile_likelihood_is_the_likelihood_at_the_optimal_scale_and_its_gradient_is_exact():
    obs = _obs(10)
    gp = _gp(noise_floor=0.0)
    profile = gp.log_marginal_likelihood(obs, profile=True)
    scaled = gp.with_profiled_scale(obs)
    assert_close(scaled.log_marginal_likelihood(obs), profile, rtol=1e-10)
    assert float(profile) >= float(gp.log_marginal_likelihood(obs))
    # Gradient against a plain dense profile formula differentiated by autodiff.

    def dense(m):
        K = eqgp.operator_gram(m.kernel, obs, obs) + m.noise[0] * jnp.eye(obs.size)
        N = obs.groups[0].X.shape[0]  # the constant mean shifts the value rows only
        r = obs.flat_targets() - jnp.concatenate([jnp.full(N, m.mean.constant), jnp.zeros(obs.size - N)])
        R = r.shape[0]
        L = jnp.linalg.cholesky(K)
        q = r @ jax.scipy.linalg.cho_solve((L, True), r)
        return -0.5 * (R * jnp.log(q / R) + 2 * jnp.sum(jnp.log(jnp.diagonal(L))) + R * (1 + jnp.log(2 * jnp.pi)))

    assert_close(dense(gp), profile, rtol=1e-10)
    g1 = eqx.filter_grad(lambda m: m.log_marginal_likelihood(obs, profile=True))(gp)
    g2 = eqx.filter_grad(dense)(gp)
    for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g2)):
        assert_close(a, b, rtol=1e-7, atol=1e-9)


@pytest.mark.slow  # CI's slow stage (keeps the main suite under ~5 min on 2 cores)
def test_minimize_reaches_the_optimum_of_a_long_adam_run():
    obs = _obs(10)
    loss = lambda m, obs: -m.log_marginal_likelihood(obs)  # noqa: E731
    start = eqgp.initialise(_gp(), obs)
    adam, losses = eqgp.fit(start, loss, optax.adam(2e-2), 3000, obs, progress=False)
    model, report = eqgp.minimize(start, loss, obs)
    assert report.steps > 0 and report.steps < 500
    assert report.loss <= float(losses[-1]) + 1e-3 * abs(float(losses[-1]))
    assert_close(loss(model, obs), report.loss, rtol=1e-10)
    assert isinstance(report.reason, str) and report.grad_norm >= 0


def _batched_warning():
    cpu = jax.default_backend() == "cpu"
    return pytest.warns(RuntimeWarning, match="deadlock") if cpu else contextlib.nullcontext()


@pytest.mark.slow  # CI's slow stage (keeps the main suite under ~5 min on 2 cores)
def test_minimize_multistart_keeps_the_best_start():
    obs = _obs(10)
    loss = lambda m, obs: -m.log_marginal_likelihood(obs)  # noqa: E731
    starts = eqgp.initialise(_gp(), obs, starts=3, key=3)
    model, report = eqgp.minimize(starts, loss, obs, starts=3, max_steps=30)
    assert report.losses.shape == (3,)
    assert report.start == int(np.argmin(report.losses)) and report.loss == report.losses.min()
    for i in range(3):
        one = jax.tree.map(lambda x, i=i: x[i] if eqx.is_inexact_array(x) else x, starts)
        _, r = eqgp.minimize(one, loss, obs, max_steps=30)
        assert_close(r.loss, report.losses[i], rtol=1e-8)
    assert_close(loss(model, obs), report.loss, rtol=1e-10)
    # vmap over the starts gives each start's own run (on CPU batching is opt-in and warns).
    with _batched_warning():
        _, together = eqgp.minimize(starts, loss, obs, starts=3, max_steps=30, batched=True)
    assert_close(together.losses, report.losses, rtol=1e-8)
    assert together.start == report.start and together.steps == report.steps
    with pytest.raises(ValueError, match="leading axis of size 4"):
        eqgp.minimize(starts, loss, obs, starts=4)
    with pytest.raises(TypeError, match="batched"):
        eqgp.minimize(starts, loss, obs, starts=3, batched="yes")


@pytest.mark.slow  # CI's slow stage (keeps the main suite under ~5 min on 2 cores)
def test_minimize_batched_starts_survive_a_failing_start():
    obs = _obs(5)
    loss = lambda m, obs: -m.log_marginal_likelihood(obs)  # noqa: E731
    stacked = eqgp.initialise(_gp(), obs, starts=3, key=3)

    def failing(m, obs):  # an error under jit once a lengthscale passes 1: stops the batch
        ls = jax.nn.softplus(m.kernel.raw_lengthscale)
        return eqx.error_if(loss(m, obs), jnp.any(ls > 1.0), "lengthscale too long")

    raw = jnp.asarray([[-1.0, -1.0], [-2.0, -1.5], [-1.5, -2.0]])
    short = eqx.tree_at(lambda m: m.kernel.raw_lengthscale, stacked, raw)
    _, alone = eqgp.minimize(short, failing, obs, starts=3, max_steps=25, batched=False)
    with _batched_warning():
        model, batch = eqgp.minimize(short, failing, obs, starts=3, max_steps=25, batched=True)
    # The starts went on one by one from the last batched chunk that worked (here the start):
    # each ends where it ends alone, with a finite model from before its failing step.
    assert np.all(np.isfinite(batch.losses)) and np.all(np.isfinite(alone.losses))
    assert_close(batch.losses, alone.losses, rtol=1e-8)
    assert batch.loss == batch.losses.min() and bool(jnp.all(jax.nn.softplus(model.kernel.raw_lengthscale) <= 1.0))


@pytest.mark.slow  # CI's slow stage (keeps the main suite under ~5 min on 2 cores)
def test_minimize_keeps_the_model_when_a_step_fails():
    obs = _obs(6)

    def loss(m, obs):  # fails (an error under jit) once a lengthscale passes 1 (the optimum: 0.99, 1.31)
        value = -m.log_marginal_likelihood(obs)
        ls = jax.nn.softplus(m.kernel.raw_lengthscale)
        return eqx.error_if(value, jnp.any(ls > 1.0), "lengthscale too long")

    start = eqx.tree_at(lambda m: m.kernel.raw_lengthscale, _gp(), jnp.full(2, -1.0))
    model, report = eqgp.minimize(start, loss, obs)  # the failing chunk is redone step by step
    assert not report.converged and "error" in report.reason and report.steps > 0
    assert np.isfinite(report.loss) and bool(jnp.all(jax.nn.softplus(model.kernel.raw_lengthscale) <= 1.0))


def test_minimize_compiles_its_chunk_once_however_many_chunks_it_runs():
    # optax's line-search state starts weakly typed and comes out of a chunk strongly typed:
    # unless made strong first, the second chunk compiled again (5 s on WaterFlow, n = 80).
    traces = []

    def loss(m, obs):
        traces.append(None)  # runs only while tracing
        return -m.log_marginal_likelihood(obs)

    X = jax.random.uniform(jax.random.key(0), (6, 2), jnp.float64, -2, 2)
    obs = eqgp.Observations.values(X, jax.vmap(_f)(X))
    eqgp.minimize(_gp(), loss, obs, chunk=8, max_steps=8, gtol=0.0, ftol=0.0)  # one chunk
    first = len(traces)
    _, report = eqgp.minimize(_gp(), loss, obs, chunk=2, max_steps=8, gtol=0.0, ftol=0.0)
    assert report.steps > 4  # three chunks or more
    assert first > 0 and len(traces) == first


@pytest.mark.slow  # CI's slow stage (keeps the main suite under ~5 min on 2 cores)
def test_minimize_compiles_once_for_a_repeated_workload():
    traces = []

    def loss(m, obs):
        traces.append(None)  # runs only while tracing
        return -m.log_marginal_likelihood(obs)

    for seed in (0, 1):  # new data of the same shapes, new model: no new compilation
        X = jax.random.uniform(jax.random.key(seed), (5, 2), jnp.float64, -2, 2)
        obs = eqgp.Observations.values_and_gradients(X, jax.vmap(_f)(X), jax.vmap(jax.grad(_f))(X))
        eqgp.minimize(_gp(), loss, obs, max_steps=3)
        if seed == 0:
            first = len(traces)
    assert first > 0 and len(traces) == first


@pytest.mark.parametrize("c, b, a, s", [(3.0, 0.0, 1.0, 0.0), (0.5, 2.0, 7.0, -4.0)])
def test_initialise_transforms_with_the_data(c, b, a, s):
    # One noise per output: values' scale with a^2, derivatives' with (a / c)^2.
    gp = eqgp.GaussianProcess(kernels.RBF(jnp.ones(2)), mean=0.0, noise=[jnp.full(3, 1e-3)], noise_floor=0.0)
    base = eqgp.initialise(gp, _obs())
    moved = eqgp.initialise(gp, _obs(scale=c, shift=b, yscale=a, yshift=s))
    ls = lambda m: jax.nn.softplus(m.kernel.raw_lengthscale)  # noqa: E731
    assert_close(ls(moved), c * ls(base), rtol=1e-10)
    assert_close(moved.kernel.variance, a**2 * base.kernel.variance, rtol=1e-10)
    factor = jnp.asarray([a**2, (a / c) ** 2, (a / c) ** 2])
    assert_close(moved.noise[0], factor * base.noise[0], rtol=1e-6)
    assert_close(moved.mean.constant, a * base.mean.constant + s, rtol=1e-10)


def test_initialise_from_gradients_only_matches_the_values_scale():
    # An RBF's derivative variance is variance / l^2: gradients alone recover the scale.
    X = jax.random.uniform(jax.random.key(0), (200, 2), jnp.float64, -2, 2)
    with_values = eqgp.initialise(
        _gp(), eqgp.Observations.values_and_gradients(X, jax.vmap(_f)(X), jax.vmap(jax.grad(_f))(X))
    )
    gradients = eqgp.initialise(_gp(), eqgp.Observations.gradients(X, jax.vmap(jax.grad(_f))(X)))
    ratio = float(gradients.kernel.variance / with_values.kernel.variance)
    assert 0.2 < ratio < 5


@pytest.mark.slow  # CI's slow stage (keeps the main suite under ~5 min on 2 cores)
def test_fit_hyperparameters_recipe_improves_its_own_objective():
    obs = _obs(10)
    objectives = {
        "profile": lambda m: m.log_marginal_likelihood(obs, profile=True),
        "likelihood": lambda m: m.log_marginal_likelihood(obs),
        "loo": lambda m: m.leave_one_out_log_density(obs),
    }
    start = eqgp.initialise(_gp(), obs)
    for objective, value in objectives.items():
        model, report = eqgp.fit_hyperparameters(_gp(), obs, objective=objective, starts=2, max_steps=60)
        assert float(value(model)) > float(value(start)) + 1.0, objective
    with pytest.raises(ValueError, match="objective"):
        eqgp.fit_hyperparameters(_gp(), obs, objective="mle")


def test_fit_hyperparameters_screens_the_starts_and_trains_the_best():
    obs = _obs(8)
    loss = lambda m: -m.log_marginal_likelihood(obs, profile=True)  # noqa: E731
    gp = _gp(solver=eqgp.Cholesky(max_tries=4))  # as fit_hyperparameters trains it
    stacked = eqgp.initialise(gp, obs, starts=4, key=3)
    initial = [float(loss(jax.tree.map(lambda x, i=i: x[i] if eqx.is_array(x) else x, stacked))) for i in range(4)]
    best = int(np.argmin(initial))
    from eqgp._hyperparameters import _neg_profile, _screen

    kept = _screen(stacked, 4, 1, _neg_profile, obs, {})
    assert_close(kept.kernel.lengthscale, stacked.kernel.lengthscale[best], rtol=0)
    two = _screen(stacked, 4, 2, _neg_profile, obs, {})
    assert_close(two.kernel.lengthscale, stacked.kernel.lengthscale[np.argsort(initial)[:2]], rtol=0)
    # Trained from the screened best, it ends no worse than that start.
    model, report = eqgp.fit_hyperparameters(_gp(), obs, starts=4, runs=1, key=3, max_steps=30)
    assert report.losses.shape == (1,) and report.loss <= min(initial) + 1e-9
    # Trained with log lengthscales, handed back as the user's model: its loss is the reported
    # one (to 1e-3 nats: rescaled by the profile, where the absolute noise floor does not scale).
    assert_close(-model.log_marginal_likelihood(obs, profile=True), report.loss, rtol=0, atol=1e-3)
    with pytest.raises(ValueError, match="`runs`"):
        eqgp.fit_hyperparameters(_gp(), obs, runs=0)


def test_fit_hyperparameters_trains_lengthscales_in_log_space_and_hands_back_the_users_parametrisation(monkeypatch):
    from eqgp import _hyperparameters as hp

    raw = jnp.asarray([-700.0, -40.0, -20.5, -20.0, -19.5, -3.0, 0.0, 5.0, 50.0, 700.0])
    assert_close(hp._from_log(hp._to_log(raw)), raw, rtol=1e-12, atol=1e-12)
    assert_close(hp._to_log(raw)[5:], jnp.log(jax.nn.softplus(raw[5:])), rtol=1e-12)
    obs = _obs(6)
    gp = eqgp.initialise(_gp(), obs)
    in_logs = hp._map_raw(gp, hp._to_log)
    assert_close(in_logs.kernel.raw_lengthscale, jnp.log(gp.kernel.lengthscale), rtol=1e-12)
    # Only lengthscales (variance and noise in log space drove a noise-to-signal ratio of 1e-15).
    assert_close(in_logs.kernel.raw_variance, gp.kernel.raw_variance, rtol=0)
    assert_close(in_logs.raw_noise[0], gp.raw_noise[0], rtol=0)
    assert_close(hp._in_log_space(hp._neg_likelihood)(in_logs, obs), hp._neg_likelihood(gp, obs), rtol=1e-12)
    # (The trained model's own loss is the reported one: the screening test below.)

    # A start that fails hands back the model as the user knows it, not its logs.
    def failing(m, obs):
        return eqx.error_if(-m.log_marginal_likelihood(obs), True, "boom")

    monkeypatch.setitem(hp._LOSSES, "profile", failing)
    with pytest.raises(eqgp.FitError) as info:
        eqgp.fit_hyperparameters(_gp(), obs, starts=2)
    assert_close(info.value.model.kernel.lengthscale, gp.kernel.lengthscale, rtol=1e-12)


@pytest.mark.slow  # CI's slow stage (keeps the main suite under ~5 min on 2 cores)
def test_fit_hyperparameters_interpolates_deterministic_data_without_failing():
    # Rosenbrock (a quartic): the likelihood drives the noise to where a plain Cholesky of the
    # gradient rows fails; the recipe's retries with jitter keep the line search going.
    def rosen(x):
        return (1 - x[0]) ** 2 + 100 * (x[1] - x[0] ** 2) ** 2

    X = jax.random.uniform(jax.random.key(0), (10, 2), jnp.float64, -2, 2)
    obs = eqgp.Observations.values_and_gradients(X, jax.vmap(rosen)(X), jax.vmap(jax.grad(rosen))(X))
    with pytest.warns(RuntimeWarning, match="jitter"):
        gp, report = eqgp.fit_hyperparameters(_gp(), obs, starts=2, max_steps=100)
        Xs = jax.random.uniform(jax.random.key(1), (200, 2), jnp.float64, -2, 2)
        ys = jax.vmap(rosen)(Xs)
        error = jnp.sqrt(jnp.mean((gp.condition(obs).mean(Xs) - ys) ** 2)) / jnp.std(ys)
    assert "error" not in report.reason and report.steps > 5
    assert float(error) < 0.1  # stopping at the first failure (the old behaviour): 0.61


def test_hyperparameter_entry_points_name_bad_arguments():
    obs = _obs(4)
    loss = lambda m, obs: -m.log_marginal_likelihood(obs)  # noqa: E731
    with pytest.raises(ValueError, match="`max_steps`"):
        eqgp.minimize(_gp(), loss, obs, max_steps=-1)
    with pytest.raises(ValueError, match="`gtol`"):
        eqgp.minimize(_gp(), loss, obs, gtol=float("nan"))
    with pytest.raises(TypeError, match="loss"):
        eqgp.minimize(_gp(), None, obs)
    with pytest.raises(ValueError, match="`starts`"):
        eqgp.initialise(_gp(), obs, starts=0)
    with pytest.raises(TypeError, match="`gp`"):
        eqgp.initialise(kernels.RBF(), obs)
    with pytest.raises(TypeError, match="profile"):
        _gp().log_marginal_likelihood(obs, profile="yes")  # noqa


def test_select_lengthscales_scores_are_the_criteria_and_the_best_is_kept():
    obs = _obs(10)
    gp = eqgp.GaussianProcess(kernels.Matern52([0.3, 0.4]), noise=1e-4)
    Xh = jax.random.uniform(jax.random.key(3), (6, 2), jnp.float64, -2, 2)
    held = eqgp.Observations.values_and_gradients(Xh, jax.vmap(_f)(Xh), jax.vmap(jax.grad(_f))(Xh))
    for criterion, validation in [("loo", None), ("validation", held), ("profile", None)]:
        model, sel = eqgp.select_lengthscales(
            gp, obs, criterion=criterion, validation=validation, factors=[1, 4, 16, 64], refine=1, search="grid"
        )
        assert len(sel.factors) == 6 and sel.factor == sel.factors[np.argmin(sel.scores)]
        assert_close(model.kernel.lengthscale, sel.factor * gp.kernel.lengthscale, rtol=1e-12)
        for f, s in zip(sel.factors, sel.scores):  # each score is its criterion, recomputed directly
            m = eqx.tree_at(lambda m: m.kernel, gp, kernels.Matern52(f * np.array([0.3, 0.4])))
            if criterion == "loo":
                want = np.mean(np.abs(m.leave_one_out(obs).blocks[0][0]))
            elif criterion == "validation":
                g = held.groups[0]
                want = np.mean(np.abs(m.condition(obs).mean(g.X, g.operator) - g.targets))
            else:
                want = -m.log_marginal_likelihood(obs, profile=True)
            assert_close(s, want, rtol=1e-8)
    # Data drawn from the model: leave-one-out picks the lengthscale that drew them (within 1.5x).
    X = jax.random.uniform(jax.random.key(1), (30, 2), jnp.float64, 0, 4)
    K = eqgp.operator_gram(
        kernels.RBF(0.8), [(eqgp.ValueAndGradient(), X)], [(eqgp.ValueAndGradient(), X)], "interleaved"
    )
    draw = np.linalg.cholesky(K + 1e-8 * np.eye(90)) @ np.random.default_rng(0).normal(size=90)
    sample = eqgp.Observations((eqgp.ValueAndGradient(), X, draw.reshape(30, 3)))
    _, sel = eqgp.select_lengthscales(eqgp.GaussianProcess(kernels.RBF(1.0), noise=1e-6), sample)
    assert 1 / 1.5 < sel.factor / 0.8 < 1.5, sel


def test_select_lengthscales_descends_to_the_grids_best_and_every_solver_scores_alike():
    obs = _obs(10)
    gp = eqgp.GaussianProcess(kernels.Matern52([0.3, 0.4]), noise=1e-4)
    grid = 2.0 ** np.arange(-4, 7)
    _, full = eqgp.select_lengthscales(gp, obs, factors=grid, refine=0, search="grid")
    _, walk = eqgp.select_lengthscales(gp, obs, factors=grid, refine=0)
    assert walk.factor == full.factor and len(walk.factors) < len(full.factors), (walk, full)
    for f, s in zip(walk.factors, walk.scores):  # the descent's scores are the grid's
        assert s == full.scores[list(full.factors).index(f)]
    # From lengthscales 16x too long it walks four grid steps (its start: the factor nearest 1).
    far_gp = eqx.tree_at(lambda m: m.kernel, gp, kernels.Matern52([4.8, 6.4]))
    _, far = eqgp.select_lengthscales(far_gp, obs, factors=2.0 ** np.arange(-8, 3), refine=0)
    assert far.factor == full.factor / 16, (far, full)
    # Cholesky scores from `condition`'s factor; other solvers from a dense factorisation.
    cg = eqgp.ConjugateGradient()
    _, other = eqgp.select_lengthscales(eqx.tree_at(lambda m: m.solver, gp, cg), obs, factors=grid, refine=0)
    assert other.factor == walk.factor
    assert_close(np.sort(other.scores), np.sort(walk.scores), rtol=1e-8)
    # The observations and the model survive the factor's donation.
    assert_close(gp.condition(obs).mean(obs.groups[0].X), obs.groups[0].targets[:, 0], atol=1e-2)


def test_select_lengthscales_warns_at_the_edge_and_names_bad_arguments():
    obs = _obs(8)
    gp = eqgp.GaussianProcess(kernels.RBF(1.0), noise=1e-3)
    with pytest.warns(UserWarning, match="at the edge of the grid"):
        eqgp.select_lengthscales(gp, obs, factors=[1e-3, 2e-3], refine=0)
    with pytest.raises(ValueError, match="`validation`"):
        eqgp.select_lengthscales(gp, obs, criterion="validation")
    with pytest.raises(ValueError, match="`validation`"):
        eqgp.select_lengthscales(gp, obs, validation=obs)
    with pytest.raises(ValueError, match="`criterion` must be one of"):
        eqgp.select_lengthscales(gp, obs, criterion="nll")
    with pytest.raises(ValueError, match="`factors` must be"):
        eqgp.select_lengthscales(gp, obs, factors=[0.0, 1.0])
    with pytest.raises(ValueError, match="no stationary lengthscale"):
        eqgp.select_lengthscales(eqgp.GaussianProcess(kernels.Linear(), noise=1e-3), obs)
    with pytest.raises(ValueError, match="`search` must be one of"):
        eqgp.select_lengthscales(gp, obs, search="random")
