import functools
import math
import sys
import warnings
import weakref
from collections.abc import Callable

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
from tqdm.auto import tqdm


class FitError(RuntimeError):
    """`eqgp.fit` stopped early: a non-finite loss or a failed step (e.g. a Cholesky
    factorisation that failed). Nothing trained is lost: `model` is the last model whose
    loss was finite, `losses` the finite losses up to it, `step` the step that failed."""

    def __init__(self, message: str, model, losses, step: int):
        super().__init__(message)
        self.model = model
        self.losses = losses
        self.step = step


def fit(
    model,
    loss: Callable,
    optimizer: optax.GradientTransformation,
    steps: int,
    *args,
    progress: bool = True,
    compiler_options: dict[str, str] | None = None,
):
    """Train `model` by minimising `loss(model, *args)` with an optax optimizer.

    Exactly the idiomatic loop: `eqx.filter_jit` around one step of
    `eqx.filter_value_and_grad` → `optimizer.update` → `eqx.apply_updates`, over the
    model's inexact-array leaves (a hyper-parameter held as a Python float is not one).

    Nothing is lost when training goes wrong:

    - the first non-finite loss, or a step that raises (e.g. a failed Cholesky
      factorisation), stops training with an `eqgp.FitError` naming the step, carrying
      `.model` (the last model whose loss was finite) and `.losses` (the losses so far);
    - Ctrl-C (`KeyboardInterrupt`) returns `(model, losses)` so far, with a warning;
    - a run whose loss ends above where it started (a negative or too large learning rate)
      or that changed no trained array (a loss that ignores the model it is given) returns
      with a warning.

    Calling `fit` again with the same `loss` and `optimizer` objects and the same shapes
    (a warm-started refit) reuses the compiled step; pass data through `*args` rather than
    a new closure per call to benefit.

    The progress bar (tqdm) starts after the first step, so compilation is not in its
    rate; without a terminal it prints a line every 30 s instead of redrawing.

    **Arguments:**

    - `model`: any Equinox module (e.g. an `eqgp.GaussianProcess`); its inexact arrays train.
    - `loss`: `loss(model, *args) -> scalar`, e.g. `lambda m: -m.log_marginal_likelihood(obs)`.
    - `optimizer`: an `optax.GradientTransformation`, e.g. `optax.adam(1e-2)`.
    - `steps`: the number of steps, a non-negative int.
    - `*args`: passed to `loss` after the model (so data need not be closed over).
    - `progress`: show the tqdm bar.
    - `compiler_options`: XLA options for the compiled step (opt-in, e.g.
      `eqgp.compiler_options()`); `None` compiles with XLA's defaults.

    **Returns:** `(trained_model, losses)`, `losses` of shape `(steps,)`.

    ```python
    gp, losses = eqgp.fit(gp, lambda m, obs: -m.log_marginal_likelihood(obs), optax.adam(1e-2), 300, obs)
    ```
    """
    if not isinstance(steps, int) or isinstance(steps, bool) or steps < 0:
        raise ValueError(f"`steps` must be a non-negative int; got {steps!r}.")
    if any(isinstance(x, jax.core.Tracer) for x in jax.tree.leaves((model, args))):
        raise TypeError(
            "eqgp.fit cannot run under jit, vmap or grad: it is a Python loop around a compiled step "
            "(and stops, keeping the model, on a failed step). Call it outside any transformation; to "
            "compile a whole training run, write the loop yourself with `jax.lax.scan` over your own step."
        )
    if not callable(loss):
        raise TypeError(f"`loss` must be a callable `loss(model, *args) -> scalar`; got {loss!r:.80}.")
    if not jax.tree.leaves(eqx.filter(model, eqx.is_inexact_array)):
        raise ValueError(
            "`model` has no inexact array leaves to train (hyper-parameters held as Python floats?); "
            f"got {type(model).__name__}."
        )
    if not isinstance(optimizer, optax.GradientTransformation):
        hint = " (a factory: call it, e.g. `optax.adam(1e-2)`)" if callable(optimizer) else ""
        raise TypeError(f"`optimizer` must be an optax.GradientTransformation; got {optimizer!r:.80}{hint}.")
    if compiler_options is not None and not (
        isinstance(compiler_options, dict) and all(isinstance(k, str) for k in compiler_options)
    ):
        raise TypeError(f"`compiler_options` must be None or a dict of XLA options; got {compiler_options!r:.80}.")
    opt_state = optimizer.init(eqx.filter(model, eqx.is_inexact_array))

    step = _stepper(loss, optimizer, tuple(sorted((compiler_options or {}).items())))

    losses: list[float] = []
    start = model
    bar = None
    i = 0
    prev = model
    try:
        for i in range(steps):
            try:
                new_model, opt_state, value = step(model, opt_state, *args)
                value = float(value)
            except KeyboardInterrupt:
                raise
            except Exception as e:  # noqa: BLE001 - re-raised with the model attached
                if "KeyboardInterrupt" in str(e):  # Ctrl-C while a host callback ran
                    raise KeyboardInterrupt from e
                raise FitError(
                    f"eqgp.fit: step {i} failed ({type(e).__name__}); `.model` is the last model whose "
                    f"loss was finite (step {max(i - 1, 0)}) and `.losses` the {len(losses)} losses so far. "
                    f"Cause: {_cause(e)}",
                    prev if losses else model,
                    _stack(losses),
                    i,
                ) from e
            if not math.isfinite(value):
                where = (
                    f"`.model` is the model of step {i - 1} (last finite loss {losses[-1]:.6g})"
                    if losses
                    else "the starting model's loss is not finite (check the data and the initial "
                    "hyper-parameters); `.model` is the model you passed"
                )
                hint = " Lower the learning rate, or bound the noise from below (`noise_floor`)." if losses else ""
                raise FitError(
                    f"eqgp.fit: the loss at step {i} is {value}; {where} and `.losses` the {len(losses)} "
                    f"finite losses.{hint}",
                    prev if losses else model,
                    _stack(losses),
                    i,
                )
            losses.append(value)
            prev, model = model, new_model
            if progress and bar is None and steps > 1:  # after the compiling first step
                tty = sys.stderr.isatty()
                bar = tqdm(total=steps, initial=1, desc="fit", mininterval=0.1 if tty else 30.0)
            elif bar is not None:
                bar.update(1)
            if bar is not None and (i % 10 == 0 or i == steps - 1):
                bar.set_postfix(loss=f"{value:.4g}", refresh=False)
    except KeyboardInterrupt:
        warnings.warn(
            f"eqgp.fit: interrupted at step {i}; returning the model and the {len(losses)} losses so far.",
            stacklevel=2,
        )
    finally:
        if bar is not None:
            bar.close()
    _warn_if_rose(losses)
    if len(losses) >= 2 and _unchanged(start, model):
        warnings.warn(
            f"eqgp.fit: no trained array changed in {len(losses)} steps: does `loss` depend on the model it is "
            "given (not on a model it closes over)? Is the learning rate 0?",
            stacklevel=2,
        )
    return model, _stack(losses)


