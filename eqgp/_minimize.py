"""Quasi-Newton training that converges: optax's L-BFGS with a zoom line search, compiled
in chunks of steps (a failed chunk loses nothing before it), optionally from several starting
models, keeping the best."""

import functools
import math
import warnings
from collections.abc import Callable

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jaxtyping import Array, Bool, Float, Int

from ._checks import check_int
from ._fit import FitError, _cause

# L-BFGS's defaults (`minimize`'s, and the screening of `fit_hyperparameters`, which must
# build the same optimiser to share minimize's compiled first step).
_MEMORY_SIZE, _LINESEARCH_STEPS = 10, 30

# Why a run stopped (FitReport.reason).
_RUNNING, _GTOL, _FTOL, _MAX_STEPS, _NONFINITE, _LINESEARCH, _FAILED = range(7)
_REASONS = {
    _RUNNING: "running",
    _GTOL: "converged: gradient max-norm <= gtol",
    _FTOL: "converged: relative decrease of the loss <= ftol",
    _MAX_STEPS: "stopped: max_steps reached",
    _NONFINITE: "stopped: the loss or its gradient became non-finite (kept the last finite model)",
    _LINESEARCH: (
        "stopped: the line search found no decrease (at a minimum to working precision where grad_norm is "
        "small; otherwise a noisy, non-smooth or unbounded loss)"
    ),
    _FAILED: "stopped: a step raised an error (kept the model before it)",
}


class FitReport(eqx.Module):
    """What `eqgp.minimize` did: for the start it kept, and the final loss of every start.

    - `loss`: the final loss of the kept start.
    - `steps`: L-BFGS iterations it took.
    - `grad_norm`: the max-norm of its final gradient (over the trained leaves).
    - `converged`: stopped by `gtol` or `ftol` (not by `max_steps`, a non-finite loss, a
      failed line search or an error).
    - `reason`: why it stopped, in words.
    - `start`: the index of the kept start (0 with a single model).
    - `losses`: `(starts,)` the final loss of every start (`inf` where a start failed).
    """

    loss: float
    steps: int
    grad_norm: float
    converged: bool
    reason: str
    start: int
    losses: np.ndarray

    def __repr__(self):
        return (
            f"FitReport(loss={self.loss:.6g}, steps={self.steps}, grad_norm={self.grad_norm:.3g}, "
            f"converged={self.converged}, reason={self.reason!r}, start={self.start}, "
            f"losses={np.array2string(np.asarray(self.losses), precision=5)})"
        )


class _Carry(eqx.Module):
    params: object
    opt_state: object
    value: Float[Array, ""]
    grad_norm: Float[Array, ""]
    steps: Int[Array, ""]
    reason: Int[Array, ""]


def _tree_max_abs(tree) -> Array:
    leaves = [jnp.max(jnp.abs(x), initial=0.0) for x in jax.tree.leaves(tree)]
    return jnp.max(jnp.stack(leaves)) if leaves else jnp.zeros(())


def _all_finite(tree) -> Bool[Array, ""]:
    leaves = [jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree)]
    return jnp.all(jnp.stack(leaves)) if leaves else jnp.asarray(True)


@functools.cache
def _solver(memory_size: int, linesearch_steps: int):
    # Cached: optax's transformations are closures, compared by identity as static arguments
    # of the compiled chunks, so a fresh one per call would recompile every call.
    return optax.lbfgs(
        memory_size=memory_size,
        linesearch=optax.scale_by_zoom_linesearch(max_linesearch_steps=linesearch_steps, initial_guess_strategy="one"),
    )


def _init_impl(params, static, loss, args, opt):
    fn = lambda p: loss(eqx.combine(p, static), *args)  # noqa: E731
    value, grad = jax.value_and_grad(fn)(params)
    ok = jnp.isfinite(value) & _all_finite(grad)
    # The state carries the value and gradient at the current point (the line search stores
    # them at each accepted point), so the iterations never evaluate them again: one copy of
    # the loss's value and gradient in the compiled loop (the line search's), not two.
    state = optax.tree_utils.tree_set(opt.init(params), value=value, grad=grad)
    # optax's line-search state starts with weakly typed scalars that the while loop returns
    # strongly typed: made strong here, the second chunk's arguments have the first chunk's
    # types, so a run longer than one chunk does not compile the chunk again.
    state = jax.tree.map(lambda x: jax.lax.convert_element_type(x, x.dtype) if eqx.is_array(x) else x, state)
    return _Carry(
        params,
        state,
        value,
        _tree_max_abs(grad),
        jnp.zeros((), jnp.int32),
        jnp.where(ok, _RUNNING, _NONFINITE).astype(jnp.int32),
    )


