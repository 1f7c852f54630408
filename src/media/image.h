// Images for Gemma 4's vision encoder: decoding (JPEG through libjpeg-turbo, PNG through libpng,
// WebP through libwebp) to the RGB pixels transformers would see, and transformers'
// Gemma4ImageProcessor (the torchvision backend): an aspect-ratio-preserving resize to the soft
// token budget, rescaling to [0, 1] and cutting into patches with their (x, y) positions.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <string_view>
#include <utility>

#include "media/kinds.h"

namespace torchtpu {

// What decode_image accepts; larger inputs are refused before any pixel is decoded.
struct ImageLimits {
  int64_t max_bytes = int64_t{32} << 20;  // encoded size
  int64_t max_pixels = int64_t{1} << 26;  // width * height (67 megapixels)
};

// JPEG, PNG or WebP bytes to RGB uint8 [3, H, W] on the CPU, the pixels transformers' image
// processors see for the file opened by Pillow: grey, palette and CMYK images as Pillow's
// convert("RGB") makes them, images with transparency (alpha or tRNS) composited onto white as
// transformers' convert_to_rgb does (no EXIF rotation: the processors do none either).
// ValueError for an unknown or unsupported format (GIF, animated WebP), corrupt or
// truncated data, or an image over the limits, naming the format and what is wrong.
at::Tensor decode_image(std::string_view bytes, const ImageLimits& limits = {});

// The (width, height) a JPEG, PNG or WebP header declares, which decode_image's result has, read
// without decoding a pixel, so that a caller can budget the memory a decode will take. {0, 0} when
// the header does not parse (decode_image then says what is wrong).
std::pair<int64_t, int64_t> image_size(std::string_view bytes);

struct ImageProcessorOptions {
  int64_t patch_size = 16;
  int64_t pooling_kernel_size = 3;
  int64_t max_soft_tokens = 280;  // one of kImageSoftTokenBudgets
};

// One image after preprocessing (Gemma4ImageProcessor's outputs for it, without the padding).
struct ImagePatches {
  at::Tensor pixels;        // [P, 3 * patch_size^2] float32 in [0, 1], (row, column, channel)
  at::Tensor positions;     // [P, 2] int64 (x, y) patch coordinates, row by row
  int64_t soft_tokens = 0;  // P / pooling_kernel_size^2: image tokens the prompt needs
};

// get_aspect_ratio_preserving_size: the largest (height, width), both multiples of
// pooling_kernel_size * patch_size, with at most max_patches patches. ValueError when none exists.
std::pair<int64_t, int64_t> aspect_ratio_preserving_size(int64_t height, int64_t width,
                                                         int64_t patch_size, int64_t max_patches,
                                                         int64_t pooling_kernel_size);

// RGB uint8 [3, H, W] (decode_image's result) to patches: resized (bicubic, antialiased, on the
// uint8 image as torchvision resizes it on the CPU) unless already of the target size, scaled by
// 1/255, cut into patches.
ImagePatches preprocess_image(const at::Tensor& rgb, const ImageProcessorOptions& options = {});

}  // namespace torchtpu
