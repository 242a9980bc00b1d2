// The LAPACK routines eqgp_cholesky_inverse[cpu] calls: spotri and dpotri, as the
// addresses scipy.linalg.cython_lapack exports (set once, at import).
#pragma once

void EqgpSetLapackPotri(void* spotri, void* dpotri);
