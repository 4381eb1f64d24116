// The logger: lines another knob asks for (FUSCO_PLAN_TRACE) are written whatever the level.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "core/log.h"
#include "core/params.h"

namespace {

std::string readFile(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

TEST(Log, AlwaysLinesIgnoreTheLevelAndTheMask) {
  char tmpl[] = "/tmp/fusco_log_XXXXXX";
  int fd = mkstemp(tmpl);
  ASSERT_GE(fd, 0);
  close(fd);
  fusco::paramSetOverride("FUSCO_DEBUG_FILE", tmpl);
  fusco::paramSetOverride("FUSCO_DEBUG", "NONE");
  fusco::paramSetOverride("FUSCO_DEBUG_SUBSYS", "^PLAN");
  fusco::logConfigure();
  FUSCO_INFO(fusco::kPlan, "filtered %d", 1);
  FUSCO_WARN(fusco::kPlan, "filtered %d", 2);
  FUSCO_LOG_ALWAYS(fusco::LogLevel::Info, fusco::kPlan, "plan rank %d: forced", 3);
  fusco::paramClearOverride("FUSCO_DEBUG_SUBSYS");
  fusco::paramClearOverride("FUSCO_DEBUG");
  fusco::paramClearOverride("FUSCO_DEBUG_FILE");
  fusco::logConfigure();
  const std::string text = readFile(tmpl);
  unlink(tmpl);
  EXPECT_EQ(text.find("filtered"), std::string::npos) << text;
  EXPECT_NE(text.find(" FUSCO INFO PLAN "), std::string::npos) << text;
  EXPECT_NE(text.find("plan rank 3: forced"), std::string::npos) << text;
}

}  // namespace
