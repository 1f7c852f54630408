#include "media/audio.h"

#include <mpg123.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <numeric>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "common/errors.h"
#include "common/json_type.h"
#include "media/kinds.h"

namespace torchtpu {
namespace {

constexpr uint16_t kFormatPcm = 1;
constexpr uint16_t kFormatFloat = 3;
constexpr uint16_t kFormatExtensible = 0xFFFE;
// Sample rates accepted from files: telephone to studio rates. Far outside them the resampling
// filter would grow without bound (its length is inversely proportional to the rate ratio).
constexpr int64_t kMinRate = 1000, kMaxRate = 384000;

uint16_t u16(const char* p) {
  return static_cast<uint16_t>(static_cast<uint8_t>(p[0]) | static_cast<uint8_t>(p[1]) << 8);
}
uint32_t u32(const char* p) { return u16(p) | static_cast<uint32_t>(u16(p + 2)) << 16; }

std::string format_name(uint16_t tag) {
  switch (tag) {
    case kFormatPcm: return "PCM";
    case kFormatFloat: return "IEEE float";
    case 2: return "Microsoft ADPCM";
    case 6: return "A-law";
    case 7: return "mu-law";
    case 0x11: return "IMA ADPCM";
    case 0x55: return "MPEG layer 3";
    default: return "unknown";
  }
}

struct Mpg123Deleter {
  void operator()(mpg123_handle* h) const { mpg123_delete(h); }
};

std::string seconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.2f s", s);
  return buf;
}

// The interleaved samples [frames, channels] as float64 in [-1, 1].
at::Tensor samples_as_double(const char* data, int64_t frames, int64_t channels, uint16_t format,
                             int64_t bits) {
  const int64_t n = frames * channels;
  auto copy = [&](at::ScalarType type) {
    auto t = at::empty({n}, type);
    std::memcpy(t.data_ptr(), data, n * t.element_size());
    return t.to(at::kDouble);
  };
  at::Tensor out;
  if (format == kFormatFloat) {
    out = copy(bits == 32 ? at::kFloat : at::kDouble);
  } else if (bits == 8) {
    out = (copy(at::kByte) - 128.0) / 128.0;
  } else if (bits == 16) {
    out = copy(at::kShort) / 32768.0;
  } else if (bits == 32) {
    out = copy(at::kInt) / 2147483648.0;
  } else {
    auto t = at::empty({n}, at::kInt);
    auto* dst = t.data_ptr<int32_t>();
    const auto* src = reinterpret_cast<const uint8_t*>(data);
    for (int64_t i = 0; i < n; ++i, src += 3) {
      const uint32_t u = src[0] << 8 | src[1] << 16 | static_cast<uint32_t>(src[2]) << 24;
      dst[i] = static_cast<int32_t>(u) >> 8;  // sign-extends the 24-bit value
    }
    out = t.to(at::kDouble) / 8388608.0;
  }
  return out.view({frames, channels});
}

// ValueError naming the first NaN or infinite value among `samples`, [frames] or [frames,
// channels], by its frame from 0 ("WAV sample 5 (channel 1)"): one such sample makes every
// feature frame it falls in NaN, and the audio tower's attention over those frames fails.
void check_finite(const at::Tensor& samples, const std::string& what) {
  const auto bad = at::isfinite(samples).logical_not().flatten();
  if (!bad.any().item<bool>()) return;
  const int64_t i = bad.to(at::kByte).argmax().item<int64_t>();  // the first, as argmax ties go
  const double x = samples.flatten()[i].item<double>();
  const char* kind = std::isnan(x) ? "NaN" : x > 0 ? "+Inf" : "-Inf";
  const int64_t channels = samples.dim() == 2 ? samples.size(1) : 1;
  throw ValueError(what + " sample " + std::to_string(i / channels) +
                   (channels > 1 ? " (channel " + std::to_string(i % channels) + ")" : "") +
                   " is not finite (" + kind + ")");
}

// Options that would divide by zero, index out of range or build an empty filter bank.
void check_options(const AudioFeatureOptions& o, int64_t frame_length, int64_t hop) {
  auto fail = [](const std::string& what) { throw ValueError("audio feature options: " + what); };
  if (o.sampling_rate < 1)
    fail("sampling_rate must be positive, got " + std::to_string(o.sampling_rate));
  if (o.feature_size < 1)
    fail("feature_size must be positive, got " + std::to_string(o.feature_size));
  if (frame_length < 2 || hop < 1) {
    fail("frame_length_ms and hop_length_ms give frames of " + std::to_string(frame_length) +
         " and hops of " + std::to_string(hop) + " samples; at least 2 and 1 are needed");
  }
  if (!(o.min_frequency >= 0 && o.min_frequency < o.max_frequency &&
        o.max_frequency <= o.sampling_rate / 2.0)) {
    fail("need 0 <= min_frequency < max_frequency <= sampling_rate / 2, got " +
         std::to_string(o.min_frequency) + " and " + std::to_string(o.max_frequency) + " Hz");
  }
  if (!(o.mel_floor > 0)) fail("mel_floor must be positive, got " + std::to_string(o.mel_floor));
  if (o.pad_to_multiple_of < 1 || o.max_samples < 1) {
    fail("pad_to_multiple_of and max_samples must be positive");
  }
}

}  // namespace

