// src/engine/media (issue #19): placeholder expansion as Gemma4Processor does it, and the prefix
// cache key that tells two items at the same positions apart.
#include <gtest/gtest.h>

#include "common/errors.h"
#include "engine/media.h"

namespace torchtpu {
namespace {

ModelConfig ids_config() {
  ModelConfig c;
  c.image_token_id = 500;
  c.boi_token_id = 501;
  c.eoi_token_id = 502;
  c.audio_token_id = 503;
  c.boa_token_id = 504;
  c.eoa_token_index = 505;
  return c;
}

Media item(MediaKind kind, int64_t soft_tokens, uint64_t digest) {
  Media m;
  m.kind = kind;
  m.soft_tokens = soft_tokens;
  m.digest = digest;
  return m;
}

TEST(MediaExpansion, EachPlaceholderTakesItsItemInOrderPerKind) {
  const auto c = ids_config();
  const std::vector<Media> media = {item(MediaKind::kAudio, 1, 1), item(MediaKind::kImage, 2, 2),
                                    item(MediaKind::kImage, 3, 3)};
  EXPECT_EQ(
      expand_media_placeholders({2, 500, 7, 503, 500}, media, c),
      (std::vector<int64_t>{2, 501, 500, 500, 502, 7, 504, 503, 505, 501, 500, 500, 500, 502}));
}

TEST(MediaExpansion, CountsMustAgree) {
  const auto c = ids_config();
  EXPECT_THROW(expand_media_placeholders({2, 500}, {}, c), ValueError);
  EXPECT_THROW(expand_media_placeholders({2}, {item(MediaKind::kAudio, 1, 1)}, c), ValueError);
  EXPECT_THROW(expand_media_placeholders(
                   std::vector<int64_t>(kMaxMediaItems + 1, 500),
                   std::vector<Media>(kMaxMediaItems + 1, item(MediaKind::kImage, 1, 1)), c),
               ValueError);
}

TEST(PrefixCacheKey, SameItemSameKeyOtherItemOtherKey) {
  const auto c = ids_config();
  const std::vector<int64_t> ids = {2, 501, 500, 500, 502, 7};
  const auto a = prefix_cache_key(ids, {item(MediaKind::kImage, 2, 11)}, c);
  const auto again = prefix_cache_key(ids, {item(MediaKind::kImage, 2, 11)}, c);
  const auto b = prefix_cache_key(ids, {item(MediaKind::kImage, 2, 12)}, c);
  EXPECT_EQ(a, again);
  EXPECT_NE(a, b);
  EXPECT_LT(a[2], 0);
  EXPECT_LT(a[3], 0);
  EXPECT_NE(a[2], a[3]);
  for (size_t i : {0, 1, 4, 5}) EXPECT_EQ(a[i], ids[i]);
  EXPECT_EQ(prefix_cache_key(ids, {}, c), ids);
}

// A salt changes the first id only, to a negative one of its own: one salt, one key; another salt
// or none, another first id.
TEST(PrefixCacheKey, ASaltMarksTheFirstId) {
  const auto c = ids_config();
  const std::vector<int64_t> ids = {2, 501, 7};
  const auto a = prefix_cache_key(ids, {}, c, "tenant-a");
  EXPECT_EQ(a, prefix_cache_key(ids, {}, c, "tenant-a"));
  const auto b = prefix_cache_key(ids, {}, c, "tenant-b");
  EXPECT_LT(a[0], 0);
  EXPECT_LT(b[0], 0);
  EXPECT_NE(a[0], b[0]);
  EXPECT_NE(a[0], prefix_cache_key({3, 501, 7}, {}, c, "tenant-a")[0]);
  for (size_t i : {1, 2}) EXPECT_EQ(a[i], ids[i]);
  EXPECT_EQ(prefix_cache_key(ids, {}, c, ""), ids);
}

TEST(MediaDigest, FollowsTheTensors) {
  ImagePatches p{at::rand({9, 768}), at::zeros({9, 2}, at::kLong), 1};
  ImagePatches q{p.pixels.clone(), p.positions.clone(), 1};
  ImagePatches r{p.pixels + 1e-3, p.positions, 1};
  EXPECT_EQ(image_media(p).digest, image_media(q).digest);
  EXPECT_NE(image_media(p).digest, image_media(r).digest);
}

}  // namespace
}  // namespace torchtpu
