#include "media/image.h"

#include <c10/util/Exception.h>
#include <jerror.h>
#include <jpeglib.h>
#include <png.h>
#include <webp/decode.h>

#include <algorithm>
#include <cmath>
#include <csetjmp>
#include <cstdint>
#include <cstdio>  // before jpeglib.h, which uses FILE
#include <cstring>
#include <string>
#include <vector>

namespace torchtpu {
namespace {

// Where libpng and libjpeg report a fatal error: they cannot unwind C++ frames, so the decoders
// below longjmp back to a frame that holds no C++ objects and throw from its caller.
struct Failure {
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX + 200] = {};
};

void check_size(const char* format, int64_t width, int64_t height, const ImageLimits& limits) {
  TORCH_CHECK_VALUE(width > 0 && height > 0, format, " image has an empty size ", width, " x ",
                    height);
  TORCH_CHECK_VALUE(width * height <= limits.max_pixels, format, " image of ", width, " x ", height,
                    " = ", width * height, " pixels is over the limit of ", limits.max_pixels,
                    " pixels");
}

// PNG ------------------------------------------------------------------------------------------

struct PngInput {
  const uint8_t* data;
  size_t size;
  size_t offset;
};

void png_read_memory(png_structp png, png_bytep out, png_size_t n) {
  auto* in = static_cast<PngInput*>(png_get_io_ptr(png));
  if (in->size - in->offset < n) png_error(png, "the data ends early (truncated file)");
  std::memcpy(out, in->data + in->offset, n);
  in->offset += n;
}

void png_fail(png_structp png, png_const_charp message) {
  auto* failure = static_cast<Failure*>(png_get_error_ptr(png));
  std::snprintf(failure->message, sizeof failure->message, "%s", message);
  std::longjmp(failure->jump, 1);
}

void png_ignore_warning(png_structp, png_const_charp) {}

// Pixel memory for a decoder: `height` rows of `row_bytes`, or nullptr (with `error` set) when the
// size is over the limits.
struct RowBuffer {
  at::Tensor rows;  // uint8 [height, row_bytes]
  const ImageLimits* limits;
  const char* format;
  std::string error;
};

uint8_t* allocate_rows(void* context, uint32_t width, uint32_t height, size_t row_bytes) {
  auto* buffer = static_cast<RowBuffer*>(context);
  const int64_t w = width, h = height;
  if (w <= 0 || h <= 0 || w * h > buffer->limits->max_pixels) {
    buffer->error = std::string(buffer->format) + " image of " + std::to_string(w) + " x " +
                    std::to_string(h) + " = " + std::to_string(w * h) +
                    " pixels is over the limit of " + std::to_string(buffer->limits->max_pixels) +
                    " pixels";
    return nullptr;
  }
  buffer->rows = at::empty({h, static_cast<int64_t>(row_bytes)}, at::kByte);
  return buffer->rows.data_ptr<uint8_t>();
}

// transformers' convert_to_rgb: an image with transparency is composited onto opaque white by
// Pillow's alpha_composite, whose integer rounding this reproduces (exhaustively checked against
// Pillow over every value and alpha): out = ((t >> 8) + t) >> 15 with
// t = (v * a + 255 * (255 - a) + 128) << 7.
at::Tensor composite_on_white(const at::Tensor& rgba) {  // uint8 [H, W, 4] -> [H, W, 3]
  auto rgb = at::empty({rgba.size(0), rgba.size(1), 3}, at::kByte);
  const uint8_t* in = rgba.data_ptr<uint8_t>();
  uint8_t* out = rgb.data_ptr<uint8_t>();
  const int64_t n = rgba.size(0) * rgba.size(1);
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t a = in[4 * i + 3];
    for (int c = 0; c < 3; ++c) {
      const uint32_t t = (in[4 * i + c] * a + 255 * (255 - a) + 128) << 7;
      out[3 * i + c] = static_cast<uint8_t>((((t >> 8) + t) >> 8) >> 7);
    }
  }
  return rgb;
}

// What libpng hands back after the transformations png_decode asks for.
enum class PngLayout { kRgb, kRgba, kGrey16 };

struct PngRead {
  PngInput input;
  Failure failure;
  PngLayout layout = PngLayout::kRgb;
  RowBuffer* buffer = nullptr;
};

