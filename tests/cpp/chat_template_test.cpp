#include "text/chat_template.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "common/errors.h"

namespace torchtpu {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

const json kHello = json::array({{{"role", "user"}, {"content", "hi"}}});

// A checkpoint directory of its own per test, removed afterwards.
class CheckpointDir {
 public:
  CheckpointDir() {
    const auto* info = testing::UnitTest::GetInstance()->current_test_info();
    path_ = fs::temp_directory_path() /
            ("chat_template_test_" + std::string(info->name()) + "_" + std::to_string(getpid()));
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~CheckpointDir() { fs::remove_all(path_); }
  void write(const std::string& name, const std::string& text) const {
    fs::create_directories((path_ / name).parent_path());
    std::ofstream(path_ / name, std::ios::binary) << text;
  }
  std::string str() const { return path_.string(); }

 private:
  fs::path path_;
};

TEST(ChatTemplateFromDir, ReadsChatTemplateJinjaAndSpecialTokensFromConfig) {
  CheckpointDir dir;
  dir.write("chat_template.jinja", "{{ bos_token }}{{ messages[0].content }}{{ eos_token }}");
  dir.write("tokenizer_config.json", R"({"bos_token": "<s>", "eos_token": {"content": "</s>"}})");
  EXPECT_EQ(ChatTemplate::from_dir(dir.str()).render(kHello, nullptr, false), "<s>hi</s>");
}

TEST(ChatTemplateFromDir, JinjaFileWinsOverTheConfigKey) {
  CheckpointDir dir;
  dir.write("chat_template.jinja", "file");
  dir.write("tokenizer_config.json", R"({"chat_template": "key"})");
  EXPECT_EQ(ChatTemplate::from_dir(dir.str()).render(kHello, nullptr, false), "file");
}

TEST(ChatTemplateFromDir, ReadsTheConfigKeyAsAString) {
  CheckpointDir dir;
  dir.write("tokenizer_config.json",
            R"({"chat_template": "{{ bos_token }}[{{ messages | length }}]", "bos_token": "<b>"})");
  EXPECT_EQ(ChatTemplate::from_dir(dir.str()).render(kHello, nullptr, false), "<b>[1]");
}

TEST(ChatTemplateFromDir, NamedTemplatesPickDefaultOrToolUseWhenToolsAreGiven) {
  CheckpointDir dir;
  dir.write("tokenizer_config.json", R"({"chat_template": [
      {"name": "default", "template": "plain"}, {"name": "tool_use", "template": "tools"}]})");
  const ChatTemplate chat = ChatTemplate::from_dir(dir.str());
  EXPECT_EQ(chat.render(kHello, nullptr, false), "plain");
  EXPECT_EQ(chat.render(kHello, json::array(), false), "tools");
  EXPECT_EQ(chat.source(), "plain");
}

TEST(ChatTemplateFromDir, DirWithoutTemplateIsNotFound) {
  CheckpointDir dir;
  dir.write("tokenizer_config.json", R"({"bos_token": "<bos>"})");
  EXPECT_THROW(ChatTemplate::from_dir(dir.str()), NotFoundError);
  EXPECT_THROW(ChatTemplate::from_dir(dir.str() + "/missing"), NotFoundError);
}

TEST(ChatTemplateFromDir, UnparsableConfigIsFormatError) {
  CheckpointDir dir;
  dir.write("tokenizer_config.json", R"({"chat_template": )");
  EXPECT_THROW(ChatTemplate::from_dir(dir.str()), FormatError);
}

// nlohmann reports a number beyond double's range as out_of_range, not as a parse error (found by
// tests/fuzz/request_fuzz in request bodies); here it escaped from_dir as no error kind of ours.
TEST(ChatTemplateFromDir, ConfigWithANumberBeyondDoubleIsFormatError) {
  CheckpointDir dir;
  dir.write("tokenizer_config.json", R"({"chat_template": "t", "model_max_length": 1e999})");
  EXPECT_THROW(ChatTemplate::from_dir(dir.str()), FormatError);
}

