// The params registry: one declaration per knob, defaults, environment, size suffixes, listing,
// rejected values.
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "core/bootstrap.h"
#include "core/log.h"
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
  EXPECT_EQ(fusco::paramIntByName("FUSCO_TIMEOUT_MS"), 300000);
  EXPECT_EQ(fusco::paramIntByName("FUSCO_LOCAL_SIZE"), 0);
  EXPECT_EQ(fusco::paramIntByName("FUSCO_CHUNK_BYTES"), 512 << 10);
  EXPECT_EQ(fusco::paramIntByName("FUSCO_PIPELINE_DEPTH"), 0);
  EXPECT_EQ(fusco::paramStringByName("FUSCO_DEBUG"), "WARN");
  for (const auto& p : fusco::paramList()) {
    EXPECT_EQ(p.source, "default") << p.name;
    EXPECT_EQ(p.value, p.defaultValue) << p.name;
  }
}

TEST_F(Params, AClearedOverrideReadsTheEnvironmentOrDefaultAgain) {
  fusco::paramSetOverride("FUSCO_TIMEOUT_MS", "77");
  EXPECT_EQ(fusco::paramIntByName("FUSCO_TIMEOUT_MS"), 77);
  EXPECT_EQ(find(fusco::paramList(), "FUSCO_TIMEOUT_MS")->source, "override");
  fusco::paramClearOverride("FUSCO_TIMEOUT_MS");
  EXPECT_EQ(fusco::paramIntByName("FUSCO_TIMEOUT_MS"), 300000);
  EXPECT_EQ(find(fusco::paramList(), "FUSCO_TIMEOUT_MS")->source, "default");
  setenv("FUSCO_TIMEOUT_MS", "88", 1);
  fusco::paramSetOverride("FUSCO_TIMEOUT_MS", "77");
  fusco::paramClearOverride("FUSCO_TIMEOUT_MS");
  EXPECT_EQ(fusco::paramIntByName("FUSCO_TIMEOUT_MS"), 88);
  EXPECT_EQ(find(fusco::paramList(), "FUSCO_TIMEOUT_MS")->source, "env");
}

TEST_F(Params, EnvironmentWinsAfterReload) {
  setenv("FUSCO_TIMEOUT_MS", "1234", 1);
  setenv("FUSCO_DEBUG", "INFO", 1);
  fusco::paramsReload();
  EXPECT_EQ(fusco::paramIntByName("FUSCO_TIMEOUT_MS"), 1234);
  EXPECT_EQ(fusco::paramStringByName("FUSCO_DEBUG"), "INFO");
  auto list = fusco::paramList();
  ASSERT_NE(find(list, "FUSCO_TIMEOUT_MS"), nullptr);
  EXPECT_EQ(find(list, "FUSCO_TIMEOUT_MS")->source, "env");
  EXPECT_EQ(find(list, "FUSCO_TIMEOUT_MS")->value, "1234");
  EXPECT_EQ(find(list, "FUSCO_LOCAL_SIZE")->source, "default");

  unsetenv("FUSCO_TIMEOUT_MS");
  fusco::paramsReload();
  EXPECT_EQ(fusco::paramIntByName("FUSCO_TIMEOUT_MS"), 300000)
      << "unset must fall back to the default";
}

TEST_F(Params, EmptyEnvironmentValueMeansDefault) {
  setenv("FUSCO_TIMEOUT_MS", "", 1);
  fusco::paramsReload();
  EXPECT_EQ(fusco::paramIntByName("FUSCO_TIMEOUT_MS"), 300000);
}

TEST_F(Params, SizeSuffixesKMGAreBinaryMultiples) {
  const std::pair<const char*, int64_t> cases[] = {
      {"65536", 65536},  {"64K", 64LL << 10}, {"64k", 64LL << 10}, {"2M", 2LL << 20},
      {"3m", 3LL << 20}, {"1G", 1LL << 30},   {"4g", 4LL << 30},   {"0x1000", 4096},
  };
  for (const auto& c : cases) {
    setenv("FUSCO_CUDA_RING_BYTES", c.first, 1);
    fusco::paramsReload();
    EXPECT_EQ(fusco::paramIntByName("FUSCO_CUDA_RING_BYTES"), c.second)
        << "FUSCO_CUDA_RING_BYTES=" << c.first;
  }
}

TEST_F(Params, UnknownNameReadsAsZeroOrEmpty) {
  EXPECT_EQ(fusco::paramIntByName("FUSCO_NO_SUCH_KNOB"), 0);
  EXPECT_EQ(fusco::paramStringByName("FUSCO_NO_SUCH_KNOB"), "");
}