// Returns false with failure.message set (or the buffer's error).
bool png_decode(PngRead* r) {
  png_structp png =
      png_create_read_struct(PNG_LIBPNG_VER_STRING, &r->failure, png_fail, png_ignore_warning);
  if (png == nullptr) {
    std::snprintf(r->failure.message, sizeof r->failure.message, "out of memory");
    return false;
  }
  png_infop info = png_create_info_struct(png);
  if (info == nullptr || setjmp(r->failure.jump)) {
    png_destroy_read_struct(&png, &info, nullptr);
    return false;
  }
  png_set_read_fn(png, &r->input, png_read_memory);
  png_read_info(png, info);
  const png_uint_32 width = png_get_image_width(png, info);
  const png_uint_32 height = png_get_image_height(png, info);
  const int color = png_get_color_type(png, info);
  const bool transparency =
      (color & PNG_COLOR_MASK_ALPHA) != 0 || png_get_valid(png, info, PNG_INFO_tRNS) != 0;
  // As Pillow reads PNGs: palette entries and low-bit grey expanded to 8 bits, tRNS made an
  // alpha channel, 16-bit samples cut to their high byte -- except 16-bit grey, which Pillow
  // keeps whole (mode I;16) and convert("RGB") clamps to 255.
  png_set_expand(png);
  if (png_get_bit_depth(png, info) == 16 && color == PNG_COLOR_TYPE_GRAY && !transparency) {
    r->layout = PngLayout::kGrey16;
  } else {
    png_set_strip_16(png);
    if ((color & PNG_COLOR_MASK_COLOR) == 0) png_set_gray_to_rgb(png);
    r->layout = transparency ? PngLayout::kRgba : PngLayout::kRgb;
  }
  const int passes = png_set_interlace_handling(png);
  png_read_update_info(png, info);
  const size_t row_bytes = png_get_rowbytes(png, info);
  const size_t expected = (r->layout == PngLayout::kRgba  ? 4
                           : r->layout == PngLayout::kRgb ? 3
                                                          : 2);
  if (row_bytes != expected * width) png_error(png, "unexpected row layout after conversion");
  uint8_t* rows = allocate_rows(r->buffer, width, height, row_bytes);
  if (rows == nullptr) png_error(png, "the image is over the limits");
  for (int pass = passes; pass > 0; --pass) {
    for (png_uint_32 y = 0; y < height; ++y) png_read_row(png, rows + y * row_bytes, nullptr);
  }
  png_read_end(png, nullptr);
  png_destroy_read_struct(&png, &info, nullptr);
  return true;
}

at::Tensor decode_png(std::string_view bytes, const ImageLimits& limits) {
  RowBuffer buffer{at::Tensor(), &limits, "PNG", ""};
  PngRead r;
  r.input = {reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), 0};
  r.buffer = &buffer;
  const bool ok = png_decode(&r);
  TORCH_CHECK_VALUE(buffer.error.empty(), buffer.error);
  TORCH_CHECK_VALUE(ok, "corrupt PNG image: ", r.failure.message);
  const int64_t height = buffer.rows.size(0);
  switch (r.layout) {
    case PngLayout::kRgb: return buffer.rows.view({height, -1, 3}).permute({2, 0, 1}).contiguous();
    case PngLayout::kRgba:
      return composite_on_white(buffer.rows.view({height, -1, 4})).permute({2, 0, 1}).contiguous();
    case PngLayout::kGrey16: {
      auto big_endian = buffer.rows.view({height, -1, 2}).to(at::kInt);
      auto grey = (big_endian.select(2, 0) * 256 + big_endian.select(2, 1)).clamp_max(255);
      return grey.to(at::kByte).unsqueeze(0).expand({3, height, -1}).contiguous();
    }
  }
  TORCH_INTERNAL_ASSERT(false, "unknown PNG layout");
}

// JPEG -----------------------------------------------------------------------------------------

struct JpegError {
  jpeg_error_mgr base;
  Failure* failure;
  bool truncated = false;
};

void jpeg_fail(j_common_ptr cinfo) {
  auto* err = reinterpret_cast<JpegError*>(cinfo->err);
  (*cinfo->err->format_message)(cinfo, err->failure->message);
  std::longjmp(err->failure->jump, 1);
}

// libjpeg decodes a truncated file to the end with grey filler and only warns; Pillow refuses it
// ("image file is truncated"), and so do we. Other warnings (extraneous bytes) are harmless.
void jpeg_message(j_common_ptr cinfo, int level) {
  auto* err = reinterpret_cast<JpegError*>(cinfo->err);
  if (level < 0 && cinfo->err->msg_code == JWRN_JPEG_EOF) err->truncated = true;
}

