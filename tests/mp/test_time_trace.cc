// FUSCO_DEBUG_SUBSYS=TIME: one line per enqueued operation saying where its host time went (the
// caller's enqueue, the wait for the progress thread, the resolution), on the host twin of the
// CUDA path, whose operations are enqueued as on a GPU.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "harness/data_gen.h"
#include "harness/mp_harness.h"

namespace {

using fusco::test::initComm;
using fusco::test::RankCtx;
using fusco::test::runRanks;

std::string readFile(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

TEST(TimeTrace, EveryEnqueuedOperationSaysWhereItsHostTimeWent) {
  char dir[] = "/tmp/fusco-time-trace.XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string base = std::string(dir) + "/log";
  fusco::test::MpOptions opt;
  opt.env = {{"FUSCO_ASYNC_HOST", "1"},
             {"FUSCO_DEBUG", "INFO"},
             {"FUSCO_DEBUG_SUBSYS", "TIME"},
             {"FUSCO_DEBUG_FILE", base + ".%p"}};
  runRanks(
      2,
      [&base](const RankCtx& ctx) {
        fuscoConfig_t cfg = FUSCO_CONFIG_INITIALIZER;
        cfg.timeoutMs = 30000;
        fuscoComm_t comm = initComm(ctx, &cfg);
        std::vector<int32_t> send(2 * 1000, ctx.rank), recv(2 * 1000);
        for (int i = 0; i < 3; ++i)
          FUSCO_EXPECT_OK(comm,
                          fuscoAllToAll(send.data(), recv.data(), 1000, fuscoInt32, comm, nullptr));
        FUSCO_EXPECT_OK(comm, fuscoCommDestroy(comm));
        const std::string text = readFile(base + "." + std::to_string(getpid()));
        const std::regex line(
            "TIME .*fuscoAllToAll \\(call #([0-9]+), operation [0-9]+\\): enqueued in "
            "([0-9.]+) us on the caller; taken up ([0-9.]+) us later; resolved in ([0-9.]+) us "
            "\\(ok\\)");
        int lines = 0;
        for (auto it = std::sregex_iterator(text.begin(), text.end(), line);
             it != std::sregex_iterator(); ++it) {
          ++lines;
          for (int g = 2; g <= 4; ++g) EXPECT_GE(std::stod((*it)[g].str()), 0.0) << it->str();
        }
        EXPECT_EQ(lines, 3) << "rank " << ctx.rank << "'s log:\n" << text;
        EXPECT_EQ(text.find("ENGINE"), std::string::npos) << "only TIME lines were asked for";
      },
      opt);
  const std::string rm = std::string("rm -rf ") + dir;
  EXPECT_EQ(system(rm.c_str()), 0);
}

}  // namespace
