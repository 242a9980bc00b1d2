import equinox as eqx
from jaxtyping import Array, Float

from ._ops import sumcumprod


class SumCumProd(eqx.Module):
    """The native `eqgp.ops.sumcumprod` as an Equinox layer.

    Maps `x` to `y[..., i] = sum_{j >= i} prod_{k=i..j} x[..., k]` along `axis` (default
    the last), or with `reverse=False` to the forward form `sum_{j <= i} prod_{k=j..i}`.
    It has no parameters, so it composes with anything: inside an `eqx.nn.Sequential`,
    under `eqx.filter_jit`/`filter_vmap`/`filter_grad`, and as (the end of) the warp of
    an `eqgp.kernels.Warped` kernel, whose derivative blocks then differentiate through
    the native op. Feed it values in `(0, 1)` (e.g. after a sigmoid) to keep the output
    bounded.
    """

    axis: int = eqx.field(static=True, default=-1)
    reverse: bool = eqx.field(static=True, default=True)

    def __call__(self, x: Float[Array, "*batch n"], *, key=None) -> Float[Array, "*batch n"]:
        """**Arguments:** `x`, shape `(..., n)`, float32 or float64; `key` is ignored
        (accepted so the layer fits in `eqx.nn.Sequential`).

        **Returns:** an array of the shape and dtype of `x`.
        """
        del key
        return sumcumprod(x, self.axis, self.reverse)