Waveform decode_wav(std::string_view bytes, double max_seconds) {
  if (bytes.size() < 12 || bytes.substr(0, 4) != "RIFF" || bytes.substr(8, 4) != "WAVE") {
    throw ValueError("audio is not a WAV file: it does not start with a RIFF/WAVE header (" +
                     std::to_string(bytes.size()) + " bytes)");
  }
  const char* fmt = nullptr;
  size_t fmt_size = 0;
  const char* data = nullptr;
  size_t data_size = 0;
  size_t at = 12;
  while (at + 8 <= bytes.size() && !data) {
    const std::string_view id = bytes.substr(at, 4);
    const size_t size = u32(bytes.data() + at + 4);
    const size_t body = at + 8;
    if (size > bytes.size() - body) {
      throw ValueError("truncated WAV file: chunk \"" + std::string(id) + "\" at byte " +
                       std::to_string(at) + " declares " + std::to_string(size) +
                       " bytes but only " + std::to_string(bytes.size() - body) + " remain");
    }
    if (id == "fmt ") {
      fmt = bytes.data() + body;
      fmt_size = size;
    } else if (id == "data") {
      data = bytes.data() + body;
      data_size = size;
    }
    at = body + size + (size & 1);
  }
  if (!fmt) throw ValueError("WAV file has no \"fmt \" chunk before its audio data");
  if (fmt_size < 16) {
    throw ValueError("WAV file's \"fmt \" chunk is " + std::to_string(fmt_size) +
                     " bytes, shorter than the 16 it needs");
  }
  if (!data) throw ValueError("truncated WAV file: no \"data\" chunk");
  uint16_t format = u16(fmt);
  const int64_t channels = u16(fmt + 2);
  const int64_t rate = u32(fmt + 4);
  const int64_t block_align = u16(fmt + 12);
  const int64_t bits = u16(fmt + 14);
  if (format == kFormatExtensible) {
    if (fmt_size < 40) {
      throw ValueError("WAV file is WAVE_FORMAT_EXTENSIBLE but its \"fmt \" chunk is " +
                       std::to_string(fmt_size) + " bytes, shorter than the 40 it needs");
    }
    format = u16(fmt + 24);  // the sub-format GUID's leading format tag
  }
  const bool pcm = format == kFormatPcm && (bits == 8 || bits == 16 || bits == 24 || bits == 32);
  const bool ieee = format == kFormatFloat && (bits == 32 || bits == 64);
  if (!pcm && !ieee) {
    char tag[8];
    std::snprintf(tag, sizeof(tag), "0x%04x", format);
    throw ValueError(std::string("unsupported WAV encoding: format ") + tag + " (" +
                     format_name(format) + ") with " + std::to_string(bits) +
                     " bits per sample; supported are PCM 8, 16, 24 and 32-bit and IEEE float "
                     "32 and 64-bit");
  }
  if (channels < 1 || rate < 1 || block_align != channels * (bits / 8)) {
    throw ValueError("WAV file's \"fmt \" chunk is inconsistent: " + std::to_string(channels) +
                     " channels, " + std::to_string(rate) + " Hz, block align " +
                     std::to_string(block_align) + " for " + std::to_string(bits) + "-bit samples");
  }
  if (rate < kMinRate || rate > kMaxRate) {
    throw ValueError("WAV sample rate " + std::to_string(rate) + " Hz is outside the supported " +
                     std::to_string(kMinRate) + " to " + std::to_string(kMaxRate) + " Hz");
  }
  const int64_t frames = static_cast<int64_t>(data_size) / block_align;
  if (frames > max_seconds * rate) {
    throw ValueError("audio clip is " + seconds(static_cast<double>(frames) / rate) +
                     " long, more than the limit of " + seconds(max_seconds));
  }
  if (frames == 0) throw ValueError("WAV file holds no audio samples");
  const auto interleaved = samples_as_double(data, frames, channels, format, bits);
  check_finite(interleaved, "WAV");
  const auto mono = interleaved.mean(1);
  // A finite 64-bit sample beyond float32's range would be infinite once narrowed.
  const auto beyond = mono.abs() > std::numeric_limits<float>::max();
  if (beyond.any().item<bool>()) {
    const int64_t i = beyond.to(at::kByte).argmax().item<int64_t>();
    char value[32];
    std::snprintf(value, sizeof(value), "%g", mono[i].item<double>());
    throw ValueError("WAV sample " + std::to_string(i) + " is " + value +
                     ", beyond the range of float32 samples");
  }
  return {mono.to(at::kFloat), rate};
}

