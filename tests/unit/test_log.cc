// The logger: lines another knob asks for (FUSCO_PLAN_TRACE) are written whatever the level.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "core/log.h"
#include "core/params.h"

namespace {

std::string readFile(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// Runs body with the log at FUSCO_DEBUG=level and FUSCO_DEBUG_SUBSYS=subsys into a file of its
// own (set first, so a warning about subsys lands there too); returns the file's text.
std::string logWith(const char* level, const char* subsys, const std::function<void()>& body) {
  char tmpl[] = "/tmp/fusco_log_XXXXXX";
  int fd = mkstemp(tmpl);
  EXPECT_GE(fd, 0);
  close(fd);
  fusco::paramSetOverride("FUSCO_DEBUG_FILE", tmpl);
  fusco::paramSetOverride("FUSCO_DEBUG", level);
  fusco::logConfigure();
  fusco::paramSetOverride("FUSCO_DEBUG_SUBSYS", subsys);
  fusco::logConfigure();
  body();
  fusco::paramClearOverride("FUSCO_DEBUG_SUBSYS");
  fusco::paramClearOverride("FUSCO_DEBUG");
  fusco::paramClearOverride("FUSCO_DEBUG_FILE");
  fusco::logConfigure();
  const std::string text = readFile(tmpl);
  unlink(tmpl);
  return text;
}

TEST(Log, AlwaysLinesIgnoreTheLevelAndTheMask) {
  const std::string text = logWith("NONE", "^PLAN", [] {
    FUSCO_INFO(fusco::kPlan, "filtered %d", 1);
    FUSCO_WARN(fusco::kPlan, "filtered %d", 2);
    FUSCO_LOG_ALWAYS(fusco::LogLevel::Info, fusco::kPlan, "plan rank %d: forced", 3);
  });
  EXPECT_EQ(text.find("filtered"), std::string::npos) << text;
  EXPECT_NE(text.find(" FUSCO INFO PLAN "), std::string::npos) << text;
  EXPECT_NE(text.find("plan rank 3: forced"), std::string::npos) << text;
}

const fusco::ParamInfo* subsysInfo(const std::vector<fusco::ParamInfo>& all) {
  for (const auto& p : all)
    if (p.name == std::string("FUSCO_DEBUG_SUBSYS")) return &p;
  return nullptr;
}

// A typo in FUSCO_DEBUG_SUBSYS is warned about, shows as not valid (fusco_info's "!"), and leaves
// every warning on: a dead peer's warning must not vanish because a subsystem name was misspelt.
TEST(Log, AnUnknownSubsystemIsWarnedAboutAndKeepsEveryWarning) {
  std::vector<fusco::ParamInfo> params;
  const std::string text = logWith("WARN", "INIT,TIEM", [&] {
    params = fusco::paramList();
    FUSCO_WARN(fusco::kEngine, "rank %d died (test)", 3);
  });
  const fusco::ParamInfo* p = subsysInfo(params);
  ASSERT_NE(p, nullptr);
  EXPECT_FALSE(p->valid);
  EXPECT_EQ(p->rejected, "INIT,TIEM");
  EXPECT_NE(text.find("FUSCO_DEBUG_SUBSYS=\"INIT,TIEM\""), std::string::npos) << text;
  EXPECT_NE(text.find("rank 3 died (test)"), std::string::npos) << text;
}

// A subsystem list filters INFO lines only: warnings of other subsystems still print.
TEST(Log, ASubsystemListFiltersInfoLinesButNotWarnings) {
  std::vector<fusco::ParamInfo> params;
  const std::string text = logWith("WARN", "time", [&] {
    params = fusco::paramList();
    FUSCO_WARN(fusco::kUcx, "peer gone (test %d)", 1);
  });
  const fusco::ParamInfo* p = subsysInfo(params);
  ASSERT_NE(p, nullptr);
  EXPECT_TRUE(p->valid);
  EXPECT_NE(text.find("peer gone (test 1)"), std::string::npos) << text;
  EXPECT_EQ(text.find("FUSCO_DEBUG_SUBSYS"), std::string::npos) << text;
}

}  // namespace
