// What the twin's own tests share (test_twin_cuda.cc, test_twin_sms.cc): a body run in a fresh
// process (a threadsafe death test), the checks it makes, and a peer process that is this binary
// started again in a role (TWIN_CUDA_TEST_ROLE), since a forked copy of a process whose CUDA
// context exists may not use CUDA (programming guide, "Initialization").
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>
#include <spawn.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

extern char** environ;

namespace twintest {

using Clock = std::chrono::steady_clock;

inline int64_t msSince(Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t).count();
}

// Starts this binary again as a peer: TWIN_CUDA_TEST_ROLE=role plus `env`, the caller's
// environment without gtest's variables, and each (from, to) of `fds` dup2'ed (to >= 3).
// Returns the pid, or -1.
inline pid_t spawnSelf(const char* role, const std::vector<std::string>& env,
                       const std::vector<std::pair<int, int>>& fds) {
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  for (const auto& f : fds) posix_spawn_file_actions_adddup2(&fa, f.first, f.second);
  std::vector<std::string> all{std::string("TWIN_CUDA_TEST_ROLE=") + role};
  all.insert(all.end(), env.begin(), env.end());
  for (char** e = environ; *e; ++e)
    if (std::strncmp(*e, "GTEST_", 6) != 0) all.push_back(*e);
  std::vector<char*> envp;
  for (auto& s : all) envp.push_back(&s[0]);
  envp.push_back(nullptr);
  std::string arg0 = std::string("twin-") + role;
  char* argv[] = {&arg0[0], nullptr};
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, "/proc/self/exe", &fa, nullptr, argv, envp.data());
  posix_spawn_file_actions_destroy(&fa);
  return rc == 0 ? pid : -1;
}

}  // namespace twintest

// A body run in a fresh process: returns 0 on success, else prints why and returns 1.
#define CHILD_CHECK(cond)                                                      \
  do {                                                                         \
    if (!(cond)) {                                                             \
      fprintf(stderr, "child check failed at line %d: %s\n", __LINE__, #cond); \
      return 1;                                                                \
    }                                                                          \
  } while (0)

#define EXPECT_ISOLATED(body, regex) \
  EXPECT_EXIT(_exit((body)()), ::testing::ExitedWithCode(0), regex)
