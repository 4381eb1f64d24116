# The failure classes a GPU showed (docs/TESTING.md, "Failure classes"), as the twin CUDA runtime
# reproduces them: included by ctest after the [gpu] tests are discovered (twin builds only). A
# test listed here passes only while its output shows its class's message (ctest's
# PASS_REGULAR_EXPRESSION; the exit status is then ignored), so it stays green while the class
# fails as it failed on the GPU, and turns red the day it stops failing that way. The change that
# ends a class removes its tests from this file in the same commit, and they must then pass
# outright.
#
# Each entry: a test name, then its class's message. The first test of each class is its
# reproducer (docs/TESTING.md), which fails the same way every time: it passes by the message
# alone. The others are the [gpu] tests the class breaks today, where timing can let the class
# slip by (a peer maps in time): they pass by the message or outright (gtest's summary of one
# passed test), never by any other failure.
set(_e "waited for the stream")             # E: a call that waits for earlier stream work
set(_fusco_twin_classes
  "GpuMoeCapacity.PlanDispatchCombineOnlyEnqueueAndMatchTheReference" "${_e}"
)
list(LENGTH _fusco_twin_classes _n)
math(EXPR _last "${_n} - 1")
foreach(_i RANGE 0 ${_last} 2)
  math(EXPR _j "${_i} + 1")
  list(GET _fusco_twin_classes ${_i} _test)
  list(GET _fusco_twin_classes ${_j} _message)
  set_tests_properties("${_test}" PROPERTIES PASS_REGULAR_EXPRESSION "${_message}")
endforeach()