// The whole file is fed to libmpg123 (the decoder libsndfile, and with it soundfile and librosa,
// uses) at once and decoded to float.
Waveform decode_mp3(std::string_view bytes, double max_seconds) {
  int error = MPG123_OK;
  std::unique_ptr<mpg123_handle, Mpg123Deleter> handle(mpg123_new(nullptr, &error));
  if (!handle) {
    throw std::runtime_error(std::string("libmpg123: ") + mpg123_plain_strerror(error));
  }
  mpg123_handle* h = handle.get();
  // Float output at the file's own rate and channel count: averaging to mono and resampling are
  // ours, as for WAV. Gapless decoding drops the encoder's delay and padding (the LAME tag).
  mpg123_param(h, MPG123_FLAGS, MPG123_QUIET | MPG123_GAPLESS | MPG123_FORCE_FLOAT, 0);
  mpg123_format_none(h);
  const long* rates = nullptr;
  size_t rate_count = 0;
  mpg123_rates(&rates, &rate_count);
  for (size_t i = 0; i < rate_count; ++i) {
    mpg123_format(h, rates[i], MPG123_MONO | MPG123_STEREO, MPG123_ENC_FLOAT_32);
  }
  if (mpg123_open_feed(h) != MPG123_OK ||
      mpg123_feed(h, reinterpret_cast<const unsigned char*>(bytes.data()), bytes.size()) !=
          MPG123_OK) {
    throw ValueError(std::string("MP3 decoding failed: ") + mpg123_strerror(h));
  }
  std::vector<float> interleaved;
  long rate = 0;
  int channels = 0, encoding = 0;
  std::vector<unsigned char> buffer(1 << 16);
  for (;;) {
    size_t done = 0;
    const int status = mpg123_read(h, buffer.data(), buffer.size(), &done);
    if (status == MPG123_NEW_FORMAT) {
      mpg123_getformat(h, &rate, &channels, &encoding);
      continue;
    }
    const auto* samples = reinterpret_cast<const float*>(buffer.data());
    interleaved.insert(interleaved.end(), samples, samples + done / sizeof(float));
    if (rate > 0 && static_cast<double>(interleaved.size()) / channels > max_seconds * rate) {
      throw ValueError("audio clip is longer than the limit of " + seconds(max_seconds));
    }
    if (status == MPG123_NEED_MORE || status == MPG123_DONE) break;
    if (status != MPG123_OK) {
      throw ValueError(std::string("not a readable MP3 file: ") + mpg123_strerror(h));
    }
  }
  if (rate == 0 || interleaved.empty()) {
    throw ValueError("not a readable MP3 file: no MPEG audio frames in its " +
                     std::to_string(bytes.size()) + " bytes");
  }
  const int64_t frames = static_cast<int64_t>(interleaved.size()) / channels;
  const auto samples = at::from_blob(interleaved.data(), {frames, channels}, at::kFloat);
  check_finite(samples, "MP3");
  // Averaged in float64, as decode_wav averages (librosa's to_mono).
  return {samples.to(at::kDouble).mean(1).to(at::kFloat), static_cast<int64_t>(rate)};
}

