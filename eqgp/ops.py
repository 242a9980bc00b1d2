"""Native operations (XLA FFI, C++ and CUDA) and their pure-JAX references."""

from ._native import native_platforms as native_platforms
from ._ops import (
    linear_recurrence as linear_recurrence,
    linear_recurrence_reference as linear_recurrence_reference,
    sumcumprod as sumcumprod,
    sumcumprod_reference as sumcumprod_reference,
)


def __getattr__(name: str):
    # The platforms that run the native handlers here, e.g. ("cpu",) or ("cpu", "cuda");
    # computed on first access (it needs a backend, which importing eqgp must not start).
    if name == "NATIVE_PLATFORMS":
        return native_platforms()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