def _chunk_impl(carry: _Carry, static, loss, args, opt, limit: Int[Array, ""], gtol, ftol, max_steps):
    """Up to `limit` more L-BFGS iterations of one run."""
    fn = lambda p: loss(eqx.combine(p, static), *args)  # noqa: E731
    start = carry.steps

    def cond(c: _Carry):
        return (c.reason == _RUNNING) & (c.steps - start < limit)

    def body(c: _Carry):
        value = optax.tree_utils.tree_get(c.opt_state, "value")
        grad = optax.tree_utils.tree_get(c.opt_state, "grad")
        gnorm = _tree_max_abs(grad)
        with jax.numpy_dtype_promotion("standard"):
            updates, state = opt.update(grad, c.opt_state, c.params, value=value, grad=grad, value_fn=fn)
        params = optax.apply_updates(c.params, updates)
        new_value = optax.tree_utils.tree_get(state, "value")
        new_grad = optax.tree_utils.tree_get(state, "grad")
        finite = jnp.isfinite(new_value) & _all_finite(new_grad) & _all_finite(params)
        decrease = value - new_value
        scale = jnp.maximum(jnp.maximum(jnp.abs(value), jnp.abs(new_value)), 1.0)
        steps = c.steps + 1
        reason = jnp.select(
            [gnorm <= gtol, ~finite, decrease < 0, decrease <= ftol * scale, steps >= max_steps],
            [_GTOL, _NONFINITE, _LINESEARCH, _FTOL, _MAX_STEPS],
            _RUNNING,
        ).astype(jnp.int32)
        # Keep the current point where it already converged, or where the step went bad.
        keep_old = (gnorm <= gtol) | ~finite | (decrease < 0)
        pick = lambda new, old: jax.tree.map(lambda a, b: jnp.where(keep_old, b, a), new, old)  # noqa: E731
        return _Carry(
            pick(params, c.params),
            pick(state, c.opt_state),
            jnp.where(keep_old, value, new_value),
            jnp.where(keep_old, gnorm, _tree_max_abs(new_grad)),
            jnp.where(gnorm <= gtol, c.steps, steps),
            reason,
        )

    return jax.lax.while_loop(cond, body, carry)


_init = eqx.filter_jit(_init_impl)
_chunk = eqx.filter_jit(_chunk_impl)


# The batched starts: every start's value and gradient, and its L-BFGS iterations, in one
# program (`vmap` of the single-start functions; the while loops run until the last start
# stops, the stopped ones carried unchanged).
@eqx.filter_jit
def _init_batched(params, static, loss, args, opt):
    return jax.vmap(lambda p: _init_impl(p, static, loss, args, opt))(params)


@eqx.filter_jit
def _chunk_batched(carry: _Carry, static, loss, args, opt, limit: Int[Array, ""], gtol, ftol, max_steps):
    return jax.vmap(lambda c: _chunk_impl(c, static, loss, args, opt, limit, gtol, ftol, max_steps))(carry)