struct JpegRead {
  std::string_view bytes;
  Failure failure;
  bool truncated = false;
  RowBuffer* buffer = nullptr;  // none: the header alone is read, for its size
  JDIMENSION width = 0, height = 0;
  std::vector<uint8_t> inks;  // a CMYK scan line (here, not in jpeg_decode, which longjmps)
};

// A CMYK scan line as Pillow opens it and its convert("RGB") makes it RGB, to the bit: each
// channel (255 - K) - X * (255 - K) / 255, rounded as its MULDIV255, of inks stored inverted.
// That is Adobe's convention (Photoshop writes CMYK so, and Pillow too), which Pillow assumes of
// every CMYK JPEG ("CMYK;I"), with Adobe's APP14 marker or without.
void cmyk_to_rgb(const uint8_t* cmyk, uint8_t* rgb, JDIMENSION width) {
  for (JDIMENSION x = 0; x < width; ++x, cmyk += 4, rgb += 3) {
    const auto ink = [&](int i) { return 255 - cmyk[i]; };
    const int nk = 255 - ink(3);
    for (int i = 0; i < 3; ++i) {
      const int t = ink(i) * nk + 128;
      rgb[i] = static_cast<uint8_t>(std::clamp(nk - (((t >> 8) + t) >> 8), 0, 255));
    }
  }
}

// r->bytes' frame size and, with a buffer, its pixels as RGB rows. False when libjpeg fails
// (r->failure says why) or the buffer refuses the size.
bool jpeg_decode(JpegRead* r) {
  jpeg_decompress_struct cinfo;
  JpegError err;
  cinfo.err = jpeg_std_error(&err.base);
  err.base.error_exit = jpeg_fail;
  err.base.emit_message = jpeg_message;
  err.failure = &r->failure;
  jpeg_create_decompress(&cinfo);
  if (setjmp(r->failure.jump)) {
    jpeg_destroy_decompress(&cinfo);
    return false;
  }
  jpeg_mem_src(&cinfo, reinterpret_cast<const unsigned char*>(r->bytes.data()),
               static_cast<unsigned long>(r->bytes.size()));
  jpeg_read_header(&cinfo, TRUE);
  r->width = cinfo.image_width;
  r->height = cinfo.image_height;
  if (r->buffer == nullptr) {
    jpeg_destroy_decompress(&cinfo);
    return true;
  }
  // libjpeg reads YCCK to CMYK, not to RGB: those come a line at a time through cmyk_to_rgb.
  const bool cmyk = cinfo.jpeg_color_space == JCS_CMYK || cinfo.jpeg_color_space == JCS_YCCK;
  cinfo.out_color_space = cmyk ? JCS_CMYK : JCS_RGB;
  jpeg_start_decompress(&cinfo);
  const size_t row_bytes = 3 * static_cast<size_t>(cinfo.output_width);
  uint8_t* rows = allocate_rows(r->buffer, cinfo.output_width, cinfo.output_height, row_bytes);
  if (rows == nullptr) {
    jpeg_destroy_decompress(&cinfo);
    return false;
  }
  r->inks.resize(cmyk ? 4 * static_cast<size_t>(cinfo.output_width) : 0);
  while (cinfo.output_scanline < cinfo.output_height) {
    uint8_t* rgb = rows + cinfo.output_scanline * row_bytes;
    JSAMPROW row = cmyk ? r->inks.data() : rgb;
    jpeg_read_scanlines(&cinfo, &row, 1);
    if (cmyk) cmyk_to_rgb(r->inks.data(), rgb, cinfo.output_width);
  }
  jpeg_finish_decompress(&cinfo);
  r->truncated = err.truncated;
  jpeg_destroy_decompress(&cinfo);
  return true;
}

at::Tensor decode_jpeg(std::string_view bytes, const ImageLimits& limits) {
  RowBuffer buffer{at::Tensor(), &limits, "JPEG", ""};
  JpegRead r;
  r.bytes = bytes;
  r.buffer = &buffer;
  const bool ok = jpeg_decode(&r);
  TORCH_CHECK_VALUE(buffer.error.empty(), buffer.error);
  TORCH_CHECK_VALUE(ok, "corrupt JPEG image: ", r.failure.message);
  TORCH_CHECK_VALUE(!r.truncated, "truncated JPEG image: the data ends before the last scan line");
  return buffer.rows.view({buffer.rows.size(0), -1, 3}).permute({2, 0, 1}).contiguous();
}

// WebP -----------------------------------------------------------------------------------------

