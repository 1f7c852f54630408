// Images and audio in requests (#19): each front end's parts become {"type":"image"/"audio"} in
// the chat messages plus a MediaSource naming the request's field, and load_media refuses what
// the decoders or the limits would, with a 400 naming that field. The data are independent
// references: RFC 4648's base64 test vectors, a 1x1 PNG and a WAV header written from the format's
// specification. The SDKs' view is tests/js/media.test.mjs.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <optional>
#include <thread>
#include <vector>

#include "common/base64.h"
#include "common/errors.h"
#include "media/audio.h"
#include "server/anthropic.h"
#include "server/demo.h"
#include "server/media_load.h"
#include "server/openai.h"
#include "server/responses.h"
#include "server/transcription.h"
#include "text/chat_template.h"

namespace torchtpu::server {
namespace {

// A 1x1 RGBA PNG (the one widely used as a placeholder), and its data: URL.
const char kPngBase64[] =
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+"
    "M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==";
const std::string kPngUrl = std::string("data:image/png;base64,") + kPngBase64;

ApiError error_of(const std::function<void()>& parse) {
  try {
    parse();
  } catch (const ApiError& e) {
    return e;
  }
  ADD_FAILURE() << "no ApiError";
  return ApiError(0, "");
}

// RIFF/WAVE, PCM 16-bit mono at 16 kHz, `samples` zero samples.
std::string wav_bytes(uint32_t samples) {
  auto u32 = [](uint32_t v) {
    return std::string{char(v), char(v >> 8), char(v >> 16), char(v >> 24)};
  };
  auto u16 = [](uint16_t v) { return std::string{char(v), char(v >> 8)}; };
  const uint32_t data = samples * 2;
  return "RIFF" + u32(36 + data) + "WAVE" + "fmt " + u32(16) + u16(1) + u16(1) + u32(16000) +
         u32(32000) + u16(2) + u16(16) + "data" + u32(data) + std::string(data, '\0');
}

std::string base64(const std::string& bytes) {
  const char* alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  for (size_t i = 0; i < bytes.size(); i += 3) {
    uint32_t group = static_cast<unsigned char>(bytes[i]) << 16;
    if (i + 1 < bytes.size()) group |= static_cast<unsigned char>(bytes[i + 1]) << 8;
    if (i + 2 < bytes.size()) group |= static_cast<unsigned char>(bytes[i + 2]);
    out += alphabet[group >> 18 & 63];
    out += alphabet[group >> 12 & 63];
    out += i + 1 < bytes.size() ? alphabet[group >> 6 & 63] : '=';
    out += i + 2 < bytes.size() ? alphabet[group & 63] : '=';
  }
  return out;
}

ojson chat_with(const ojson& part) {
  return {{"messages",
           {{{"role", "user"}, {"content", {{{"type", "text"}, {"text", "what is it?"}}, part}}}}}};
}

ojson image_part(const std::string& url) {
  return {{"type", "image_url"}, {"image_url", {{"url", url}}}};
}

const Modalities kBoth{true, true};

TEST(Base64, DecodesRfc4648sTestVectorsAndRefusesAnythingElse) {
  EXPECT_EQ(decode_base64(""), "");
  EXPECT_EQ(decode_base64("Zg=="), "f");
  EXPECT_EQ(decode_base64("Zm8="), "fo");
  EXPECT_EQ(decode_base64("Zm9v"), "foo");
  EXPECT_EQ(decode_base64("Zm9vYg=="), "foob");
  EXPECT_EQ(decode_base64("Zm9vYmE="), "fooba");
  EXPECT_EQ(decode_base64("Zm9vYmFy"), "foobar");
  EXPECT_EQ(decode_base64("Zm9"), std::nullopt);
  EXPECT_EQ(decode_base64("Zm9v!mFy"), std::nullopt);
  EXPECT_EQ(decode_base64("Zg==Zm9v"), std::nullopt);
  EXPECT_EQ(decode_base64("Zm9 v"), std::nullopt);
}

TEST(Base64, EncodesRfc4648sTestVectors) {
  const std::pair<const char*, const char*> vectors[] = {{"", ""},
                                                         {"f", "Zg=="},
                                                         {"fo", "Zm8="},
                                                         {"foo", "Zm9v"},
                                                         {"foob", "Zm9vYg=="},
                                                         {"fooba", "Zm9vYmE="},
                                                         {"foobar", "Zm9vYmFy"}};
  for (const auto& [bytes, text] : vectors) EXPECT_EQ(encode_base64(bytes), text);
  std::string all;
  for (int i = 0; i < 256; ++i) all.push_back(static_cast<char>(i));
  EXPECT_EQ(decode_base64(encode_base64(all)), all);
}

TEST(ChatMedia, ImageAndAudioPartsBecomeTemplatePartsAndSourcesInOrder) {
  ojson body =
      chat_with({{"type", "image_url"}, {"image_url", {{"url", kPngUrl}, {"detail", "low"}}}});
  body["messages"][0]["content"].push_back(
      {{"type", "input_audio"}, {"input_audio", {{"data", "AAAA"}, {"format", "wav"}}}});
  const GenerationRequest r = parse_chat_request(body);
  EXPECT_EQ(r.messages[0]["content"], ojson::parse(R"([{"type": "text", "text": "what is it?"},
      {"type": "image"}, {"type": "audio"}])"));
  ASSERT_EQ(r.media.size(), 2u);
  EXPECT_EQ(r.media[0].kind, MediaKind::kImage);
  EXPECT_EQ(r.media[0].mime, "image/png");
  EXPECT_EQ(r.media[0].base64, kPngBase64);
  EXPECT_EQ(r.media[0].param, "messages[0].content[1].image_url.url");
  EXPECT_EQ(r.media[0].image_tokens, 70);
  EXPECT_EQ(r.media[1].kind, MediaKind::kAudio);
  EXPECT_EQ(r.media[1].mime, "audio/wav");
  EXPECT_EQ(r.media[1].param, "messages[0].content[2].input_audio.data");
}

// The reference is transformers' apply_chat_template with the same template, for
// [{"type":"text"}, {"type":"image"}, {"type":"text"}, {"type":"audio"}].
TEST(ChatMedia, TheTemplatePrintsEachPlaceholderWhereItsPartStood) {
  ojson body = chat_with(image_part(kPngUrl));
  body["messages"][0]["content"][0]["text"] = "What is it?";
  body["messages"][0]["content"].push_back({{"type", "text"}, {"text", "And this?"}});
  body["messages"][0]["content"].push_back(
      {{"type", "input_audio"}, {"input_audio", {{"data", "AAAA"}, {"format", "wav"}}}});
  const GenerationRequest r = parse_chat_request(body);
  EXPECT_EQ(ChatTemplate::from_string(gemma4_chat_template()).render(r.messages, nullptr, true),
            "<bos><|turn>user\nWhat is it?<|image|>And this?<|audio|><turn|>\n<|turn>model\n");
}

TEST(ChatMedia, DetailSetsTheSoftTokenBudget) {
  auto tokens = [](const char* detail) {
    return parse_chat_request(chat_with({{"type", "image_url"},
                                         {"image_url", {{"url", kPngUrl}, {"detail", detail}}}}))
        .media[0]
        .image_tokens;
  };
  EXPECT_EQ(tokens("auto"), 0);  // the server's --image-tokens
  EXPECT_EQ(tokens("low"), 70);
  EXPECT_EQ(tokens("high"), 1120);
  const ApiError e = error_of([&] { tokens("medium"); });
  EXPECT_EQ(e.status, 400);
  EXPECT_EQ(e.param, "messages[0].content[1].image_url.detail");
  EXPECT_STREQ(e.what(),
               "'messages[0].content[1].image_url.detail' must be \"auto\", \"low\" or \"high\", "
               "got \"medium\"");
}

TEST(ChatMedia, MalformedPartsAreRefusedNamingTheField) {
  auto message = [](const ojson& part) {
    return std::string(error_of([&] { parse_chat_request(chat_with(part)); }).what());
  };
  EXPECT_EQ(message(image_part("data:;base64,AAAA")),
            "'messages[0].content[1].image_url.url' is a data: URL without a media type "
            "(data:image/png;base64,...)");
  EXPECT_EQ(message(image_part("data:image/png,rawbytes")),
            "'messages[0].content[1].image_url.url' must be a base64 data: URL "
            "(data:MEDIA_TYPE;base64,DATA)");
  EXPECT_EQ(message(image_part("ftp://example.com/a.png")),
            "'messages[0].content[1].image_url.url' must be a data: URL or an http(s) URL, got "
            "one starting \"ftp\"");
  EXPECT_EQ(
      message({{"type", "input_audio"}, {"input_audio", {{"data", "AAAA"}, {"format", "flac"}}}}),
      "'messages[0].content[1].input_audio.format' is \"flac\": this server reads \"wav\" and "
      "\"mp3\" audio");
  EXPECT_EQ(message({{"type", "video_url"}}),
            "'messages[0].content[1].type' must be \"text\", \"image_url\" or \"input_audio\", got "
            "\"video_url\"");
}

TEST(ChatMedia, ImagesBelongToUserMessages) {
  const ojson body = {{"messages",
                       {{{"role", "system"}, {"content", {image_part(kPngUrl)}}},
                        {{"role", "user"}, {"content", "hi"}}}}};
  const ApiError e = error_of([&] { parse_chat_request(body); });
  EXPECT_EQ(e.status, 400);
  EXPECT_EQ(e.param, "messages[0].content[0].type");
  EXPECT_STREQ(e.what(),
               "'messages[0].content[0].type' is \"image_url\": images and audio belong to user "
               "messages (OpenAI's system, assistant and tool messages hold text only)");
}

TEST(LoadMedia, ReadsDataUrlsIntoBytesAndTheDefaultBudget) {
  const GenerationRequest r = parse_chat_request(chat_with(image_part(kPngUrl)));
  const auto parts = load_media(r.media, MediaLimits{}, kBoth);
  ASSERT_EQ(parts.size(), 1u);
  EXPECT_EQ(parts[0].bytes.substr(0, 8), "\x89PNG\r\n\x1a\n");
  EXPECT_EQ(parts[0].mime, "image/png");
  EXPECT_EQ(parts[0].image_tokens, 280);
  const std::string wav = wav_bytes(1600);
  const auto audio = load_media({{MediaKind::kAudio, "", "audio/wav", base64(wav), "a", "f", 0}},
                                MediaLimits{}, kBoth);
  EXPECT_EQ(audio[0].bytes, wav);
}

// As peers read them: a media type in any case (RFC 6838), image/jpg for JPEG, and base64 with
// MIME's line breaks (RFC 2045) give the bytes the plain data: URL gives.
TEST(LoadMedia, MediaTypesInAnyCaseJpgAndBrokenLinesOfBase64AreRead) {
  const std::string png = load_media({image_from_url(kPngUrl, "u", 0)}, {}, kBoth)[0].bytes;
  std::string broken = kPngBase64;
  for (size_t at = 76; at < broken.size(); at += 78) broken.insert(at, "\r\n");
  for (const std::string& url :
       {"data:IMAGE/PNG;base64," + std::string(kPngBase64),
        "data:image/jpg;base64," + std::string(kPngBase64), "data:image/png;base64," + broken}) {
    const auto parts = load_media({image_from_url(url, "u", 0)}, {}, kBoth);
    EXPECT_EQ(parts[0].bytes, png) << url;
  }
}

TEST(LoadMedia, RefusesEachBadItemNamingTheFieldAndTheLimit) {
  auto message = [](const std::vector<MediaSource>& sources, const MediaLimits& limits = {},
                    const Modalities& modalities = kBoth) {
    const ApiError e = error_of([&] { load_media(sources, limits, modalities); });
    EXPECT_EQ(e.status, 400);
    return std::string(e.what());
  };
  auto image = [](const std::string& url) { return image_from_url(url, "u", 0); };
  EXPECT_EQ(message({image("data:image/png;base64,iVBO!!==")}), "'u' is not valid base64");
  EXPECT_EQ(message({image("data:image/gif;base64,AAAA")}),
            "'u' names the media type \"image/gif\"; this server reads image/png, image/jpeg or "
            "image/webp");
  MediaLimits small;
  small.max_image_bytes = 10;
  EXPECT_EQ(message({image(kPngUrl)}, small),
            "'u' holds an image of about 72 bytes, more than --max-image-bytes 10");
  MediaLimits one;
  one.max_items = 1;
  EXPECT_EQ(message({image(kPngUrl), image_from_url(kPngUrl, "v", 0)}, one),
            "the request holds 2 images and audio clips, more than this server's --max-media 1");
  EXPECT_EQ(message({image("https://example.com/cat.png")}),
            "'u' is an http(s) URL, which this server does not fetch; send the image as a data: "
            "URL, or start the server with --allow-media-urls");
  EXPECT_EQ(message({image(kPngUrl)}, {}, Modalities{false, true}),
            "'u' is an image, and this checkpoint has no vision encoder (its config.json has no "
            "vision_config)");
  EXPECT_EQ(message({{MediaKind::kAudio, "", "audio/wav", base64(wav_bytes(8)), "a", "f", 0}}, {},
                    Modalities{true, false}),
            "'a' is audio, and this checkpoint has no audio encoder (its config.json has no "
            "audio_config)");
  EXPECT_EQ(message({image(kPngUrl)}, {}, Modalities{false, true, true, false}),
            "'u' is an image, and this server was started with --no-vision");
  EXPECT_EQ(message({{MediaKind::kAudio, "", "audio/flac", "AAAA", "a", "f", 0}}),
            "'f' names the media type \"audio/flac\"; this server reads audio/wav, audio/x-wav, "
            "audio/wave, audio/vnd.wave, audio/mpeg or audio/mp3");
}

TEST(LoadMedia, CorruptFilesAreRefusedBeforeAnythingIsQueued) {
  const std::string truncated_png = std::string(kPngBase64).substr(0, 40);
  const ApiError image = error_of([&] {
    load_media({image_from_url("data:image/png;base64," + truncated_png, "u", 0)}, {}, kBoth);
  });
  EXPECT_EQ(image.status, 400);
  EXPECT_EQ(image.code, "invalid_image");
  EXPECT_EQ(std::string(image.what()).rfind("'u' is not a readable image: ", 0), 0u)
      << image.what();
  const ApiError audio = error_of([&] {
    load_media({{MediaKind::kAudio, "", "audio/wav", base64("RIFF....WAVEjunk"), "a", "f", 0}}, {},
               kBoth);
  });
  EXPECT_EQ(audio.code, "invalid_audio");
  EXPECT_EQ(std::string(audio.what()).rfind("'a' is not a readable WAV or MP3 file: ", 0), 0u)
      << audio.what();
}

// Images are preprocessed as they are decoded: what a request keeps is patches, not the decoded
// pixels, and the budget is held by one image at a time.
TEST(LoadMedia, KeepsPatchesNotDecodedPixels) {
  DecodeBudget budget(1);
  const auto parts = load_media({image_from_url(kPngUrl, "u", 70), image_from_url(kPngUrl, "v", 0)},
                                {}, kBoth, {}, {}, budget);
  ASSERT_EQ(parts.size(), 2u);
  EXPECT_EQ(parts[0].patches.soft_tokens, 64);
  EXPECT_EQ(parts[0].patches.pixels.size(1), 3 * 16 * 16);
  EXPECT_EQ(parts[1].patches.soft_tokens, 256);
  EXPECT_EQ(budget.peak(), 1);
}

// A clip's features are extracted as it is read, with the options given (the checkpoint's): a
// request keeps features, not samples at the file's rate, and a clip longer than the options'
// max_samples is refused as it decodes.
TEST(LoadMedia, KeepsAClipsFeaturesNotItsSamples) {
  AudioFeatureOptions options;
  options.feature_size = 64;
  options.max_samples = 3200;
  const std::string wav = wav_bytes(1600);
  const MediaSource clip{MediaKind::kAudio, "", "audio/wav", base64(wav), "a", "f", 0};
  const auto parts = load_media({clip, clip}, {}, kBoth, {}, options);
  ASSERT_EQ(parts.size(), 2u);
  const AudioFeatures expected = audio_features_from_file(wav, options);
  EXPECT_EQ(parts[1].audio.features.size(1), 64);
  EXPECT_TRUE(at::equal(parts[1].audio.features, expected.features));
  EXPECT_TRUE(at::equal(parts[1].audio.mask, expected.mask));
  EXPECT_EQ(parts[1].audio.soft_tokens, expected.soft_tokens);
  const MediaSource longer{
      MediaKind::kAudio, "", "audio/wav", base64(wav_bytes(4000)), "a", "f", 0};
  const ApiError e = error_of([&] { load_media({longer}, {}, kBoth, {}, options); });
  EXPECT_EQ(e.code, "invalid_audio");
  EXPECT_STREQ(e.what(),
               "'a' is not a readable WAV or MP3 file: audio clip is 0.25 s long, more than the "
               "limit of 0.20 s");
}

// Concurrent requests take turns at decoding: with room for one 1x1 image, eight requests of four
// images each never hold more than that one pixel, and every image is read.
TEST(LoadMedia, ConcurrentDecodesStayWithinTheBudget) {
  DecodeBudget budget(1);
  std::vector<MediaSource> sources(4, image_from_url(kPngUrl, "u", 70));
  std::vector<size_t> read(8);
  std::vector<std::thread> requests;
  for (size_t i = 0; i < read.size(); ++i) {
    requests.emplace_back(
        [&, i] { read[i] = load_media(sources, {}, kBoth, {}, {}, budget).size(); });
  }
  for (std::thread& t : requests) t.join();
  EXPECT_EQ(read, std::vector<size_t>(8, 4));
  EXPECT_EQ(budget.peak(), 1);
}

// A request whose client left while its image waited for the budget is dropped with a 499 before
// anything is decoded; the budget is still held meanwhile. (Were the wait deaf to the client, the
// lease would end after 5 s and the image be read: the test fails rather than hangs.)
TEST(LoadMedia, AnImageWaitingForTheBudgetIsDroppedOnceItsClientLeaves) {
  DecodeBudget budget(1);
  std::optional<DecodeBudget::Lease> held(budget.acquire(1));
  std::atomic<bool> gone = false;
  std::atomic<bool> returned = false;
  std::thread client([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    gone = true;
    for (int i = 0; i < 500 && !returned; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    held.reset();
  });
  const ApiError e = error_of([&] {
    load_media({image_from_url(kPngUrl, "u", 70)}, {}, kBoth, {}, {}, budget,
               [&] { return gone.load(); });
  });
  returned = true;
  client.join();
  EXPECT_EQ(e.status, 499);
  EXPECT_STREQ(e.what(), "the client closed the connection while its image waited to be decoded");
  EXPECT_EQ(budget.peak(), 1);
}

// An image larger than the whole budget waits for all of it rather than forever.
TEST(DecodeBudget, AnImageOverTheCapacityTakesAllOfIt) {
  DecodeBudget budget(10);
  { const DecodeBudget::Lease lease = budget.acquire(100); }
  const DecodeBudget::Lease lease = budget.acquire(10);
  EXPECT_EQ(budget.peak(), 10);
}

TEST(ResponsesMedia, InputImageAndInputAudioAreNamedByTheRequestsFields) {
  ResponseStore store;
  const ojson body = {
      {"input",
       {{{"role", "user"},
         {"content",
          {{{"type", "input_text"}, {"text", "what is it?"}},
           {{"type", "input_image"}, {"image_url", kPngUrl}, {"detail", "high"}},
           {{"type", "input_audio"}, {"input_audio", {{"data", "AAAA"}, {"format", "wav"}}}}}}}}}};
  const ResponsesRequest r = parse_responses_request(body, store);
  EXPECT_EQ(r.generation.messages[0]["content"], ojson::parse(R"([{"type": "text",
      "text": "what is it?"}, {"type": "image"}, {"type": "audio"}])"));
  ASSERT_EQ(r.generation.media.size(), 2u);
  EXPECT_EQ(r.generation.media[0].param, "input[0].content[1].image_url");
  EXPECT_EQ(r.generation.media[0].image_tokens, 1120);
  EXPECT_EQ(r.generation.media[1].param, "input[0].content[2].input_audio.data");
  EXPECT_EQ(r.generation.media[1].mime_param, "input[0].content[2].input_audio.format");

  const ojson system = {
      {"input",
       {{{"role", "system"}, {"content", {{{"type", "input_image"}, {"image_url", kPngUrl}}}}}}}};
  EXPECT_STREQ(error_of([&] { parse_responses_request(system, store); }).what(),
               "'input[0].content[0].type' is \"input_image\": images and audio belong to user "
               "messages");
}

TEST(ResponsesMedia, AnEarlierTurnsImagesComeBackWithThePreviousResponse) {
  ResponseStore store;
  store.put("resp_1", {ojson::object(),
                       {{{"role", "user"}, {"content", {image_part(kPngUrl)}}},
                        {{"role", "assistant"}, {"content", "a dot"}}}});
  const ResponsesRequest r =
      parse_responses_request({{"previous_response_id", "resp_1"}, {"input", "and now?"}}, store);
  ASSERT_EQ(r.generation.media.size(), 1u);
  EXPECT_EQ(r.generation.media[0].param, "previous_response_id");
  EXPECT_EQ(r.generation.media[0].base64, kPngBase64);
}

TEST(MessagesMedia, ImageBlocksBecomeImagePartsNamedByTheirSource) {
  const ojson body = {
      {"model", "m"},
      {"max_tokens", 8},
      {"messages",
       {{{"role", "user"},
         {"content",
          {{{"type", "image"},
            {"source", {{"type", "base64"}, {"media_type", "image/png"}, {"data", kPngBase64}}}},
           {{"type", "image"}, {"source", {{"type", "url"}, {"url", "https://example.com/a.png"}}}},
           {{"type", "text"}, {"text", "compare"}}}}}}}};
  const MessagesRequest r = parse_messages_request(body);
  EXPECT_EQ(r.generation.messages[0]["content"], ojson::parse(R"([{"type": "image"},
      {"type": "image"}, {"type": "text", "text": "compare"}])"));
  ASSERT_EQ(r.generation.media.size(), 2u);
  EXPECT_EQ(r.generation.media[0].param, "messages.0.content.0.source.data");
  EXPECT_EQ(r.generation.media[0].mime_param, "messages.0.content.0.source.media_type");
  EXPECT_EQ(r.generation.media[0].mime, "image/png");
  EXPECT_EQ(r.generation.media[1].url, "https://example.com/a.png");
  EXPECT_EQ(r.generation.media[1].param, "messages.0.content.1.source.url");
}

TEST(MessagesMedia, ImagesInAssistantTurnsOrOfUnknownSourcesAreRefused) {
  auto message = [](const ojson& messages) {
    return std::string(
        error_of([&] {
          parse_messages_request({{"model", "m"}, {"max_tokens", 8}, {"messages", messages}});
        }).what());
  };
  const ojson image = {
      {"type", "image"},
      {"source", {{"type", "base64"}, {"media_type", "image/png"}, {"data", kPngBase64}}}};
  EXPECT_EQ(message({{{"role", "user"}, {"content", "hi"}},
                     {{"role", "assistant"}, {"content", {image}}},
                     {{"role", "user"}, {"content", "and?"}}}),
            "'messages.1.content.0.type' \"image\" blocks belong to user messages, not assistant "
            "ones");
  EXPECT_EQ(message({{{"role", "user"},
                      {"content", {{{"type", "image"}, {"source", {{"type", "file"}}}}}}}}),
            "'messages.0.content.0.source.type' must be \"base64\" or \"url\": this server stores "
            "no files, got \"file\"");
}

// 16-bit PCM WAV bytes of `samples` at `rate` (the clips the transcription test cuts).
std::string wav16(const std::vector<float>& samples, int64_t rate) {
  std::string out = "RIFF";
  auto u32 = [&](uint32_t v) {
    for (int b = 0; b < 4; ++b) out.push_back(static_cast<char>(v >> (8 * b) & 0xFF));
  };
  auto u16 = [&](uint16_t v) {
    for (int b = 0; b < 2; ++b) out.push_back(static_cast<char>(v >> (8 * b) & 0xFF));
  };
  u32(static_cast<uint32_t>(36 + 2 * samples.size()));
  out += "WAVEfmt ";
  u32(16);
  u16(1);
  u16(1);
  u32(static_cast<uint32_t>(rate));
  u32(static_cast<uint32_t>(2 * rate));
  u16(2);
  u16(16);
  out += "data";
  u32(static_cast<uint32_t>(2 * samples.size()));
  for (float v : samples) u16(static_cast<uint16_t>(static_cast<int16_t>(v * 16384)));
  return out;
}

// A clip longer than a prompt holds is cut into pieces of at most 30 s that hold its samples in
// order, each cut inside a silence; a short clip is left as it came; a clip over the limit, or
// bytes that are no clip, are refused.
TEST(Transcription, ALongClipIsCutAtItsSilencesIntoPiecesAPromptHolds) {
  const int64_t rate = 8000;
  std::vector<float> samples;
  std::vector<std::pair<int64_t, int64_t>> silences;
  auto tone = [&](double seconds) {
    for (int64_t i = 0; i < static_cast<int64_t>(seconds * rate); ++i) {
      samples.push_back(i % 16 < 8 ? 0.5f : -0.5f);  // every window of it equally loud
    }
  };
  auto silence = [&](double seconds) {
    const auto from = static_cast<int64_t>(samples.size());
    samples.resize(samples.size() + static_cast<size_t>(seconds * rate), 0.0f);
    silences.push_back({from, static_cast<int64_t>(samples.size())});
  };
  tone(24);
  silence(1.5);
  tone(26);
  silence(1.5);
  tone(12);
  const std::string clip = wav16(samples, rate);
  const auto pieces = split_clip(clip);
  ASSERT_EQ(pieces.size(), 3u);
  std::vector<float> joined;
  for (size_t p = 0; p < pieces.size(); ++p) {
    const Waveform w = decode_wav(pieces[p]);  // within 30 s, or this throws
    EXPECT_EQ(w.sample_rate, rate);
    const float* x = w.samples.data_ptr<float>();
    joined.insert(joined.end(), x, x + w.samples.numel());
    if (p + 1 < pieces.size()) {
      const auto cut = static_cast<int64_t>(joined.size());
      EXPECT_TRUE(cut > silences[p].first && cut < silences[p].second)
          << "piece " << p << " ends at sample " << cut << ", outside the silence ["
          << silences[p].first << ", " << silences[p].second << ")";
    }
  }
  const Waveform whole = decode_wav(clip, 600);
  ASSERT_EQ(static_cast<int64_t>(joined.size()), whole.samples.numel());
  const float* original = whole.samples.data_ptr<float>();
  for (size_t i = 0; i < joined.size(); ++i) {
    ASSERT_NEAR(joined[i], original[i], 1.0 / 32767) << "sample " << i;
  }

  const std::string short_clip = wav16(std::vector<float>(rate * 20, 0.25f), rate);
  EXPECT_EQ(split_clip(short_clip), std::vector<std::string>{short_clip});
  EXPECT_THROW(split_clip(wav16(std::vector<float>(rate * 601, 0.25f), rate)), ValueError);
  EXPECT_THROW(split_clip("not audio at all"), ValueError);
}

}  // namespace
}  // namespace torchtpu::server
