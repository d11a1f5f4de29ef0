#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "tutti/tutti.h"

namespace tutti {
namespace {

TEST(Config, DefaultsAndParsing) {
  unsetenv("TUTTI_BUCKET_MB");
  config::reload();
  EXPECT_EQ(config::get_double("TUTTI_BUCKET_MB"), 25.0);
  setenv("TUTTI_BUCKET_MB", "4.5", 1);
  EXPECT_EQ(config::get_double("TUTTI_BUCKET_MB"), 25.0) << "cached until reload";
  config::reload();
  EXPECT_EQ(config::get_double("TUTTI_BUCKET_MB"), 4.5);
  setenv("TUTTI_BUCKET_MB", "lots", 1);
  config::reload();
  try {
    config::get_double("TUTTI_BUCKET_MB");
    FAIL();
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("TUTTI_BUCKET_MB='lots'"), std::string::npos) << m;
    EXPECT_NE(m.find("default 25"), std::string::npos) << m;
  }
  setenv("TUTTI_HIERARCHICAL", "yes", 1);
  config::reload();
  EXPECT_TRUE(config::get_bool("TUTTI_HIERARCHICAL"));
  setenv("TUTTI_HIERARCHICAL", "maybe", 1);
  config::reload();
  EXPECT_THROW(config::get_bool("TUTTI_HIERARCHICAL"), Error);
  unsetenv("TUTTI_HIERARCHICAL");
  unsetenv("TUTTI_BUCKET_MB");
  config::reload();
  EXPECT_THROW(config::get_int("TUTTI_NO_SUCH_SETTING"), Error);
}

// TUTTI_LOG_LEVEL follows config::reload() like every other setting; a
// set_log_level() override lasts until the next reload.
TEST(Config, ReloadRereadsLogLevel) {
  setenv("TUTTI_LOG_LEVEL", "debug", 1);
  config::reload();
  EXPECT_EQ(log_level(), LogLevel::kDebug);
  setenv("TUTTI_LOG_LEVEL", "error", 1);
  EXPECT_EQ(log_level(), LogLevel::kDebug) << "cached until reload";
  config::reload();
  EXPECT_EQ(log_level(), LogLevel::kError);
  set_log_level(LogLevel::kTrace);
  EXPECT_EQ(log_level(), LogLevel::kTrace);
  config::reload();
  EXPECT_EQ(log_level(), LogLevel::kError) << "reload replaces the override";
  unsetenv("TUTTI_LOG_LEVEL");
  config::reload();
  EXPECT_EQ(log_level(), LogLevel::kWarn);
}

// docs/settings.md must document every setting with its default.
TEST(Config, EverySettingIsDocumented) {
  std::ifstream in(std::string(TUTTI_SOURCE_DIR) + "/docs/settings.md");
  ASSERT_TRUE(in.good()) << "docs/settings.md is missing";
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string doc = ss.str();
  for (const auto& s : config::all_settings()) {
    const std::string row = std::string("| `") + s.name + "` | " + s.type +
                            " | `" + s.default_value + "` |";
    EXPECT_NE(doc.find(row), std::string::npos)
        << "docs/settings.md lacks the row starting: " << row;
  }
}

TEST(Log, LevelsFilter) {
  set_log_level(LogLevel::kError);
  EXPECT_FALSE(log_enabled(LogLevel::kWarn));
  EXPECT_TRUE(log_enabled(LogLevel::kError));
  set_log_level(LogLevel::kDebug);
  EXPECT_TRUE(log_enabled(LogLevel::kInfo));
  set_log_level(LogLevel::kWarn);
}

}  // namespace
}  // namespace tutti