at::Tensor resample(const at::Tensor& samples, int64_t from_rate, int64_t to_rate) {
  if (from_rate < kMinRate || from_rate > kMaxRate || to_rate < kMinRate || to_rate > kMaxRate) {
    throw ValueError("resampling " + std::to_string(from_rate) + " Hz to " +
                     std::to_string(to_rate) + " Hz: rates must be within " +
                     std::to_string(kMinRate) + " to " + std::to_string(kMaxRate) + " Hz");
  }
  if (samples.dim() != 1) {
    throw ValueError("resample takes mono samples [N], got a tensor of " +
                     std::to_string(samples.dim()) + " dimensions");
  }
  if (from_rate == to_rate) return samples.to(at::kFloat);
  // Output n = j·up + p sits at input position j·down + p·down/up: every output of phase p uses
  // the same taps, read from the input at stride `down` (polyphase).
  const int64_t g = std::gcd(from_rate, to_rate);
  const int64_t up = to_rate / g, down = from_rate / g;
  const int64_t n = samples.size(0);
  const int64_t n_out = (n * up + down - 1) / down;
  const double cutoff = 0.95 * std::min(1.0, static_cast<double>(to_rate) / from_rate);
  constexpr double kZeroCrossings = 32.0, kBeta = 8.6;
  const int64_t radius = static_cast<int64_t>(std::ceil(kZeroCrossings / cutoff));
  const int64_t taps = 2 * radius;
  const int64_t rows = (n_out + up - 1) / up;

  // weights[p][t]: tap t of phase p reads input index base_p - radius + 1 + t, at distance
  // d = frac_p + radius - 1 - t from the output instant.
  const auto options = at::TensorOptions().dtype(at::kDouble);
  const auto phase = at::arange(up, options).unsqueeze(1);
  const auto frac = at::remainder(phase * down, up) / static_cast<double>(up);
  const auto d = frac + (radius - 1) - at::arange(taps, options).unsqueeze(0);
  const auto x = cutoff * d;
  const auto sinc = at::where(x == 0, at::ones_like(x), at::sin(M_PI * x) / (M_PI * x));
  const auto r = (d / radius).clamp(-1.0, 1.0);
  const auto window = at::i0(kBeta * at::sqrt(1.0 - r * r)) / std::cyl_bessel_i(0.0, kBeta);
  const auto weights = cutoff * sinc * window * (d.abs() <= radius);

  const int64_t length = rows * down + down + taps;
  const auto padded = at::constant_pad_nd(
      samples.to(at::kDouble), {radius - 1, std::max<int64_t>(0, length - n - radius + 1)});
  auto out = at::zeros({rows, up}, options);
  for (int64_t p = 0; p < up && p < n_out; ++p) {
    const int64_t base = p * down / up;
    const auto windows = padded.narrow(0, base, padded.size(0) - base).unfold(0, taps, down);
    out.select(1, p).copy_(at::mv(windows.narrow(0, 0, rows), weights[p]));
  }
  return out.flatten().narrow(0, 0, n_out).to(at::kFloat);
}

