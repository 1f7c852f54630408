// Audio from Python: WAV decoding, resampling, Gemma 4's log-mel features and the audio tower, so
// that the parity suites drive the C++ code from pytest. Every call releases the GIL while it
// computes.
#include <pybind11/stl.h>

#include <string>

#include "common/errors.h"
#include "engine/engine.h"
#include "media/audio.h"
#include "model/audio.h"
#include "python/bindings.h"

namespace torchtpu::python {
namespace {

py::dict features_dict(const AudioFeatures& clip) {
  py::dict out;
  out["features"] = to_python(clip.features);
  out["mask"] = to_python(clip.mask);
  out["soft_tokens"] = clip.soft_tokens;
  return out;
}

}  // namespace

void bind_audio(py::module_& m) {
  m.def(
      "decode_audio",
      [](const py::bytes& data, double max_seconds) {
        const std::string_view bytes = data;
        Waveform wave;
        {
          py::gil_scoped_release released;
          wave = decode_audio(bytes, max_seconds);
        }
        return py::make_tuple(to_python(wave.samples), wave.sample_rate);
      },
      py::arg("data"), py::kw_only(), py::arg("max_seconds") = 30.0,
      "WAV or MP3 bytes -> (samples, sample_rate): mono float32 samples in [-1, 1] (channels "
      "averaged) at the file's rate. ValueError for anything that is not a supported WAV or MP3 "
      "file or is longer than max_seconds.");
  m.def(
      "resample_audio",
      [](py::handle samples, int64_t from_rate, int64_t to_rate) {
        const at::Tensor in = to_tensor(samples, "samples");
        at::Tensor out;
        {
          py::gil_scoped_release released;
          out = resample(in, from_rate, to_rate);
        }
        return to_python(out);
      },
      py::arg("samples"), py::arg("from_rate"), py::arg("to_rate"),
      "Windowed-sinc resampling of mono float samples (Kaiser window, 32 zero crossings).");
  const AudioFeatureOptions defaults;
  m.def(
      "audio_features",
      [](py::handle audio, int64_t max_samples, int64_t feature_size, int64_t sampling_rate,
         double frame_length_ms, double hop_length_ms, double min_frequency, double max_frequency,
         double preemphasis, bool preemphasis_htk_flavor, bool fft_overdrive,
         double input_scale_factor, double mel_floor) {
        AudioFeatureOptions options;
        options.max_samples = max_samples;
        options.feature_size = feature_size;
        options.sampling_rate = sampling_rate;
        options.frame_length_ms = frame_length_ms;
        options.hop_length_ms = hop_length_ms;
        options.min_frequency = min_frequency;
        options.max_frequency = max_frequency;
        options.preemphasis = preemphasis;
        options.preemphasis_htk_flavor = preemphasis_htk_flavor;
        options.fft_overdrive = fft_overdrive;
        options.input_scale_factor = input_scale_factor;
        options.mel_floor = mel_floor;
        AudioFeatures clip;
        if (PyBytes_Check(audio.ptr())) {
          const std::string_view bytes = audio.cast<py::bytes>();
          py::gil_scoped_release released;
          clip = audio_features_from_file(bytes, options);
        } else {
          const at::Tensor samples = to_tensor(audio, "audio");
          py::gil_scoped_release released;
          clip = audio_features(samples, options);
        }
        return features_dict(clip);
      },
      py::arg("audio"), py::kw_only(), py::arg("max_samples") = defaults.max_samples,
      py::arg("feature_size") = defaults.feature_size,
      py::arg("sampling_rate") = defaults.sampling_rate,
      py::arg("frame_length_ms") = defaults.frame_length_ms,
      py::arg("hop_length_ms") = defaults.hop_length_ms,
      py::arg("min_frequency") = defaults.min_frequency,
      py::arg("max_frequency") = defaults.max_frequency,
      py::arg("preemphasis") = defaults.preemphasis,
      py::arg("preemphasis_htk_flavor") = defaults.preemphasis_htk_flavor,
      py::arg("fft_overdrive") = defaults.fft_overdrive,
      py::arg("input_scale_factor") = defaults.input_scale_factor,
      py::arg("mel_floor") = defaults.mel_floor,
      "Gemma 4 log-mel features of WAV bytes (decoded, resampled to sampling_rate) or of a float "
      "tensor of mono samples at sampling_rate: {'features': [T, feature_size] float32, 'mask': "
      "[T] bool, 'soft_tokens': int}. The keywords are Gemma4AudioFeatureExtractor's.");

  m.def(
      "load_audio_feature_options",
      [](const std::string& model_dir) {
        const AudioFeatureOptions o = load_audio_feature_options(model_dir);
        py::dict out;
        out["feature_size"] = o.feature_size;
        out["sampling_rate"] = o.sampling_rate;
        out["frame_length_ms"] = o.frame_length_ms;
        out["hop_length_ms"] = o.hop_length_ms;
        out["min_frequency"] = o.min_frequency;
        out["max_frequency"] = o.max_frequency;
        out["preemphasis"] = o.preemphasis;
        out["preemphasis_htk_flavor"] = o.preemphasis_htk_flavor;
        out["fft_overdrive"] = o.fft_overdrive;
        out["input_scale_factor"] = o.input_scale_factor;
        out["mel_floor"] = o.mel_floor;
        return out;
      },
      py::arg("model_dir"),
      "The feature extractor's parameters a checkpoint directory saves (processor_config.json or "
      "preprocessor_config.json), as audio_features' keywords.");

  py::class_<AudioTower>(m, "AudioTower")
      .def(py::init([](const std::string& model_dir, py::handle dtype, py::handle device) {
             const ModelOptions options = tower_options(dtype, device);
             py::gil_scoped_release released;
             return std::make_unique<AudioTower>(model_dir, options);
           }),
           py::arg("model_dir"), py::kw_only(), py::arg("dtype") = "bfloat16",
           py::arg("device") = py::none(),
           "The audio encoder and its embedder (model.audio_tower, model.embed_audio) of a "
           "checkpoint directory.")
      .def(
          "embed",
          [](const AudioTower& tower, py::handle features, py::handle mask) {
            const at::Tensor f = to_tensor(features, "features");
            const at::Tensor v = to_tensor(mask, "mask");
            at::Tensor out;
            {
              py::gil_scoped_release released;
              out = tower.embed(f, v);
            }
            return to_python(out);
          },
          py::arg("features"), py::arg("mask"),
          "features [T, 128] and mask [T] -> [soft_tokens, text hidden] embeddings in the "
          "compute dtype (valid positions only).")
      .def(
          "encode",
          [](const AudioTower& tower, py::handle features, py::handle mask) {
            const at::Tensor f = to_tensor(features, "features");
            const at::Tensor v = to_tensor(mask, "mask");
            std::pair<at::Tensor, at::Tensor> out;
            {
              py::gil_scoped_release released;
              out = tower.encode(f, v);
            }
            return py::make_tuple(to_python(out.first), to_python(out.second));
          },
          py::arg("features"), py::arg("mask"),
          "The encoder's output before embed_audio: ([T/4, output_proj_dims], mask [T/4]).");
}

}  // namespace torchtpu::python
