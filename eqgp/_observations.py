from collections.abc import Sequence

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Float

from ._checks import as_points
from ._operators import AbstractOperator, Gradient, Value, ValueAndGradient


class ObservationGroup(eqx.Module):
    """Targets of one observation operator at a set of points.

    `targets[i, p]` is output `p` of `operator` at `X[i]`; `noise` is a known (fixed)
    noise variance, a scalar, one per output or one per target (heteroscedastic, as
    GPyTorch's `FixedNoiseGaussianLikelihood`), added to the model's trainable noise.
    """

    operator: AbstractOperator
    X: Float[Array, "N D"]
    targets: Float[Array, "N P"]
    noise: Float[Array, "..."]

    def __init__(self, operator: AbstractOperator, X, targets, noise: ArrayLike = 0.0):
        """**Arguments:** `operator` (e.g. `eqgp.Gradient()`), points `X` `(N, D)`,
        `targets` `(N, P)` (or `(N,)` when the operator has one output), and a known
        noise variance `noise`, default 0: a scalar, `(P,)` (one per output), or `(N, P)`
        (one per target; `(N,)` when the operator has one output). A large known noise
        makes a target uninformative, which pads observations to a fixed size (one
        compiled program for a growing data set)."""
        if not isinstance(operator, AbstractOperator):
            raise TypeError(f"`operator` must be an eqgp operator such as eqgp.Value(); got {operator!r:.80}.")
        X = as_points("X", X)
        P = operator.size(X.shape[1])
        t = jnp.asarray(targets)
        if not jnp.issubdtype(t.dtype, jnp.floating):
            raise TypeError(f"`targets` must be floating-point; got dtype {t.dtype}.")
        if t.ndim == 1 and P == 1:
            t = t[:, None]
        if t.shape != (X.shape[0], P):
            raise ValueError(
                f"`targets` for {type(operator).__name__} at {X.shape[0]} points in "
                f"{X.shape[1]} dimensions must have shape {(X.shape[0], P)}"
                f"{' or ' + str((X.shape[0],)) if P == 1 else ''}; got {tuple(t.shape)}."
            )
        if t.dtype != X.dtype:
            raise TypeError(f"`targets` ({t.dtype}) and `X` ({X.dtype}) must share a dtype.")
        noise = jnp.asarray(noise, dtype=X.dtype)
        N = X.shape[0]
        if noise.ndim == 1 and P == 1 and noise.shape != (1,):
            noise = noise[:, None]
        if noise.shape not in ((), (P,), (N, P)):
            raise ValueError(
                f"`noise` must be a scalar, shape ({P},) (one per output) or {(N, P)} (one per target"
                f"{'; or (' + str(N) + ',)' if P == 1 else ''}); got {tuple(noise.shape)}."
            )
        if isinstance(noise, jax.core.Tracer):  # under jit: checked when the value exists
            noise = eqx.error_if(noise, ~jnp.all(noise >= 0), "`noise` of an observation group must be non-negative.")
        elif bool(np.any(~(np.asarray(noise) >= 0))) or not bool(np.all(np.isfinite(np.asarray(noise)))):
            raise ValueError(f"`noise` must be non-negative and finite; got {noise}.")
        self.operator = operator
        self.X = X
        self.targets = t
        self.noise = noise

    @property
    def size(self) -> int:
        return self.targets.size

    def flat_targets(self) -> Float[Array, " NP"]:
        """Targets in component-major order: all points' first output, then the second, ..."""
        return self.targets.T.reshape(-1)


class Observations(eqx.Module):
    """Groups of linear observations of one latent function: values only, gradients only,
    both, partial gradients, at different point sets, all through one path.

    Build it from `ObservationGroup`s or from `(operator, X, targets[, noise])` tuples;
    `Observations.values(X, y)`, `Observations.gradients(X, G)` and
    `Observations.values_and_gradients(X, y, G)` cover the common cases.
    """

    groups: tuple[ObservationGroup, ...]

    def __init__(self, *groups):
        """**Arguments:** one or more `ObservationGroup`s or `(operator, X, targets[, noise])`."""
        if len(groups) == 1 and isinstance(groups[0], Sequence) and not isinstance(groups[0], tuple):
            groups = tuple(groups[0])
        out = []
        for i, g in enumerate(groups):
            if isinstance(g, ObservationGroup):
                out.append(g)
            elif isinstance(g, tuple) and len(g) in (3, 4):
                out.append(ObservationGroup(*g))
            else:
                raise TypeError(
                    f"group {i} must be an ObservationGroup or (operator, X, targets[, noise]); got {g!r:.80}."
                )
        if not out:
            raise ValueError("`Observations` needs at least one group.")
        D = out[0].X.shape[1]
        for i, g in enumerate(out):
            as_points(f"group {i} X", g.X, D)
            if g.X.dtype != out[0].X.dtype:
                raise TypeError(
                    f"every group must share one dtype; group 0 is {out[0].X.dtype}, group {i} is {g.X.dtype}."
                )
        self.groups = tuple(out)

    @classmethod
    def values(cls, X, y, noise: ArrayLike = 0.0) -> "Observations":
        """Function values `y` `(N,)` at `X` `(N, D)`."""
        return cls(ObservationGroup(Value(), X, y, noise))

    @classmethod
    def gradients(cls, X, G, noise: ArrayLike = 0.0) -> "Observations":
        """Gradients `G` `(N, D)` at `X` `(N, D)`."""
        return cls(ObservationGroup(Gradient(), X, G, noise))

    @classmethod
    def values_and_gradients(cls, X, y, G, noise: ArrayLike = 0.0) -> "Observations":
        """Values `y` `(N,)` and gradients `G` `(N, D)` at the same points `X`, as one group
        (one `(D + 1)`-output operator; `noise` may be `(D + 1,)`: value then each
        derivative)."""
        y = jnp.asarray(y)
        G = jnp.asarray(G)
        if y.ndim != 1 or G.ndim != 2 or G.shape[0] != y.shape[0]:
            raise ValueError(f"`y` must be (N,) and `G` (N, D); got {tuple(y.shape)} and {tuple(G.shape)}.")
        return cls(ObservationGroup(ValueAndGradient(), X, jnp.concatenate([y[:, None], G], 1), noise))

    @property
    def dim(self) -> int:
        return self.groups[0].X.shape[1]

    @property
    def size(self) -> int:
        """Total number of scalar observations."""
        return sum(g.size for g in self.groups)

    def flat_targets(self) -> Float[Array, " R"]:
        return jnp.concatenate([g.flat_targets() for g in self.groups])