AudioFeatures audio_features(const at::Tensor& samples, const AudioFeatureOptions& o) {
  if (samples.dim() != 1 || !samples.is_floating_point()) {
    throw ValueError("audio samples must be a float tensor [N] (mono), got " +
                     std::string(c10::toString(samples.scalar_type())) + " with " +
                     std::to_string(samples.dim()) + " dimensions");
  }
  check_finite(samples, "audio");
  const int64_t n = samples.size(0);
  if (n > o.max_samples) {
    throw ValueError("audio clip is " + seconds(static_cast<double>(n) / o.sampling_rate) + " (" +
                     std::to_string(n) + " samples at " + std::to_string(o.sampling_rate) +
                     " Hz), more than the limit of " +
                     seconds(static_cast<double>(o.max_samples) / o.sampling_rate) + " (" +
                     std::to_string(o.max_samples) + " samples)");
  }
  const int64_t frame_length = std::lround(o.sampling_rate * o.frame_length_ms / 1000.0);
  const int64_t hop = std::lround(o.sampling_rate * o.hop_length_ms / 1000.0);
  check_options(o, frame_length, hop);
  const int64_t pad_left = frame_length / 2;  // semicausal: the first frame is centred at t = 0
  const int64_t frame_size = frame_length + 1;
  if (n <= frame_size - 1 - pad_left) {
    throw ValueError("audio clip is too short: " + std::to_string(n) + " samples at " +
                     std::to_string(o.sampling_rate) + " Hz; one feature frame needs more than " +
                     std::to_string(frame_size - 1 - pad_left));
  }
  int64_t fft_length = 1;
  while (fft_length < frame_length) fft_length *= 2;
  if (o.fft_overdrive) fft_length *= 2;

  // The extractor pads to a multiple of pad_to_multiple_of, in float32.
  const int64_t padded_n =
      (n + o.pad_to_multiple_of - 1) / o.pad_to_multiple_of * o.pad_to_multiple_of;
  auto wave = at::constant_pad_nd(samples.to(at::kFloat).cpu(), {pad_left, padded_n - n});
  if (o.input_scale_factor != 1.0) wave = wave * o.input_scale_factor;
  const int64_t frames_n = (padded_n + pad_left - frame_size) / hop + 1;
  const auto unfolded = wave.unfold(0, frame_size, hop);  // [frames, frame_length + 1]
  at::Tensor frames;
  if (o.preemphasis > 0.0 && o.preemphasis_htk_flavor) {
    frames = at::cat({unfolded.narrow(1, 0, 1) * (1.0 - o.preemphasis),
                      unfolded.narrow(1, 1, frame_length - 1) -
                          o.preemphasis * unfolded.narrow(1, 0, frame_length - 1)},
                     1);
  } else if (o.preemphasis > 0.0) {
    frames =
        unfolded.narrow(1, 1, frame_length) - o.preemphasis * unfolded.narrow(1, 0, frame_length);
  } else {
    frames = unfolded.narrow(1, 0, frame_length);
  }
  // Periodic Hann window, rounded to float32 as the extractor holds it.
  const auto k = at::arange(frame_length, at::kDouble);
  const auto window = (0.5 - 0.5 * at::cos(2 * M_PI * k / frame_length)).to(at::kFloat);
  const auto magnitude = at::fft_rfft((frames * window).to(at::kDouble), fft_length, -1).abs();

  // HTK mel filter bank (transformers' mel_filter_bank with norm=None, mel_scale="htk").
  auto mel = [](double hz) { return 2595.0 * std::log10(1.0 + hz / 700.0); };
  const auto mel_points =
      at::linspace(mel(o.min_frequency), mel(o.max_frequency), o.feature_size + 2, at::kDouble);
  const auto filter_hz = 700.0 * (at::pow(10.0, mel_points / 2595.0) - 1.0);
  const int64_t bins = fft_length / 2 + 1;
  const auto fft_hz = at::linspace(0, o.sampling_rate / 2, bins, at::kDouble);
  const auto diff =
      filter_hz.narrow(0, 1, o.feature_size + 1) - filter_hz.narrow(0, 0, o.feature_size + 1);
  const auto slopes = filter_hz.unsqueeze(0) - fft_hz.unsqueeze(1);  // [bins, feature_size + 2]
  const auto down = -slopes.narrow(1, 0, o.feature_size) / diff.narrow(0, 0, o.feature_size);
  const auto up = slopes.narrow(1, 2, o.feature_size) / diff.narrow(0, 1, o.feature_size);
  const auto filters = at::clamp_min(at::minimum(down, up), 0.0);

  const auto log_mel = at::log(at::matmul(magnitude, filters) + o.mel_floor).to(at::kFloat);
  // Finite samples near float32's limit can still overflow the frames once scaled or
  // pre-emphasised; features that are not finite would fail the tower's attention.
  if (!at::isfinite(log_mel).all().item<bool>()) {
    char peak[32];
    std::snprintf(peak, sizeof(peak), "%g", samples.abs().max().item<double>());
    throw ValueError(std::string("audio clip is too loud: its log-mel features overflow float32 ") +
                     "(its largest sample has magnitude " + peak + ")");
  }
  // A frame is valid when the last sample of its window is a real sample of the clip.
  const auto frame_end = at::arange(frames_n, at::kLong) * hop + (frame_size - 1 - pad_left);
  const auto mask = frame_end < n;
  AudioFeatures out;
  out.features = log_mel * mask.unsqueeze(1);
  out.mask = mask;
  out.soft_tokens = audio_soft_tokens(mask);
  return out;
}

Waveform decode_audio(std::string_view bytes, double max_seconds) {
  const std::string_view type = sniff_media_type(MediaKind::kAudio, bytes);
  if (type == "audio/wav") return decode_wav(bytes, max_seconds);
  if (type == "audio/mpeg") return decode_mp3(bytes, max_seconds);
  const auto byte = [&](size_t i) { return static_cast<unsigned char>(bytes[i]); };
  std::string start;
  for (size_t i = 0; i < std::min<size_t>(bytes.size(), 4); ++i) {
    char hex[4];
    std::snprintf(hex, sizeof(hex), "%02x", byte(i));
    start += (i ? " " : "") + std::string(hex);
  }
  throw ValueError(
      "audio is neither WAV (a RIFF/WAVE header) nor MP3 (an ID3 tag or an MPEG "
      "frame sync): its " +
      std::to_string(bytes.size()) + " bytes start " +
      (start.empty() ? "with nothing" : "with " + start));
}

