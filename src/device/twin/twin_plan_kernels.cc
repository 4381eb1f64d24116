// The GPU planner's kernels (device_plan_ops.h) on the twin CUDA runtime (a build with
// FUSCO_TWIN_CUDA): each call is one item on its stream that runs the steps' host twin
// (plan_twin.cc) when the stream reaches it, over the same device buffers. The planner also runs
// without a communicator: its first use on a device loads every kernel, as with CUDA.
#include <twin_cuda.h>

#include "core/result.h"
#include "device/device_plan_ops.h"
#include "device/kernel_grid.cuh"
#include "device/kernel_load.h"

namespace fusco {

namespace {

const char kPlanStep = 0;  // the planner's step kernels, as one identity

template <typename Body>
fuscoResult_t planLaunch(void* stream, const char* what, Body body) {
  FUSCO_CHECK(deviceLoadKernelsHere());
  twincuda::Launch l;
  l.kernel = &kPlanStep;
  l.stream = static_cast<cudaStream_t>(stream);
  l.what = what;
  l.body = body;
  const cudaError_t e = twincuda::launch(std::move(l));
  return e == cudaSuccess ? fuscoSuccess : FUSCO_CUDA_FAIL(e, kPlan, what);
}

}  // namespace

fuscoResult_t devicePlanSend(const gplan::SendArgs& a, void* stream) {
  return planLaunch(stream, "send side", [a] { hostPlanSend(a); });
}

fuscoResult_t devicePlanTermRows(const gplan::SendArgs& a, const int64_t* remoteFan, void* stream) {
  return planLaunch(stream, "term rows", [a, remoteFan] { hostPlanTermRows(a, remoteFan); });
}

fuscoResult_t devicePlanRecv(const gplan::RecvArgs& a, void* stream) {
  return planLaunch(stream, "receive counts", [a] { hostPlanRecv(a); });
}

fuscoResult_t devicePlanLayout(const gplan::RecvArgs& a, void* stream) {
  return planLaunch(stream, "receive layout", [a] { hostPlanLayout(a); });
}

fuscoResult_t devicePlanFan(const gplan::FanArgs& f, const gplan::SendArgs& a, void* stream) {
  return planLaunch(stream, "fan rows", [f, a] { hostPlanFan(f, a); });
}

// Registered when the library loads, as nvcc's generated code does; loaded by the device init.
[[maybe_unused]] const bool kPlanKernelsRegistered = [] {
  twincuda::registerKernel(&kPlanStep, "planStepKernel");
  return true;
}();

fuscoResult_t loadPlanKernels(KernelLoader& l) { return l.load(&kPlanStep, 256, nullptr); }

}  // namespace fusco
