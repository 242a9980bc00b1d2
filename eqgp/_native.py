"""The one native boundary: loads eqgp's extension modules and registers their XLA FFI
targets. Every user of native code (`_ops`, `_linalg`) imports what it needs from here;
nothing else imports an extension module.

- `_native_cpu` (always built): the linear recurrence, sumcumprod's Jacobian products and
  the LAPACK Cholesky inverse, registered for platform "cpu";
- `_native_cuda` (built where nvcc was found): the recurrence and the Jacobian products,
  registered for the CUDA plugin.

Registering needs no backend, so importing eqgp starts none; which platforms can actually
*run* the handlers (`native_platforms()`) is asked only when someone wants to know.
"""

import functools
import importlib

import jax


def _load(name: str):
    try:
        return importlib.import_module(f"{__package__}.{name}")
    except ImportError:
        return None


_cpu = _load("_native_cpu")
_cuda = _load("_native_cuda")

if _cpu is not None:
    for _name, _capsule in _cpu.registrations().items():
        jax.ffi.register_ffi_target(_name, _capsule, platform="cpu")
if _cuda is not None:
    for _name, _capsule in _cuda.registrations().items():
        # "CUDA", not "cuda": the name is matched verbatim against the CUDA plugin's.
        jax.ffi.register_ffi_target(_name, _capsule, platform="CUDA")

#: Platforms the extension has handlers for (the lowering rules are registered for these).
BUILT_PLATFORMS: tuple[str, ...] = tuple(p for p, m in (("cpu", _cpu), ("cuda", _cuda)) if m is not None)


def _register_lapack() -> bool:
    # scipy is a dependency of jax itself, and its LAPACK is the one jaxlib's CPU linear
    # algebra uses; without it (or without the extension) the generic path is used.
    if _cpu is None or not hasattr(_cpu, "set_lapack"):
        return False
    try:
        from scipy.linalg import cython_blas, cython_lapack

        capi = cython_lapack.__pyx_capi__
        _cpu.set_lapack(*(capi[name] for name in ("spotri", "dpotri", "spotrf", "dpotrf", "strtri", "dtrtri")))
        blas = cython_blas.__pyx_capi__
        _cpu.set_blas(*(blas[name] for name in ("strsm", "dtrsm", "ssyrk", "dsyrk", "sgemm", "dgemm")))
    except Exception:  # noqa: BLE001 -- any failure here means: use the generic path
        return False
    return True


#: Whether `eqgp_cholesky_inverse` (LAPACK ?potri) and `eqgp_cholesky_t` (?potrf, in place) are
#: available on CPU.
HAVE_NATIVE_INVERSE: bool = _register_lapack()


@functools.cache
def native_platforms() -> tuple[str, ...]:
    """The platforms on which the native handlers run here: built *and* present ("cuda"
    only where the CUDA module is built and JAX sees a CUDA device)."""

    def present(platform: str) -> bool:
        try:
            return len(jax.devices(platform)) > 0
        except RuntimeError:
            return False

    return tuple(p for p in BUILT_PLATFORMS if p == "cpu" or present(p))
