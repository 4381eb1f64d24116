// The params registry: one declaration per knob, defaults, environment, size suffixes, listing.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>

#include "core/params.h"

namespace {

// Every test starts from a clean FUSCO_* environment and restores the caller's afterwards, so a
// developer's FUSCO_DEBUG=INFO does not change the results.
class Params : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const auto& p : fusco::paramList()) {
      const char* v = getenv(p.name);
      if (v != nullptr) saved_[p.name] = v;
      unsetenv(p.name);
    }
    fusco::paramsReload();
  }
  void TearDown() override {
    for (const auto& p : fusco::paramList()) unsetenv(p.name);
    for (const auto& kv : saved_) setenv(kv.first.c_str(), kv.second.c_str(), 1);
    fusco::paramsReload();
  }
  std::map<std::string, std::string> saved_;
};

const fusco::ParamInfo* find(const std::vector<fusco::ParamInfo>& list, const std::string& name) {
  for (const auto& p : list)
    if (name == p.name) return &p;
  return nullptr;
}

TEST_F(Params, DefaultsApplyWithoutEnvironment) {
  EXPECT_EQ(fusco::paramInt("FUSCO_TIMEOUT_MS"), 300000);
  EXPECT_EQ(fusco::paramInt("FUSCO_LOCAL_SIZE"), 0);
  EXPECT_EQ(fusco::paramInt("FUSCO_CHUNK_BYTES"), 0);
  EXPECT_EQ(fusco::paramInt("FUSCO_PIPELINE_DEPTH"), 0);
  EXPECT_EQ(fusco::paramString("FUSCO_DEBUG"), "WARN");
  for (const auto& p : fusco::paramList()) {
    EXPECT_EQ(p.source, "default") << p.name;
    EXPECT_EQ(p.value, p.defaultValue) << p.name;
  }
}

TEST_F(Params, AClearedOverrideReadsTheEnvironmentOrDefaultAgain) {
  fusco::paramSetOverride("FUSCO_TIMEOUT_MS", "77");
  EXPECT_EQ(fusco::paramInt("FUSCO_TIMEOUT_MS"), 77);
  EXPECT_EQ(find(fusco::paramList(), "FUSCO_TIMEOUT_MS")->source, "override");
  fusco::paramClearOverride("FUSCO_TIMEOUT_MS");
  EXPECT_EQ(fusco::paramInt("FUSCO_TIMEOUT_MS"), 300000);
  EXPECT_EQ(find(fusco::paramList(), "FUSCO_TIMEOUT_MS")->source, "default");
  setenv("FUSCO_TIMEOUT_MS", "88", 1);
  fusco::paramSetOverride("FUSCO_TIMEOUT_MS", "77");
  fusco::paramClearOverride("FUSCO_TIMEOUT_MS");
  EXPECT_EQ(fusco::paramInt("FUSCO_TIMEOUT_MS"), 88);
  EXPECT_EQ(find(fusco::paramList(), "FUSCO_TIMEOUT_MS")->source, "env");
}

TEST_F(Params, EnvironmentWinsAfterReload) {
  setenv("FUSCO_TIMEOUT_MS", "1234", 1);
  setenv("FUSCO_DEBUG", "INFO", 1);
  fusco::paramsReload();
  EXPECT_EQ(fusco::paramInt("FUSCO_TIMEOUT_MS"), 1234);
  EXPECT_EQ(fusco::paramString("FUSCO_DEBUG"), "INFO");
  auto list = fusco::paramList();
  ASSERT_NE(find(list, "FUSCO_TIMEOUT_MS"), nullptr);
  EXPECT_EQ(find(list, "FUSCO_TIMEOUT_MS")->source, "env");
  EXPECT_EQ(find(list, "FUSCO_TIMEOUT_MS")->value, "1234");
  EXPECT_EQ(find(list, "FUSCO_LOCAL_SIZE")->source, "default");

  unsetenv("FUSCO_TIMEOUT_MS");
  fusco::paramsReload();
  EXPECT_EQ(fusco::paramInt("FUSCO_TIMEOUT_MS"), 300000) << "unset must fall back to the default";
}

TEST_F(Params, EmptyEnvironmentValueMeansDefault) {
  setenv("FUSCO_TIMEOUT_MS", "", 1);
  fusco::paramsReload();
  EXPECT_EQ(fusco::paramInt("FUSCO_TIMEOUT_MS"), 300000);
}