// A tokenizer_config.json nested a million deep overflowed the stack (found by feeding
// tests/fuzz/config_fuzz such a file); it is refused while parsing.
TEST(ChatTemplateFromDir, ConfigNestedTooDeepIsFormatError) {
  CheckpointDir dir;
  const std::string deep = std::string(1'000'000, '[') + std::string(1'000'000, ']');
  dir.write("tokenizer_config.json", R"({"chat_template": "t", "extra": )" + deep + "}");
  EXPECT_THROW(ChatTemplate::from_dir(dir.str()), FormatError);
}

TEST(ChatTemplateRender, RaiseExceptionIsValueErrorWithTheTemplatesMessage) {
  const auto chat = ChatTemplate::from_string(
      "{% if messages[0].role != 'system' %}{{ raise_exception('need a system turn') }}{% endif "
      "%}");
  try {
    chat.render(kHello, nullptr, false);
    FAIL() << "no exception";
  } catch (const ValueError& e) {
    EXPECT_STREQ(e.what(), "need a system turn");
  }
}

TEST(ChatTemplateRender, SyntaxErrorIsValueErrorNamingTheProblem) {
  const auto chat = ChatTemplate::from_string("{% for m in messages %}{{ m.content }}");
  try {
    chat.render(kHello, nullptr, false);
    FAIL() << "no exception";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("chat template: syntax error"), std::string::npos)
        << e.what();
  }
}

TEST(ChatTemplateRender, RuntimeErrorIsValueError) {
  const auto chat = ChatTemplate::from_string("{{ messages[0].content.no_such_method() }}");
  EXPECT_THROW(chat.render(kHello, nullptr, false), ValueError);
}

TEST(ChatTemplateRender, Jinja2FilterMiniJinjaLacksIsRefusedNamingIt) {
  const auto chat = ChatTemplate::from_string("{{ messages[0].content | wordwrap(10) }}");
  try {
    chat.render(kHello, nullptr, false);
    FAIL() << "no exception";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("unknown filter"), std::string::npos) << e.what();
  }
}

TEST(ChatTemplateRender, EmptyConversationAndMalformedArgumentsAreValueErrors) {
  const auto chat = ChatTemplate::from_string("x");
  EXPECT_THROW(chat.render(json::array(), nullptr, false), ValueError);
  EXPECT_THROW(chat.render(json::object(), nullptr, false), ValueError);
  EXPECT_THROW(chat.render(json::array({"not an object"}), nullptr, false), ValueError);
  EXPECT_THROW(chat.render(kHello, json::object(), false), ValueError);
  EXPECT_THROW(chat.render(kHello, nullptr, false, {{"messages", json::array()}}), ValueError);
}

TEST(ChatTemplateRender, PassesGenerationPromptToolsAndKwargs) {
  const auto chat = ChatTemplate::from_string(
      "{{ add_generation_prompt }} {{ tools is none }} {{ enable_thinking | default(false) }}");
  EXPECT_EQ(chat.render(kHello, nullptr, true), "True True False");
  EXPECT_EQ(chat.render(kHello, json::array({{{"type", "function"}}}), false,
                        {{"enable_thinking", true}}),
            "False False True");
}

TEST(ChatTemplateRender, DropsNullKeysAndAliasesReasoningAsTransformersDoes) {
  const auto chat =
      ChatTemplate::from_string("{% for m in messages %}{{ m | tojson }}\n{% endfor %}");
  const json messages =
      json::array({{{"role", "user"}, {"content", "q"}, {"name", nullptr}},
                   {{"role", "assistant"}, {"content", "a"}, {"reasoning", "r"}}});
  EXPECT_EQ(chat.render(nlohmann::ordered_json(messages), nullptr, false),
            "{\"content\": \"q\", \"role\": \"user\"}\n"
            "{\"thinking\": \"r\", \"content\": \"a\", \"reasoning\": \"r\", \"role\": "
            "\"assistant\", \"reasoning_content\": \"r\"}\n");
}

TEST(ChatTemplateRender, OrderedJsonKeepsTheCallersKeyOrder) {
  const auto chat = ChatTemplate::from_string("{{ messages[0] | tojson }}");
  const auto messages = nlohmann::ordered_json::parse(R"([{"role": "user", "content": "é"}])");
  EXPECT_EQ(chat.render(messages, nullptr, false), R"({"role": "user", "content": "é"})");
}

}  // namespace
}  // namespace torchtpu
