// Every thread's stack of a running process, for a test that timed out: the harnesses print them
// before they kill a hung rank (docs/TESTING.md, "a hang shows where it waits"), so the next fix
// can be made from the stacks without the machine the hang happened on.
//
// The tool: FUSCO_TEST_STACK_TOOL=cuda-gdb|gdb|proc|none picks one; unset, cuda-gdb where it is
// on PATH or in /usr/local/cuda/bin (it also shows a GPU program's host threads), else gdb, else
// /proc (each thread's name, state, wchan and kernel stack: where it waits, not in which function).
// A debugger runs as `TOOL -batch -nx -p PID -ex "thread apply all bt"`.
//
// Bounded in time: the debuggers of all processes run at once, and one still running after the
// timeout (FUSCO_TEST_STACK_TIMEOUT_SEC, default 20 s) is killed; that process (and any whose
// debugger printed no frame) gets the /proc view instead. A hung debugger cannot hang the test.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

namespace fusco::test {

// The tool threadStacks uses: "cuda-gdb", "gdb", "proc" or "none" (a debugger's full path is
// found on PATH when the stacks are read).
std::string stackToolName();

// FUSCO_TEST_STACK_TIMEOUT_SEC, else 20: the most threadStacks takes for all processes together.
double stackTimeoutSec();

// Every thread's stack of each pid, as text (one entry per pid, in order), read in parallel.
std::vector<std::string> threadStacks(const std::vector<pid_t>& pids, double timeoutSec);

// Prints to stderr, for each pid, a header "=== stacks of <label> (pid P, TOOL) ===" and its
// threads' stacks (threadStacks with stackTimeoutSec()), then an end line. Does nothing for an
// empty list or with FUSCO_TEST_STACK_TOOL=none.
void printThreadStacks(const std::vector<pid_t>& pids, const std::vector<std::string>& labels);

}  // namespace fusco::test
