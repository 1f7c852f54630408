// src/media: the image processor's target sizes (values from transformers'
// get_aspect_ratio_preserving_size), patch layout, and decode_image's refusals. Pixel parity with
// Pillow and Gemma4ImageProcessor is in tests/python/test_vision.py.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <string_view>

#include "media/image.h"

namespace torchtpu {
namespace {

using ::testing::HasSubstr;
using namespace std::string_view_literals;

// The message of the c10::ValueError `f` throws.
template <typename F>
std::string value_error(F f) {
  try {
    f();
  } catch (const c10::ValueError& e) {
    return e.what_without_backtrace();
  }
  return "no error";
}

TEST(ImageSize, MatchesTransformers) {
  struct Case {
    int64_t height, width, budget, want_height, want_width;
  };
  for (const Case& c :
       {Case{768, 1024, 280, 672, 912}, Case{90, 300, 70, 192, 720}, Case{15, 20, 1120, 1344, 1824},
        Case{384, 384, 70, 384, 384}, Case{1000, 49, 140, 2544, 96}, Case{10, 4000, 280, 48, 13440},
        Case{4000, 10, 70, 3360, 48}}) {
    const auto [h, w] = aspect_ratio_preserving_size(c.height, c.width, 16, c.budget * 9, 3);
    EXPECT_EQ(h, c.want_height) << c.height << "x" << c.width << " @" << c.budget;
    EXPECT_EQ(w, c.want_width) << c.height << "x" << c.width << " @" << c.budget;
  }
}

TEST(ImagePatches, RowByRowWithXYPositions) {
  // 96 x 144 at 70 soft tokens is resized to 288 x 480 (transformers' size; 18 x 30 patches);
  // the pixel values of a constant image survive the resize, and positions run along x first.
  const auto rgb = at::full({3, 96, 144}, 51, at::kByte);
  const ImagePatches p = preprocess_image(rgb, {16, 3, 70});
  ASSERT_EQ(p.pixels.sizes(), (std::vector<int64_t>{18 * 30, 768}));
  EXPECT_EQ(p.soft_tokens, 18 * 30 / 9);
  EXPECT_TRUE(at::allclose(p.pixels, at::full_like(p.pixels, 51.0 / 255)));
  EXPECT_EQ(p.positions[0][0].item<int64_t>(), 0);
  EXPECT_EQ(p.positions[1][0].item<int64_t>(), 1);
  EXPECT_EQ(p.positions[30][0].item<int64_t>(), 0);
  EXPECT_EQ(p.positions[30][1].item<int64_t>(), 1);
  EXPECT_EQ(p.positions[18 * 30 - 1][0].item<int64_t>(), 29);
  EXPECT_EQ(p.positions[18 * 30 - 1][1].item<int64_t>(), 17);
}

TEST(ImagePatches, RefusesBadBudgetsAndImages) {
  const auto rgb = at::zeros({3, 10, 10}, at::kByte);
  EXPECT_EQ(value_error([&] {
              preprocess_image(rgb, {16, 3, 100});
            }),
            "max_soft_tokens must be one of 70, 140, 280, 560, 1120, got 100");
  EXPECT_THAT(value_error([&] {
                preprocess_image(at::zeros({10, 10, 3}, at::kByte));
              }),
              HasSubstr("image must be RGB uint8 [3, height, width], got Byte [10, 10, 3]"));
}

TEST(DecodeImage, RefusesWhatItCannotRead) {
  EXPECT_EQ(value_error([] { decode_image(""); }), "image data is empty");
  EXPECT_EQ(value_error([] { decode_image("GIF89a....."); }),
            "GIF images are not supported: send JPEG, PNG or WebP");
  EXPECT_EQ(value_error([] { decode_image("BM......"); }),
            "BMP images are not supported: send JPEG, PNG or WebP");
  EXPECT_EQ(value_error([] { decode_image("<svg></svg>"); }),
            "unrecognized image format (first bytes 3c 73 76 67 3e 3c 2f 73): send JPEG, PNG or "
            "WebP");
  EXPECT_EQ(value_error([] {
              decode_image(std::string(11, 'x'), {10, 100});
            }),
            "image of 11 bytes is over the limit of 10 bytes");
  EXPECT_EQ(value_error([] { decode_image("\x89PNG\r\n\x1a\n\0\0"sv); }),
            "corrupt PNG image: the data ends early (truncated file)");
  EXPECT_EQ(value_error([] { decode_image("\xff\xd8\xff\xe0\0\x10JFIF"sv); }),
            "corrupt JPEG image: JPEG datastream contains no image");
  EXPECT_EQ(value_error([] { decode_image("RIFF\0\0\0\0WEBPVP8 "sv); }),
            "corrupt WebP image: its header does not parse");
}

// Headers alone, written from each format's specification: the size a decode will allocate is
// known before any pixel is decoded.
TEST(ImageSize, ReadsTheSizeFromTheHeaderAlone) {
  // PNG: signature, then IHDR with width 8192 and height 4096 (and no pixel data).
  EXPECT_EQ(image_size("\x89PNG\r\n\x1a\n\0\0\0\x0dIHDR\0\0\x20\0\0\0\x10\0\x08\x02\0\0\0"sv),
            std::make_pair(int64_t{8192}, int64_t{4096}));
  // JPEG: SOI, a baseline SOF0 of 3000 x 4000 with three components, then SOS.
  EXPECT_EQ(
      image_size("\xff\xd8\xff\xc0\0\x11\x08\x0f\xa0\x0b\xb8\x03\x01\x22\0\x02\x11\x01\x03\x11\x01"
                 "\xff\xda\0\x0c\x03\x01\0\x02\x11\x03\x11\0\x3f\0"sv),
      std::make_pair(int64_t{3000}, int64_t{4000}));
  // WebP: a lossless (VP8L) stream of 8192 x 8192: 14 bits each of width - 1 and height - 1.
  EXPECT_EQ(image_size("RIFF\x1a\0\0\0WEBPVP8L\x0d\0\0\0\x2f\xff\xdf\xff\x07\0\0\0\0\0\0\0\0\0"sv),
            std::make_pair(int64_t{8192}, int64_t{8192}));
  EXPECT_EQ(image_size("\x89PNG\r\n\x1a\n\0\0"sv), std::make_pair(int64_t{0}, int64_t{0}));
  EXPECT_EQ(image_size("\xff\xd8\xff\xe0\0\x10JFIF"sv), std::make_pair(int64_t{0}, int64_t{0}));
  EXPECT_EQ(image_size("GIF89a....."), std::make_pair(int64_t{0}, int64_t{0}));
}

}  // namespace
}  // namespace torchtpu