at::Tensor decode_webp(std::string_view bytes, const ImageLimits& limits) {
  const auto* data = reinterpret_cast<const uint8_t*>(bytes.data());
  WebPBitstreamFeatures features;
  const VP8StatusCode status = WebPGetFeatures(data, bytes.size(), &features);
  TORCH_CHECK_VALUE(status != VP8_STATUS_NOT_ENOUGH_DATA,
                    "truncated WebP image: the data ends inside its header");
  TORCH_CHECK_VALUE(status != VP8_STATUS_UNSUPPORTED_FEATURE,
                    "WebP image uses a feature libwebp cannot decode");
  TORCH_CHECK_VALUE(status == VP8_STATUS_OK, "corrupt WebP image: its header does not parse");
  TORCH_CHECK_VALUE(!features.has_animation, "animated WebP images are not supported");
  check_size("WebP", features.width, features.height, limits);
  // Pillow opens a WebP with alpha as RGBA (not premultiplied), which convert_to_rgb composites.
  const int channels = features.has_alpha ? 4 : 3;
  auto hwc = at::empty({features.height, features.width, channels}, at::kByte);
  const size_t stride = static_cast<size_t>(channels) * features.width;
  const size_t size = stride * features.height;
  uint8_t* pixels = hwc.data_ptr<uint8_t>();
  const uint8_t* out =
      features.has_alpha
          ? WebPDecodeRGBAInto(data, bytes.size(), pixels, size, static_cast<int>(stride))
          : WebPDecodeRGBInto(data, bytes.size(), pixels, size, static_cast<int>(stride));
  TORCH_CHECK_VALUE(out != nullptr,
                    "corrupt or truncated WebP image: its pixel data do not decode");
  if (features.has_alpha) hwc = composite_on_white(hwc);
  return hwc.permute({2, 0, 1}).contiguous();
}

uint32_t big_endian_u32(std::string_view bytes, size_t at) {
  uint32_t v = 0;
  for (size_t i = 0; i < 4; ++i) v = (v << 8) | static_cast<unsigned char>(bytes[at + i]);
  return v;
}

bool starts_with(std::string_view bytes, std::string_view prefix) {
  return bytes.size() >= prefix.size() && bytes.substr(0, prefix.size()) == prefix;
}

}  // namespace

at::Tensor decode_image(std::string_view bytes, const ImageLimits& limits) {
  TORCH_CHECK_VALUE(static_cast<int64_t>(bytes.size()) <= limits.max_bytes, "image of ",
                    bytes.size(), " bytes is over the limit of ", limits.max_bytes, " bytes");
  TORCH_CHECK_VALUE(!bytes.empty(), "image data is empty");
  const std::string_view type = sniff_media_type(MediaKind::kImage, bytes);
  if (type == "image/png") return decode_png(bytes, limits);
  if (type == "image/jpeg") return decode_jpeg(bytes, limits);
  if (type == "image/webp") return decode_webp(bytes, limits);
  const char* what = starts_with(bytes, "GIF8")                                 ? "GIF"
                     : starts_with(bytes, "BM")                                 ? "BMP"
                     : starts_with(bytes, "II*") || starts_with(bytes, "MM\0*") ? "TIFF"
                                                                                : nullptr;
  TORCH_CHECK_VALUE(what == nullptr, what, " images are not supported: send JPEG, PNG or WebP");
  std::string head;
  for (size_t i = 0; i < std::min<size_t>(bytes.size(), 8); ++i) {
    char hex[4];
    std::snprintf(hex, sizeof hex, "%02x", static_cast<unsigned char>(bytes[i]));
    head += (i ? " " : "") + std::string(hex);
  }
  C10_THROW_ERROR(ValueError,
                  "unrecognized image format (first bytes " + head + "): send JPEG, PNG or WebP");
}

std::pair<int64_t, int64_t> image_size(std::string_view bytes) {
  const std::string_view type = sniff_media_type(MediaKind::kImage, bytes);
  if (type == "image/png") {
    // The signature, then IHDR's length and name, then its width and height (PNG spec 11.2.2),
    // each at most 2^31 - 1.
    if (bytes.size() < 24 || bytes.substr(12, 4) != "IHDR") return {0, 0};
    const uint32_t width = big_endian_u32(bytes, 16), height = big_endian_u32(bytes, 20);
    if (width > INT32_MAX || height > INT32_MAX) return {0, 0};
    return {width, height};
  }
  if (type == "image/jpeg") {
    JpegRead r;
    r.bytes = bytes;
    if (!jpeg_decode(&r)) return {0, 0};
    return {r.width, r.height};
  }
  if (type == "image/webp") {
    WebPBitstreamFeatures features;
    if (WebPGetFeatures(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), &features) !=
        VP8_STATUS_OK) {
      return {0, 0};
    }
    return {features.width, features.height};
  }
  return {0, 0};
}

