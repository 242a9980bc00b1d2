// The LAPACK routines eqgp_cholesky_inverse[cpu] and eqgp_cholesky_t[cpu] call: ?potri and
// ?potrf, as the addresses scipy.linalg.cython_lapack exports (set once, at import).
#pragma once

void EqgpSetLapackPotri(void* spotri, void* dpotri);
void EqgpSetLapackPotrf(void* spotrf, void* dpotrf);
void EqgpSetLapackTrtri(void* strtri, void* dtrtri);
void EqgpSetBlas(void* strsm, void* dtrsm, void* ssyrk, void* dsyrk, void* sgemm, void* dgemm);