TEST_F(Params, ListHasEveryDocumentedKnobWithOneLineHelp) {
  // docs/API.md "Environment" names these; more are allowed.
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

// Every FUSCO_PARAM_* declaration in the sources is listed (its registrar was linked and ran), and
// every FUSCO_ name the sources read through getenv is declared too, so `fusco_info` really prints
// every knob. The library reads its parameters through typed accessors only. Finds the sources
// next to this file.
TEST_F(Params, EveryKnobReadBySourcesIsDeclared) {
  namespace fs = std::filesystem;
  fs::path root = fs::path(__FILE__).parent_path().parent_path().parent_path();
  if (!fs::exists(root / "src" / "core" / "params.cc"))
    GTEST_SKIP() << "sources not found next to " << __FILE__;
  auto list = fusco::paramList();
  std::regex decl(
      R"re(FUSCO_PARAM_(?:INT|STRING|STRING_CHECKED|CHOICE)\s*\(\s*\w+\s*,\s*(?:[\w:]+\s*,\s*)?"(FUSCO_[A-Z0-9_]+)")re");
  std::regex use(R"re(getenv\s*\(\s*"(FUSCO_[A-Z0-9_]+)")re");
  std::regex byName(R"re(param(?:Int|String)ByName\s*\()re");
  int files = 0, declared = 0;
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
      const bool macroHome = e.path().filename() == "params.h";  // its comment shows an example
      for (std::sregex_iterator it(text.begin(), text.end(), decl), end; it != end && !macroHome;
           ++it) {
        ++declared;
        EXPECT_NE(find(list, (*it)[1]), nullptr)
            << (*it)[1] << " is declared in " << e.path() << " but not listed by paramList()";
      }
      for (std::sregex_iterator it(text.begin(), text.end(), use), end; it != end; ++it) {
        std::string name = (*it)[1];
        EXPECT_NE(find(list, name), nullptr)
            << name << " is read in " << e.path() << " but not declared with FUSCO_PARAM_*";
      }
      if (e.path().filename() != "params.h" && e.path().filename() != "params.cc" &&
          e.path().filename() != "fusco_info.cc") {
        EXPECT_FALSE(std::regex_search(text, byName))
            << e.path() << " reads a parameter by name; use its typed accessor";
      }
    }
  }
  EXPECT_GT(files, 0);
  EXPECT_EQ(declared, static_cast<int>(list.size())) << "each parameter is declared once";
}

// The whole set, so that a parameter whose declaring file is dropped from a static link (and with
// it the registrar) is noticed here and in `fusco_info`.
TEST_F(Params, ListHasEveryParameterOfTheLibrary) {
  const char* all[] = {"FUSCO_ASYNC_HOST",
                       "FUSCO_BALANCE_SLACK",
                       "FUSCO_CHUNK_BYTES",
                       "FUSCO_CUDA_GRAPH_PARAM_BYTES",
                       "FUSCO_CUDA_PARAM_BYTES",
                       "FUSCO_CUDA_RING_BYTES",
                       "FUSCO_CUDA_RING_SLOTS",
                       "FUSCO_CUDA_RING_SPLIT",
                       "FUSCO_CUDA_SMS",
                       "FUSCO_DEBUG",
                       "FUSCO_DEBUG_FILE",
                       "FUSCO_DEBUG_SUBSYS",
                       "FUSCO_FAULT",
                       "FUSCO_LIVENESS_MS",
                       "FUSCO_LOCAL_SIZE",
                       "FUSCO_NET_DEVICES",
                       "FUSCO_NET_GDR",
                       "FUSCO_PIPELINE_DEPTH",
                       "FUSCO_PLAN",
                       "FUSCO_PLAN_TRACE",
                       "FUSCO_SHM_ARENA_BYTES",
                       "FUSCO_SHM_DIRECT",
                       "FUSCO_SOCKET_IFNAME",
                       "FUSCO_SPIN_BEFORE_YIELD",
                       "FUSCO_TIMEOUT_MS"};
  auto list = fusco::paramList();
  for (const char* name : all) EXPECT_NE(find(list, name), nullptr) << name << " missing";
  EXPECT_EQ(list.size(), sizeof(all) / sizeof(all[0]));
  for (size_t i = 1; i < list.size(); ++i) EXPECT_LT(strcmp(list[i - 1].name, list[i].name), 0);
  for (const auto& p : list) EXPECT_TRUE(p.valid) << p.name << ": its default must be accepted";
}

