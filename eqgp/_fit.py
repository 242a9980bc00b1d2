import functools
from collections.abc import Callable

import equinox as eqx
import jax.numpy as jnp
import optax

from ._jit import compiler_options


def fit(
    model,
    loss: Callable,
    optimizer: optax.GradientTransformation,
    steps: int,
    *args,
    progress: bool = True,
):
    """Train `model` by minimising `loss(model, *args)` with an optax optimizer.

    Exactly the idiomatic loop: `eqx.filter_jit` (with `eqgp.compiler_options()`) around one step of
    `eqx.filter_value_and_grad` → `optimizer.update` → `eqx.apply_updates`, over the
    model's inexact-array leaves, with a tqdm progress bar when tqdm is installed and
    `progress` is true.

    **Returns:** `(trained_model, losses)`, `losses` of shape `(steps,)`.
    """
    if not isinstance(steps, int) or steps < 0:
        raise ValueError(f"`steps` must be a non-negative int; got {steps!r}.")
    opt_state = optimizer.init(eqx.filter(model, eqx.is_inexact_array))

    @functools.partial(eqx.filter_jit, compiler_options=compiler_options())
    def step(model, opt_state, *args):
        value, grads = eqx.filter_value_and_grad(loss)(model, *args)
        params = eqx.filter(model, eqx.is_inexact_array)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return eqx.apply_updates(model, updates), opt_state, value

    it = range(steps)
    bar = None
    if progress:
        try:
            from tqdm.auto import tqdm

            it = bar = tqdm(it, desc="fit")
        except ImportError:
            pass
    losses = []
    for i in it:
        model, opt_state, value = step(model, opt_state, *args)
        losses.append(value)
        if bar is not None and (i % 10 == 0 or i == steps - 1):
            bar.set_postfix(loss=f"{float(value):.4g}")
    return model, jnp.stack(losses) if losses else jnp.zeros((0,))
