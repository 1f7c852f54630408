#include "engine/media.h"

#include <string>

#include "common/errors.h"
#include "common/fnv1a.h"

namespace torchtpu {
namespace {

uint64_t fnv1a(uint64_t hash, const at::Tensor& t) {
  const auto c = t.contiguous();
  hash = torchtpu::fnv1a(hash, static_cast<const uint8_t*>(c.data_ptr()), c.nbytes());
  for (auto size : c.sizes()) hash = (hash ^ static_cast<uint64_t>(size)) * kFnvPrime;
  return hash;
}

// A key's pseudo-id for `value` mixed into `hash`: negative (the top bit cleared, then negated),
// so it never equals a token id.
int64_t pseudo_id(uint64_t hash, uint64_t value) {
  return -1 - static_cast<int64_t>(((hash ^ value) * kFnvPrime) >> 1);
}

int64_t token_of(MediaKind kind, const ModelConfig& config) {
  return kind == MediaKind::kImage ? config.image_token_id : config.audio_token_id;
}

void check_counts(const std::vector<int64_t>& ids, const std::vector<Media>& media,
                  const ModelConfig& config) {
  if (static_cast<int64_t>(media.size()) > kMaxMediaItems) {
    throw ValueError("the prompt carries " + std::to_string(media.size()) +
                     " images and audio clips; at most " + std::to_string(kMaxMediaItems) +
                     " are allowed");
  }
  for (auto kind : {MediaKind::kImage, MediaKind::kAudio}) {
    int64_t items = 0, placeholders = 0;
    for (const auto& m : media) items += m.kind == kind;
    for (auto id : ids) placeholders += id == token_of(kind, config);
    if (items != placeholders) {
      throw ValueError("the prompt has " + std::to_string(placeholders) + " " +
                       media_kind_name(kind) + " placeholders (token id " +
                       std::to_string(token_of(kind, config)) + ") but " + std::to_string(items) +
                       " " + media_kind_name(kind) + " items were given");
    }
  }
}

}  // namespace

Media image_media(const ImagePatches& patches) {
  Media m;
  m.kind = MediaKind::kImage;
  m.pixels = patches.pixels;
  m.positions = patches.positions;
  m.soft_tokens = patches.soft_tokens;
  m.digest = fnv1a(fnv1a(kFnvOffset, patches.pixels), patches.positions);
  return m;
}

Media audio_media(const AudioFeatures& features) {
  Media m;
  m.kind = MediaKind::kAudio;
  m.features = features.features;
  m.mask = features.mask;
  m.soft_tokens = features.soft_tokens;
  m.digest = fnv1a(fnv1a(kFnvOffset ^ 1, features.features), features.mask.to(at::kByte));
  return m;
}

std::vector<int64_t> expand_media_placeholders(const std::vector<int64_t>& ids,
                                               const std::vector<Media>& media,
                                               const ModelConfig& config) {
  check_counts(ids, media, config);
  std::vector<const Media*> images, clips;
  for (const auto& m : media) (m.kind == MediaKind::kImage ? images : clips).push_back(&m);
  std::vector<int64_t> out;
  size_t image = 0, clip = 0;
  for (auto id : ids) {
    if (id == config.image_token_id) {
      out.push_back(config.boi_token_id);
      out.insert(out.end(), images[image++]->soft_tokens, config.image_token_id);
      out.push_back(config.eoi_token_id);
    } else if (id == config.audio_token_id) {
      out.push_back(config.boa_token_id);
      out.insert(out.end(), clips[clip++]->soft_tokens, config.audio_token_id);
      out.push_back(config.eoa_token_index);
    } else {
      out.push_back(id);
    }
  }
  return out;
}

std::vector<int64_t> prefix_cache_key(const std::vector<int64_t>& ids,
                                      const std::vector<Media>& media, const ModelConfig& config,
                                      const std::string& salt) {
  // Per kind: its items in order, the one being filled and how many of its positions are done.
  struct Run {
    int64_t token;
    std::vector<const Media*> items;
    size_t item = 0;
    int64_t done = 0;
  };
  Run runs[] = {{config.image_token_id, {}}, {config.audio_token_id, {}}};
  for (const auto& m : media) runs[m.kind == MediaKind::kImage ? 0 : 1].items.push_back(&m);
  std::vector<int64_t> key = ids;
  for (auto& id : key) {
    for (auto& run : runs) {
      if (id != run.token || run.item >= run.items.size()) continue;
      const Media& m = *run.items[run.item];
      // One per item and position inside it.
      id = pseudo_id(m.digest, static_cast<uint64_t>(run.done));
      if (++run.done == m.soft_tokens) run.done = 0, ++run.item;
      break;
    }
  }
  if (!salt.empty() && !key.empty()) {
    const auto* bytes = reinterpret_cast<const uint8_t*>(salt.data());
    key[0] = pseudo_id(fnv1a(kFnvOffset, bytes, salt.size()), static_cast<uint64_t>(key[0]));
  }
  return key;
}

}  // namespace torchtpu
