// pybind11 module handing eqgp's CPU FFI handlers to Python as PyCapsules, and
// taking the LAPACK routines the Cholesky inverse calls.
#include <type_traits>

#include <pybind11/pybind11.h>

#include "cpu_cholesky_inverse.h"
#include "xla/ffi/api/api.h"
#include "xla/ffi/api/c_api.h"

namespace py = pybind11;

XLA_FFI_DECLARE_HANDLER_SYMBOL(EqgpLinearRecurrenceCpu);
XLA_FFI_DECLARE_HANDLER_SYMBOL(EqgpSumcumprodJvpCpu);
XLA_FFI_DECLARE_HANDLER_SYMBOL(EqgpCholeskyInverseCpu);
XLA_FFI_DECLARE_HANDLER_SYMBOL(EqgpCholeskyTCpu);

template <typename T>
py::capsule EncapsulateFfiHandler(T* fn) {
  static_assert(std::is_invocable_r_v<XLA_FFI_Error*, T, XLA_FFI_CallFrame*>,
                "Encapsulated function must be an XLA FFI handler");
  return py::capsule(reinterpret_cast<void*>(fn));
}

// The function pointer a scipy `__pyx_capi__` capsule holds.
void* CapsulePointer(const py::capsule& c) {
  void* p = PyCapsule_GetPointer(c.ptr(), PyCapsule_GetName(c.ptr()));
  if (p == nullptr) throw py::error_already_set();
  return p;
}

PYBIND11_MODULE(_native_cpu, m) {
  m.doc() = "eqgp CPU XLA FFI handlers";
  m.def("registrations", []() {
    py::dict d;
    d["eqgp_linear_recurrence"] = EncapsulateFfiHandler(EqgpLinearRecurrenceCpu);
    d["eqgp_sumcumprod_jvp"] = EncapsulateFfiHandler(EqgpSumcumprodJvpCpu);
    d["eqgp_cholesky_inverse"] = EncapsulateFfiHandler(EqgpCholeskyInverseCpu);
    d["eqgp_cholesky_t"] = EncapsulateFfiHandler(EqgpCholeskyTCpu);
    return d;
  });
  // spotri, dpotri, spotrf and dpotrf as the PyCapsules of scipy.linalg.cython_lapack.__pyx_capi__.
  // (and strtri, dtrtri)
  m.def("set_lapack", [](py::capsule spotri, py::capsule dpotri, py::capsule spotrf, py::capsule dpotrf,
                         py::capsule strtri, py::capsule dtrtri) {
    void* si = CapsulePointer(spotri);
    void* di = CapsulePointer(dpotri);
    void* sf = CapsulePointer(spotrf);
    void* df = CapsulePointer(dpotrf);
    void* st = CapsulePointer(strtri);
    void* dt = CapsulePointer(dtrtri);
    EqgpSetLapackPotri(si, di);
    EqgpSetLapackPotrf(sf, df);
    EqgpSetLapackTrtri(st, dt);
  });
  // strsm, dtrsm, ssyrk, dsyrk, sgemm, dgemm from scipy.linalg.cython_blas.__pyx_capi__.
  m.def("set_blas", [](py::capsule strsm, py::capsule dtrsm, py::capsule ssyrk, py::capsule dsyrk, py::capsule sgemm,
                       py::capsule dgemm) {
    void* st = CapsulePointer(strsm);
    void* dt = CapsulePointer(dtrsm);
    void* ss = CapsulePointer(ssyrk);
    void* ds = CapsulePointer(dsyrk);
    void* sg = CapsulePointer(sgemm);
    void* dg = CapsulePointer(dgemm);
    EqgpSetBlas(st, dt, ss, ds, sg, dg);
  });
}
