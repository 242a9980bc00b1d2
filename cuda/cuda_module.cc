// pybind11 module handing the CUDA FFI handler (compiled by nvcc in
// cuda_handlers.cu) to Python as a PyCapsule. Plain C++: no CUDA headers here.
#include <pybind11/pybind11.h>

#include "xla/ffi/api/api.h"
#include "xla/ffi/api/c_api.h"

namespace py = pybind11;

XLA_FFI_DECLARE_HANDLER_SYMBOL(EqgpLinearRecurrenceCuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(EqgpSumcumprodJvpCuda);

PYBIND11_MODULE(_native_cuda, m) {
  m.doc() = "eqgp CUDA XLA FFI handlers";
  m.def("registrations", []() {
    py::dict d;
    d["eqgp_linear_recurrence"] = py::capsule(reinterpret_cast<void*>(&EqgpLinearRecurrenceCuda));
    d["eqgp_sumcumprod_jvp"] = py::capsule(reinterpret_cast<void*>(&EqgpSumcumprodJvpCuda));
    return d;
  });
}
