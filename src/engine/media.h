// Images and audio clips in a prompt (issue #19): what the engine needs of each item (the
// preprocessed tower input, its soft-token count, a digest naming it for the prefix cache) and the
// one rule that expands a prompt's placeholder ids, as Gemma4Processor does for its text.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <string>
#include <vector>

#include "io/config.h"
#include "media/audio.h"
#include "media/image.h"
#include "media/kinds.h"

namespace torchtpu {

// One image or audio clip, preprocessed on the host (CPU tensors).
struct Media {
  MediaKind kind = MediaKind::kImage;
  at::Tensor pixels,
      positions;              // an image: ImagePatches' pixels [P, 3 * patch^2], positions [P, 2]
  at::Tensor features, mask;  // a clip: AudioFeatures' log-mel [T, mels] and valid frames [T]
  int64_t soft_tokens = 0;    // image_token_id / audio_token_id positions it fills
  uint64_t digest = 0;        // FNV-1a of the tensors above: equal inputs, equal digests
};

Media image_media(const ImagePatches& patches);
Media audio_media(const AudioFeatures& features);

// Gemma4Processor's expansion: the n-th image_token_id of `ids` (one placeholder, the token the
// chat template's <|image|> becomes) turns into boi_token_id, image_token_id x soft_tokens,
// eoi_token_id for the n-th image of `media`; audio_token_id likewise into boa_token_id,
// audio_token_id x soft_tokens, eoa_token_index for the n-th clip. ValueError when the
// placeholders of a kind and the media of that kind differ in number, or there are more than
// kMaxMediaItems items.
std::vector<int64_t> expand_media_placeholders(const std::vector<int64_t>& ids,
                                               const std::vector<Media>& media,
                                               const ModelConfig& config);

// The prompt ids a prefix cache keys on: soft-token positions of item i become a negative
// pseudo-id derived from its digest, so the same item at the same place matches and another does
// not. `ids` is an expanded prompt (every soft token of every item present, in order). A `salt`
// (vLLM's cache_salt) makes the first id a negative pseudo-id of it and of that id, so prompts
// match only under the same salt (a tenant's cached prompts cannot be timed by another); "": none.
std::vector<int64_t> prefix_cache_key(const std::vector<int64_t>& ids,
                                      const std::vector<Media>& media, const ModelConfig& config,
                                      const std::string& salt = "");

}  // namespace torchtpu
