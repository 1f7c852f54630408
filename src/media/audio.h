// Audio input for Gemma 4: WAV and MP3 decoding, resampling to the feature extractor's rate, and
// the log-mel features of transformers' Gemma4AudioFeatureExtractor with the soft-token count of
// Gemma4Processor.replace_audio_token. Runs on the host (CPU tensors); the audio tower moves
// the features to its device.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <string>
#include <string_view>

namespace torchtpu {

// A decoded clip: mono float32 samples in [-1, 1] at the file's own rate.
struct Waveform {
  at::Tensor samples;  // [N] float32, CPU
  int64_t sample_rate = 0;
};

// RIFF/WAVE bytes: PCM 8 (unsigned), 16, 24 and 32-bit and IEEE float 32 and 64-bit, plain or
// WAVE_FORMAT_EXTENSIBLE, any channel count (averaged to mono as librosa's to_mono does). Integer
// samples are scaled by 2^-(bits-1) (8-bit: (x - 128) / 128), as soundfile reads them.
// ValueError naming what is wrong: not a WAV file, truncated, unsupported encoding, a clip longer
// than `max_seconds`, the first NaN or infinite sample (loud finite ones are read as they are).
Waveform decode_wav(std::string_view bytes, double max_seconds = 30.0);

// MP3 bytes (MPEG-1/2/2.5 audio, layers I-III; ID3 tags skipped) through libmpg123, gapless (the
// encoder's delay and padding dropped as the LAME tag says), channels averaged to mono.
// ValueError for data without MPEG audio frames, a clip longer than `max_seconds` or a NaN or
// infinite sample.
Waveform decode_mp3(std::string_view bytes, double max_seconds = 30.0);

// decode_wav for bytes starting "RIFF....WAVE", decode_mp3 for an ID3 tag or an MPEG frame sync;
// ValueError naming both formats for anything else.
Waveform decode_audio(std::string_view bytes, double max_seconds = 30.0);

// Band-limited resampling by a windowed sinc (Kaiser window, beta 8.6, 32 zero crossings of a
// low-pass at 0.95 of the lower Nyquist frequency), evaluated exactly at each output instant
// n * from_rate / to_rate in float64. Returns ceil(N * to_rate / from_rate) float32 samples.
// Both rates must lie within 1 kHz to 384 kHz, as must a WAV file's (ValueError otherwise).
at::Tensor resample(const at::Tensor& samples, int64_t from_rate, int64_t to_rate);

// Gemma4AudioFeatureExtractor's parameters (transformers' defaults; a checkpoint's
// preprocessor_config.json may override them).
struct AudioFeatureOptions {
  int64_t feature_size = 128;  // mel bins
  int64_t sampling_rate = 16000;
  double frame_length_ms = 20.0;
  double hop_length_ms = 10.0;
  double min_frequency = 0.0;
  double max_frequency = 8000.0;
  double preemphasis = 0.0;
  bool preemphasis_htk_flavor = true;
  bool fft_overdrive = false;
  double input_scale_factor = 1.0;
  double mel_floor = 1e-3;
  int64_t pad_to_multiple_of = 128;  // samples
  // The longest clip accepted, in samples: the extractor's max_length (30 s at 16 kHz, i.e. the
  // processor's 750 soft tokens). Longer clips are refused rather than silently truncated.
  int64_t max_samples = 480000;
};

// The extractor's parameters saved with a checkpoint: processor_config.json's
// "feature_extractor" object, else preprocessor_config.json when it describes a
// Gemma4AudioFeatureExtractor; transformers' defaults when neither does. FormatError naming the
// file and field for what this extractor does not implement (dither, per-bin normalisation).
AudioFeatureOptions load_audio_feature_options(const std::string& model_dir);

// One clip after feature extraction.
struct AudioFeatures {
  at::Tensor features;      // [T, feature_size] float32 log-mel, zero at invalid frames
  at::Tensor mask;          // [T] bool, true where a frame lies wholly inside the clip
  int64_t soft_tokens = 0;  // audio soft tokens this clip takes in a prompt
};

// Log-mel features of mono samples already at options.sampling_rate, exactly as
// Gemma4AudioFeatureExtractor computes them for a batch of one (padded to pad_to_multiple_of,
// semicausal framing, periodic Hann window, |rFFT|, HTK mel filter bank, log(x + mel_floor)).
// ValueError for a clip too short for one valid frame, longer than max_samples, or holding a NaN
// or infinite sample (named by its index).
AudioFeatures audio_features(const at::Tensor& samples, const AudioFeatureOptions& options = {});

// A decoded clip resampled to options.sampling_rate when it has another rate, then audio_features.
AudioFeatures audio_features_from_waveform(const Waveform& wave,
                                           const AudioFeatureOptions& options = {});

// decode_audio (WAV or MP3), then audio_features_from_waveform.
AudioFeatures audio_features_from_file(std::string_view bytes,
                                       const AudioFeatureOptions& options = {});

// The soft tokens of a feature mask: its valid frames after the encoder's two stride-2
// subsampling steps (Gemma4Processor.replace_audio_token).
int64_t audio_soft_tokens(const at::Tensor& mask);

}  // namespace torchtpu