AudioFeatures audio_features_from_waveform(const Waveform& wave, const AudioFeatureOptions& o) {
  return audio_features(resample(wave.samples, wave.sample_rate, o.sampling_rate), o);
}

AudioFeatures audio_features_from_file(std::string_view bytes, const AudioFeatureOptions& o) {
  return audio_features_from_waveform(
      decode_audio(bytes, static_cast<double>(o.max_samples) / o.sampling_rate), o);
}

int64_t audio_soft_tokens(const at::Tensor& mask) {
  return mask.slice(0, 0, c10::nullopt, 4).sum().item<int64_t>();
}

AudioFeatureOptions load_audio_feature_options(const std::string& model_dir) {
  namespace fs = std::filesystem;
  using nlohmann::json;
  auto read = [](const fs::path& path) -> std::optional<json> {
    std::ifstream in(path, std::ios::binary);
    if (!in) return std::nullopt;
    std::ostringstream text;
    text << in.rdbuf();
    try {
      return json::parse(text.str());
    } catch (const json::exception& e) {
      throw FormatError(path.string() + ": invalid JSON: " + json_error_text(e));
    }
  };
  std::string file, prefix;
  json fe;
  const fs::path processor = fs::path(model_dir) / "processor_config.json";
  const fs::path preprocessor = fs::path(model_dir) / "preprocessor_config.json";
  if (auto j = read(processor); j && j->is_object() && j->contains("feature_extractor")) {
    file = processor.string();
    prefix = "feature_extractor.";
    fe = (*j)["feature_extractor"];
  } else if (auto p = read(preprocessor);
             p && p->is_object() &&
             p->value("feature_extractor_type", "") == "Gemma4AudioFeatureExtractor") {
    file = preprocessor.string();
    fe = *p;
  } else {
    return {};
  }
  if (!fe.is_object()) throw FormatError(file + ": " + prefix + " must be an object");
  auto fail = [&](const std::string& key, const std::string& what) {
    throw FormatError(file + ": " + prefix + key + " " + what);
  };
  auto number = [&](const char* key, double def) {
    if (!fe.contains(key) || fe[key].is_null()) return def;
    if (!fe[key].is_number()) fail(key, "must be a number, got " + fe[key].dump());
    return fe[key].get<double>();
  };
  auto integer = [&](const char* key, int64_t def) {
    if (!fe.contains(key) || fe[key].is_null()) return def;
    if (!fe[key].is_number_integer()) fail(key, "must be an integer, got " + fe[key].dump());
    return fe[key].get<int64_t>();
  };
  auto boolean = [&](const char* key, bool def) {
    if (!fe.contains(key) || fe[key].is_null()) return def;
    if (!fe[key].is_boolean()) fail(key, "must be true or false, got " + fe[key].dump());
    return fe[key].get<bool>();
  };
  AudioFeatureOptions o;
  o.feature_size = integer("feature_size", o.feature_size);
  o.sampling_rate = integer("sampling_rate", o.sampling_rate);
  o.frame_length_ms = number("frame_length_ms", o.frame_length_ms);
  o.hop_length_ms = number("hop_length_ms", o.hop_length_ms);
  o.min_frequency = number("min_frequency", o.min_frequency);
  o.max_frequency = number("max_frequency", o.max_frequency);
  o.preemphasis = number("preemphasis", o.preemphasis);
  o.preemphasis_htk_flavor = boolean("preemphasis_htk_flavor", o.preemphasis_htk_flavor);
  o.fft_overdrive = boolean("fft_overdrive", o.fft_overdrive);
  o.input_scale_factor = number("input_scale_factor", o.input_scale_factor);
  o.mel_floor = number("mel_floor", o.mel_floor);
  if (number("dither", 0.0) != 0.0) {
    fail("dither", "= " + fe["dither"].dump() +
                       " is not supported: dithering adds random noise, so features would not "
                       "be reproducible");
  }
  for (const char* key : {"per_bin_mean", "per_bin_stddev"}) {
    if (fe.contains(key) && !fe[key].is_null()) {
      fail(key, "is not supported: per-bin normalisation is not implemented");
    }
  }
  return o;
}

}  // namespace torchtpu