TEST_F(Params, SizeSuffixesKMGAreBinaryMultiples) {
  const std::pair<const char*, int64_t> cases[] = {
      {"65536", 65536},  {"64K", 64LL << 10}, {"64k", 64LL << 10}, {"2M", 2LL << 20},
      {"3m", 3LL << 20}, {"1G", 1LL << 30},   {"4g", 4LL << 30},   {"0x1000", 4096},
  };
  for (const auto& c : cases) {
    setenv("FUSCO_CHUNK_BYTES", c.first, 1);
    fusco::paramsReload();
    EXPECT_EQ(fusco::paramInt("FUSCO_CHUNK_BYTES"), c.second) << "FUSCO_CHUNK_BYTES=" << c.first;
  }
}

TEST_F(Params, UnknownNameReadsAsZeroOrEmpty) {
  EXPECT_EQ(fusco::paramInt("FUSCO_NO_SUCH_KNOB"), 0);
  EXPECT_EQ(fusco::paramString("FUSCO_NO_SUCH_KNOB"), "");
}

TEST_F(Params, ListHasEveryDocumentedKnobWithOneLineHelp) {
  // API.md "Environment" names these; more are allowed.
  const char* documented[] = {"FUSCO_DEBUG",       "FUSCO_DEBUG_SUBSYS", "FUSCO_DEBUG_FILE",
                              "FUSCO_TIMEOUT_MS",  "FUSCO_LOCAL_SIZE",   "FUSCO_SOCKET_IFNAME",
                              "FUSCO_NET_DEVICES", "FUSCO_CHUNK_BYTES",  "FUSCO_PIPELINE_DEPTH",
                              "FUSCO_PLAN_TRACE"};
  auto list = fusco::paramList();
  for (const char* name : documented) EXPECT_NE(find(list, name), nullptr) << name << " missing";
  std::set<std::string> seen;
  for (const auto& p : list) {
    ASSERT_NE(p.name, nullptr);
    EXPECT_EQ(std::string(p.name).rfind("FUSCO_", 0), 0u) << p.name;
    EXPECT_TRUE(seen.insert(p.name).second) << p.name << " declared twice";
    ASSERT_NE(p.help, nullptr) << p.name;
    EXPECT_GT(strlen(p.help), 10u) << p.name << " needs a help line";
    EXPECT_EQ(strchr(p.help, '\n'), nullptr) << p.name << " help must be one line";
    ASSERT_NE(p.defaultValue, nullptr) << p.name;
    if (p.type == fusco::ParamType::Int) {
      char* end = nullptr;
      strtoll(p.defaultValue, &end, 0);
      EXPECT_NE(end, p.defaultValue) << p.name << " has a non-numeric default";
    }
  }
}

// Every FUSCO_ name the sources read (paramInt/paramString/getenv) is declared in the registry,
// so `fusco_info` really prints every knob. Finds the sources next to this file.
TEST_F(Params, EveryKnobReadBySourcesIsDeclared) {
  namespace fs = std::filesystem;
  fs::path root = fs::path(__FILE__).parent_path().parent_path().parent_path();
  if (!fs::exists(root / "src" / "core" / "params.cc"))
    GTEST_SKIP() << "sources not found next to " << __FILE__;
  auto list = fusco::paramList();
  std::regex use(R"re((paramInt|paramString|getenv)\s*\(\s*"(FUSCO_[A-Z0-9_]+)")re");
  int files = 0;
  for (const char* dir : {"src", "transport"}) {
    if (!fs::exists(root / dir)) continue;
    for (const auto& e : fs::recursive_directory_iterator(root / dir)) {
      auto ext = e.path().extension().string();
      if (ext != ".cc" && ext != ".h" && ext != ".cu" && ext != ".cuh") continue;
      std::ifstream in(e.path());
      std::stringstream ss;
      ss << in.rdbuf();
      std::string text = ss.str();
      ++files;
      for (std::sregex_iterator it(text.begin(), text.end(), use), end; it != end; ++it) {
        std::string name = (*it)[2];
        EXPECT_NE(find(list, name), nullptr)
            << name << " is read in " << e.path() << " but not declared in params.cc";
      }
    }
  }
  EXPECT_GT(files, 0);
}

// An override wins over the environment. Overrides cannot be removed, so this runs in a child
// process (death-test fork) and leaves this process's registry alone.
TEST_F(Params, OverrideWinsOverEnvironment) {
  EXPECT_EXIT(
      {
        setenv("FUSCO_PIPELINE_DEPTH", "3", 1);
        fusco::paramSetOverride("FUSCO_PIPELINE_DEPTH", "7");
        fusco::paramsReload();
        bool ok = fusco::paramInt("FUSCO_PIPELINE_DEPTH") == 7;
        for (const auto& p : fusco::paramList())
          if (std::string(p.name) == "FUSCO_PIPELINE_DEPTH") ok = ok && p.source == "override";
        _exit(ok ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "");
}

}  // namespace