// An override wins over the environment. Overrides cannot be removed, so this runs in a child
// process (death-test fork) and leaves this process's registry alone.
TEST_F(Params, OverrideWinsOverEnvironment) {
  EXPECT_EXIT(
      {
        setenv("FUSCO_PIPELINE_DEPTH", "3", 1);
        fusco::paramSetOverride("FUSCO_PIPELINE_DEPTH", "7");
        fusco::paramsReload();
        bool ok = fusco::paramIntByName("FUSCO_PIPELINE_DEPTH") == 7;
        for (const auto& p : fusco::paramList())
          if (std::string(p.name) == "FUSCO_PIPELINE_DEPTH") ok = ok && p.source == "override";
        _exit(ok ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "");
}

// A text that is not a number, lies outside the range or names no choice is rejected: the default
// is used, and the listing shows the default in force, the text rejected and what is accepted.
TEST_F(Params, RejectedValuesFallBackToTheDefault) {
  struct Case {
    const char* name;
    const char* text;
    const char* used;
  };
  const Case cases[] = {
      {"FUSCO_TIMEOUT_MS", "-5", "300000"},   {"FUSCO_TIMEOUT_MS", "0", "300000"},
      {"FUSCO_TIMEOUT_MS", "12ms", "300000"}, {"FUSCO_CHUNK_BYTES", "abc", "524288"},
      {"FUSCO_CHUNK_BYTES", "-1", "524288"},  {"FUSCO_CHUNK_BYTES", "99999999999G", "524288"},
      {"FUSCO_CHUNK_BYTES", "1G", "524288"},  {"FUSCO_CHUNK_BYTES", "0", "524288"},
      {"FUSCO_NET_GDR", "maybe", "auto"},     {"FUSCO_TIMEOUT_MS", "08", "300000"},
      {"FUSCO_TIMEOUT_MS", "010", "300000"},  {"FUSCO_PIPELINE_DEPTH", "65", "0"},
      {"FUSCO_SHM_DIRECT", "2", "1"},         {"FUSCO_BALANCE_SLACK", "2M", "64"},
      {"FUSCO_DEBUG", "LOUD", "WARN"},        {"FUSCO_PLAN_TRACE", "yes", "0"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(std::string(c.name) + "=" + c.text);
    setenv(c.name, c.text, 1);
    fusco::paramsReload();
    auto list = fusco::paramList();
    const fusco::ParamInfo* p = find(list, c.name);
    ASSERT_NE(p, nullptr);
    EXPECT_FALSE(p->valid);
    EXPECT_EQ(p->value, c.used);
    EXPECT_EQ(p->value, p->defaultValue);
    EXPECT_EQ(p->rejected, c.text);
    EXPECT_EQ(p->source, "env");
    EXPECT_FALSE(p->accepted.empty());
    if (p->type == fusco::ParamType::Int) {
      EXPECT_EQ(fusco::paramIntByName(c.name), atoll(c.used));
    }
    EXPECT_EQ(fusco::paramStringByName(c.name), c.used);
    unsetenv(c.name);
  }
  fusco::paramsReload();
  for (const auto& p : fusco::paramList()) EXPECT_TRUE(p.valid) << p.name;
}

TEST_F(Params, BoundsAndChoicesAreAccepted) {
  setenv("FUSCO_TIMEOUT_MS", "1", 1);
  setenv("FUSCO_PIPELINE_DEPTH", "64", 1);
  setenv("FUSCO_DEBUG", "trace", 1);
  setenv("FUSCO_BALANCE_SLACK", "1M", 1);
  fusco::paramsReload();
  EXPECT_EQ(fusco::paramTimeoutMs(), 1);
  EXPECT_EQ(fusco::paramIntByName("FUSCO_PIPELINE_DEPTH"), 64);
  EXPECT_EQ(fusco::paramIntByName("FUSCO_DEBUG"), static_cast<int64_t>(fusco::LogLevel::Trace));
  EXPECT_EQ(fusco::paramIntByName("FUSCO_BALANCE_SLACK"), 1 << 20);
  for (const auto& p : fusco::paramList()) EXPECT_TRUE(p.valid) << p.name;
  setenv("FUSCO_DEBUG", "OFF", 1);
  fusco::paramsReload();
  EXPECT_EQ(fusco::paramIntByName("FUSCO_DEBUG"), static_cast<int64_t>(fusco::LogLevel::None));
}

// Redirects the library log to a file for the lifetime of the object (at the default level).
class LogFile {
 public:
  LogFile() {
    char tmpl[] = "/tmp/fusco_params_log_XXXXXX";
    int fd = mkstemp(tmpl);
    if (fd >= 0) close(fd);
    path_ = tmpl;
    fusco::paramSetOverride("FUSCO_DEBUG_FILE", path_);
    fusco::logConfigure();
  }
  ~LogFile() {
    fusco::paramClearOverride("FUSCO_DEBUG_FILE");
    fusco::logConfigure();
    unlink(path_.c_str());
  }
  std::vector<std::string> linesWith(const std::string& needle) const {
    std::ifstream f(path_);
    std::vector<std::string> out;
    for (std::string line; std::getline(f, line);)
      if (line.find(needle) != std::string::npos) out.push_back(line);
    return out;
  }

 private:
  std::string path_;
};

// One WARN per rejected text, naming the variable, the text, the accepted range and the value
// used, however often the value is read or the environment reloaded (every communicator does).
TEST_F(Params, ARejectedValueIsWarnedAboutOnce) {
  LogFile log;
  setenv("FUSCO_TIMEOUT_MS", "-5", 1);
  for (int i = 0; i < 3; ++i) {
    fusco::paramsReload();
    EXPECT_EQ(fusco::paramTimeoutMs(), 300000);
    EXPECT_EQ(fusco::paramIntByName("FUSCO_TIMEOUT_MS"), 300000);
    fusco::paramList();
  }
  auto lines = log.linesWith("FUSCO_TIMEOUT_MS");
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_NE(lines[0].find(" WARN "), std::string::npos) << lines[0];
  EXPECT_NE(lines[0].find("\"-5\""), std::string::npos) << lines[0];
  EXPECT_NE(lines[0].find("[1, 2147483647]"), std::string::npos) << lines[0];
  EXPECT_NE(lines[0].find("using the default 300000"), std::string::npos) << lines[0];

  setenv("FUSCO_TIMEOUT_MS", "later", 1);  // another bad text: warned about too
  fusco::paramsReload();
  EXPECT_EQ(log.linesWith("FUSCO_TIMEOUT_MS").size(), 2u);

  setenv("FUSCO_DEBUG", "LOUD", 1);  // the log level itself: warned about at the default level
  fusco::paramsReload();
  fusco::logConfigure();
  lines = log.linesWith("FUSCO_DEBUG=");
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_NE(lines[0].find("one of NONE, OFF, WARN, INFO, TRACE"), std::string::npos) << lines[0];
  EXPECT_NE(lines[0].find("using the default WARN"), std::string::npos) << lines[0];
}

// The typed accessors cache their value and see every reload and override.
TEST_F(Params, TypedAccessorFollowsReloadsAndOverrides) {
  EXPECT_EQ(fusco::paramTimeoutMs(), 300000);
  setenv("FUSCO_TIMEOUT_MS", "2K", 1);
  EXPECT_EQ(fusco::paramTimeoutMs(), 300000) << "the environment is read again only on reload";
  fusco::paramsReload();
  EXPECT_EQ(fusco::paramTimeoutMs(), 2048);
  fusco::paramSetOverride("FUSCO_TIMEOUT_MS", "77");
  EXPECT_EQ(fusco::paramTimeoutMs(), 77);
  fusco::paramClearOverride("FUSCO_TIMEOUT_MS");
  EXPECT_EQ(fusco::paramTimeoutMs(), 2048);
}

// Readers on several threads while another reloads between two valid values: every read is one
// of them (a reload never shows a torn or default value).
TEST_F(Params, ConcurrentReadsDuringReloads) {
  setenv("FUSCO_TIMEOUT_MS", "1000", 1);
  fusco::paramsReload();
  std::atomic<bool> stop{false};
  std::atomic<int> bad{0};
  std::vector<std::thread> readers;
  for (int t = 0; t < 3; ++t)
    readers.emplace_back([&] {
      while (!stop.load()) {
        int64_t v = fusco::paramTimeoutMs();
        if (v != 1000 && v != 2000) ++bad;
        if (fusco::paramStringByName("FUSCO_DEBUG") != "WARN") ++bad;
      }
    });
  for (int i = 0; i < 2000; ++i) {
    fusco::paramSetOverride("FUSCO_TIMEOUT_MS", i % 2 ? "1000" : "2000");
    fusco::paramsReload();
  }
  stop = true;
  for (auto& t : readers) t.join();
  fusco::paramClearOverride("FUSCO_TIMEOUT_MS");
  EXPECT_EQ(bad.load(), 0);
}

}  // namespace