def _check_tolerance(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < math.inf:
        raise ValueError(f"`{name}` must be a finite number >= 0; got {value!r}.")
    return float(value)


def minimize(
    model,
    loss: Callable,
    *args,
    starts: int | None = None,
    max_steps: int = 500,
    gtol: float = 1e-5,
    ftol: float = 1e-10,
    memory_size: int = _MEMORY_SIZE,
    linesearch_steps: int = _LINESEARCH_STEPS,
    chunk: int = 50,
    batched: bool | None = None,
):
    """Train `model` by minimising `loss(model, *args)` with L-BFGS (optax's, with a zoom
    line search) until it converges: the quasi-Newton counterpart of `eqgp.fit`, on the same
    loss functions (e.g. `lambda m, obs: -m.log_marginal_likelihood(obs)`).

    It stops when the gradient's max-norm over the trained leaves is `<= gtol`, when a step
    decreases the loss by `<= ftol * max(|loss|, 1)` (scipy's L-BFGS-B tests the same two),
    after `max_steps` iterations, when the line search finds no decrease, or at a non-finite
    loss, keeping the last finite model. The iterations run compiled (`jax.lax.while_loop`
    under `eqx.filter_jit`) in chunks of `chunk` steps: a step that raises (e.g. a failed
    factorisation) is found by redoing its chunk one step at a time: the model from before
    that step is kept and reported.

    **Multi-start.** With `starts=n`, `model`'s inexact leaves carry a leading axis of `n`
    starting points (as `eqgp.initialise(gp, obs, starts=n)` or `eqx.filter_vmap` build),
    and the one with the lowest final loss is returned, unbatched; a start that fails is
    dropped (its loss reported as `inf`). With `batched=True` the starts run together, `vmap`
    over the starts in one compiled program (each chunk's loop runs until its last start
    stops; stopped starts are carried unchanged); where a batched call raises (one start's
    step failed, or the batch ran out of memory), the starts still running go on one by one
    from the last batched state. With
    `batched=False` they run one after another (one compiled program for all). The default
    batches on accelerators and runs the starts one after another on CPU, where batching
    was slower (8 starts, 30 and 240 rows) and where jaxlib's batched LAPACK kernels
    (triangular solves over a batch) can deadlock XLA's CPU thread pool: with 2 threads,
    two of them waited on each other for good at 240 rows. `batched=True` on CPU warns.

    The loss must be deterministic: with `eqgp.ConjugateGradient` keep `key=None` (a fixed
    probe set), not a fresh key per step.

    **Arguments:**

    - `model`: an Equinox module (e.g. `eqgp.GaussianProcess`); its inexact arrays train.
    - `loss`: `loss(model, *args) -> scalar`.
    - `*args`: passed to `loss` after the model (data as arguments, not constants).
    - `starts`: `None` (one model) or the number of stacked starting models.
    - `batched`: run the starts together (`vmap`) or one after another; `None`: together
      except on CPU.
    - `max_steps`, `gtol`, `ftol`: the stopping rules above.
    - `memory_size`: L-BFGS's history length; `linesearch_steps`: the zoom line search's
      budget per iteration; `chunk`: iterations per compiled call.

    **Returns:** `(trained_model, report)`, `report` an `eqgp.FitReport`.

    ```python
    gp, report = eqgp.minimize(gp, lambda m, obs: -m.log_marginal_likelihood(obs), obs)
    ```
    """
    if not callable(loss):
        raise TypeError(f"`loss` must be a callable `loss(model, *args) -> scalar`; got {loss!r:.80}.")
    if any(isinstance(x, jax.core.Tracer) for x in jax.tree.leaves((model, args))):
        raise TypeError(
            "eqgp.minimize cannot run under jit, vmap or grad: it runs compiled chunks of L-BFGS steps "
            "from Python (and keeps the model when a chunk fails). Call it outside any transformation."
        )
    max_steps = check_int("max_steps", max_steps, 0)
    memory_size = check_int("memory_size", memory_size, 1)
    linesearch_steps = check_int("linesearch_steps", linesearch_steps, 1)
    chunk = check_int("chunk", chunk, 1)
    gtol, ftol = _check_tolerance("gtol", gtol), _check_tolerance("ftol", ftol)
    params, static = eqx.partition(model, eqx.is_inexact_array)
    if not jax.tree.leaves(params):
        raise ValueError("`model` has no inexact array leaves to train (hyper-parameters held as Python floats?).")
    if starts is not None:
        starts = check_int("starts", starts, 1)
        shapes = {tuple(x.shape[:1]) for x in jax.tree.leaves(params)}
        if shapes != {(starts,)}:
            raise ValueError(
                f"with `starts={starts}`, every inexact leaf of `model` must have a leading axis of size {starts} "
                f"(build the starts with `eqgp.initialise(..., starts={starts})` or `eqx.filter_vmap`); got leading "
                f"sizes {sorted(s[0] if s else None for s in shapes)}."
            )
    batched = _batched(batched) if starts is not None else False
    opt = _solver(memory_size, linesearch_steps)
    settings = dict(gtol=gtol, ftol=ftol, max_steps=max_steps)

    def run(start, carry=None, batched=False):
        """One run from the parameters `start` (or on from `carry`): `(carry, error)`, `carry`
        the last state reached (None where the starting loss itself failed), `error` the
        exception that stopped it. `batched`: `start` holds the stacked starts, run together
        (a failure is returned, not retried step by step: the caller goes on one by one)."""
        init, step = (_init_batched, _chunk_batched) if batched else (_init, _chunk)
        if carry is None:
            try:
                carry = init(start, static, loss, args, opt)
                if max_steps == 0:
                    stopped = jnp.where(carry.reason == _RUNNING, _MAX_STEPS, carry.reason).astype(jnp.int32)
                    carry = eqx.tree_at(lambda c: c.reason, carry, stopped)
            except Exception as e:  # noqa: BLE001 - reported in the FitReport / FitError
                if isinstance(e, KeyboardInterrupt):
                    raise
                return None, e
        limit = chunk
        while bool(jnp.any(carry.reason == _RUNNING)):
            try:
                carry = step(carry, static, loss, args, opt, jnp.asarray(limit), **settings)
            except Exception as e:  # noqa: BLE001 - reported in the FitReport / FitError
                if isinstance(e, KeyboardInterrupt):
                    raise
                if limit == 1 or batched:
                    return carry, e
                limit = 1  # redo the failed chunk one step at a time: lose only the failing step
        return carry, None

    if starts is None:
        carry, error = run(params)
        if carry is None:
            raise FitError(
                f"eqgp.minimize: the starting model's loss failed ({type(error).__name__}): {_cause(error)}",
                model,
                jnp.zeros((0,)),
                0,
            ) from error
        reason = _FAILED if error is not None else int(carry.reason)
        return eqx.combine(carry.params, static), _report(carry, reason, 0, np.asarray([float(carry.value)]))

    carries, errors = [None] * starts, [None] * starts
    pending = range(starts)
    if batched:
        # All starts in one program. Where a batched call raises (one start's step failed:
        # its error stops the batch), the starts go on one by one from the last batched state.
        batch, error = run(params, batched=True)
        if batch is not None:
            carries = [jax.tree.map(lambda x, i=i: x[i], batch) for i in range(starts)]
            pending = [] if error is None else [i for i, c in enumerate(carries) if int(c.reason) == _RUNNING]
    for i in pending:
        carries[i], errors[i] = run(jax.tree.map(lambda x, i=i: x[i], params), carry=carries[i])
    finals = [np.inf if c is None else float(c.value) for c in carries]
    reasons = [_FAILED if e is not None else int(c.reason) for c, e in zip(carries, errors)]
    first_error = next((e for e in errors if e is not None), None)
    finite = np.where(np.isfinite(finals), finals, np.inf)
    if not np.isfinite(finite).any():
        raise FitError(
            f"eqgp.minimize: every one of the {starts} starts failed or has a non-finite loss"
            + (f" (first error: {_cause(first_error)})" if first_error is not None else ""),
            model,
            jnp.asarray(finals),
            0,
        )
    best = int(np.argmin(finite))
    chosen = carries[best]
    return eqx.combine(chosen.params, static), _report(chosen, reasons[best], best, finite)


def _batched(batched: bool | None) -> bool:
    """Whether to run stacked starts together (`vmap`); see `minimize`'s multi-start."""
    if batched is not None and not isinstance(batched, bool):
        raise TypeError(f"`batched` must be True, False or None; got {batched!r}.")
    cpu = jax.default_backend() == "cpu"
    if batched and cpu:
        warnings.warn(
            "eqgp.minimize(batched=True) on CPU: jaxlib's batched LAPACK kernels can deadlock XLA's CPU "
            "thread pool (seen with 2 threads at a few hundred rows), and running the starts one after "
            "another was faster on CPU. `batched=None` (the default) does that.",
            RuntimeWarning,
            stacklevel=3,
        )
    return (not cpu) if batched is None else batched


def _report(carry: _Carry, reason: int, start: int, losses) -> FitReport:
    return FitReport(
        loss=float(carry.value),
        steps=int(carry.steps),
        grad_norm=float(carry.grad_norm),
        converged=reason in (_GTOL, _FTOL),
        reason=_REASONS[reason],
        start=start,
        losses=np.asarray(losses, dtype=float),
    )