std::pair<int64_t, int64_t> aspect_ratio_preserving_size(int64_t height, int64_t width,
                                                         int64_t patch_size, int64_t max_patches,
                                                         int64_t pooling_kernel_size) {
  const double total_px = static_cast<double>(height) * static_cast<double>(width);
  const double target_px = static_cast<double>(max_patches * patch_size * patch_size);
  const double factor = std::sqrt(target_px / total_px);
  const double ideal_height = factor * height;
  const double ideal_width = factor * width;
  const int64_t side = pooling_kernel_size * patch_size;
  int64_t target_height = static_cast<int64_t>(std::floor(ideal_height / side)) * side;
  int64_t target_width = static_cast<int64_t>(std::floor(ideal_width / side)) * side;
  TORCH_CHECK_VALUE(target_height != 0 || target_width != 0, "image of ", width, " x ", height,
                    " cannot be resized: both sides would round to 0 (multiples of ", side, ")");
  const int64_t max_side = (max_patches / (pooling_kernel_size * pooling_kernel_size)) * side;
  if (target_height == 0) {
    target_height = side;
    target_width = std::min(
        static_cast<int64_t>(std::floor(static_cast<double>(width) / height)) * side, max_side);
  } else if (target_width == 0) {
    target_width = side;
    target_height = std::min(
        static_cast<int64_t>(std::floor(static_cast<double>(height) / width)) * side, max_side);
  }
  TORCH_CHECK_VALUE(static_cast<double>(target_height * target_width) <= target_px, "image of ",
                    width, " x ", height, " resized to ", target_width, " x ", target_height,
                    " would exceed ", max_patches, " patches of ", patch_size, " x ", patch_size,
                    " pixels");
  return {target_height, target_width};
}

ImagePatches preprocess_image(const at::Tensor& rgb, const ImageProcessorOptions& options) {
  TORCH_CHECK_VALUE(std::find(std::begin(kImageSoftTokenBudgets), std::end(kImageSoftTokenBudgets),
                              options.max_soft_tokens) != std::end(kImageSoftTokenBudgets),
                    "max_soft_tokens must be one of 70, 140, 280, 560, 1120, got ",
                    options.max_soft_tokens);
  TORCH_CHECK_VALUE(options.patch_size > 0 && options.pooling_kernel_size > 0,
                    "patch_size and pooling_kernel_size must be positive, got ", options.patch_size,
                    " and ", options.pooling_kernel_size);
  TORCH_CHECK_VALUE(rgb.dim() == 3 && rgb.size(0) == 3 && rgb.scalar_type() == at::kByte,
                    "image must be RGB uint8 [3, height, width], got ", rgb.scalar_type(), " ",
                    rgb.sizes());
  TORCH_CHECK_VALUE(rgb.size(1) > 0 && rgb.size(2) > 0, "image has an empty size ", rgb.sizes());
  const int64_t p = options.patch_size;
  const int64_t k = options.pooling_kernel_size;
  const int64_t max_patches = options.max_soft_tokens * k * k;
  const auto [height, width] =
      aspect_ratio_preserving_size(rgb.size(1), rgb.size(2), p, max_patches, k);
  auto image = rgb.to(at::kCPU).contiguous();
  if (height != image.size(1) || width != image.size(2)) {
    // torchvision's resize on a CPU uint8 image: ATen's antialiased bicubic kernel on the uint8
    // values themselves (rounding and clamping inside the kernel).
    image = at::_upsample_bicubic2d_aa(image.unsqueeze(0), {height, width},
                                       /*align_corners=*/false)
                .squeeze(0);
  }
  auto scaled = image * (1.0 / 255.0);
  const int64_t ph = height / p, pw = width / p;
  ImagePatches out;
  out.pixels = scaled.reshape({3, ph, p, pw, p}).permute({1, 3, 2, 4, 0}).reshape({ph * pw, -1});
  auto ys = at::arange(ph, at::kLong).view({ph, 1}).expand({ph, pw});
  auto xs = at::arange(pw, at::kLong).view({1, pw}).expand({ph, pw});
  out.positions = at::stack({xs, ys}, -1).reshape({ph * pw, 2});
  out.soft_tokens = ph * pw / (k * k);
  return out;
}

}  // namespace torchtpu