def _unchanged(a, b) -> bool:
    pa, pb = (jax.tree.leaves(eqx.filter(m, eqx.is_inexact_array)) for m in (a, b))
    return all(bool(jnp.array_equal(x, y)) for x, y in zip(pa, pb))


def _warn_if_rose(losses: list[float]) -> None:
    """A training run that ends well above where it started (a negative or too large
    learning rate, or an optimizer that ascends) must not pass silently."""
    if len(losses) < 10:
        return
    first, last = losses[0], float(np.median(losses[-5:]))
    if last > first + 1e-3 * max(abs(first), 1.0):
        warnings.warn(
            f"eqgp.fit: the loss rose over training, from {first:.6g} at step 0 to {last:.6g} (median of the "
            "last 5 steps): is the learning rate negative or too large, or the loss's sign flipped?",
            stacklevel=3,
        )


def _step(model, opt_state, args, loss, optimizer):
    value, grads = eqx.filter_value_and_grad(loss)(model, *args)
    params = eqx.filter(model, eqx.is_inexact_array)
    with jax.numpy_dtype_promotion("standard"):  # optax's Adam mixes its int32 count and floats
        updates, opt_state = optimizer.update(grads, opt_state, params)
    return eqx.apply_updates(model, updates), opt_state, value


def _jitted_step(loss_ref: Callable, optimizer, options: tuple):
    @functools.partial(eqx.filter_jit, compiler_options=dict(options) or None)
    def step(model, opt_state, *args):
        return _step(model, opt_state, args, loss_ref(), optimizer)

    return step


# The compiled step per (loss, optimizer), so that calling `fit` again with the same two
# objects and shapes (a Bayesian-optimisation loop refits every iteration) does not trace
# and compile again. Keyed weakly on `loss`, which the step reaches through a weak
# reference: a loss that the caller drops (and the data it closes over) is freed.
_STEPS: "weakref.WeakKeyDictionary[Callable, dict]" = weakref.WeakKeyDictionary()


def _stepper(loss: Callable, optimizer, options: tuple):
    try:
        per_loss = _STEPS.setdefault(loss, {})
        hash((optimizer, options))
    except TypeError:  # not weakly referenceable, or an unhashable optimizer: compiled per call
        return _jitted_step(lambda: loss, optimizer, options)
    if (optimizer, options) not in per_loss:
        per_loss[optimizer, options] = _jitted_step(weakref.ref(loss), optimizer, options)
    return per_loss[optimizer, options]


def _cause(e: Exception) -> str:
    """The message of `e` without the traceback text JAX/equinox runtime errors carry."""
    text = str(e)
    for marker in ("EquinoxRuntimeError: ", "XlaRuntimeError: "):
        if marker in text:
            text = text.rsplit(marker, 1)[1]
    return text.strip().split("\n", 1)[0]


def _stack(losses: list[float]):
    return jnp.asarray(np.asarray(losses, dtype=float))
