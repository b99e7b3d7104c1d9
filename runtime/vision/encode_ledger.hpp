#pragma once
// The vision encoder's books (EPD's E stage), shared by the request
// actors, which admit and withdraw images, and the encoder actor, which
// takes them and keeps recent results.  Thread-safe: the encoder is a
// detached actor on its own thread.
//
// - A bound on distinct images waiting: a request whose images would pass
//   it is refused at once ("overloaded", try later) instead of queueing
//   without end behind a flood.
// - Withdrawals: a request that ends (cancelled, timed out, refused)
//   while its images wait has them skipped, not encoded for nobody.
// - A cache of recent encodes by image bytes (least recently used out,
//   within a byte budget): the `n` choices of one OpenAI request arrive
//   as n requests with the same images, and clients resend an image with
//   each turn of a chat; each is encoded once.  A hit compares the whole
//   bytes, not only a hash.
#include <cstdint>
#include <deque>
#include <list>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace troupe {

class encode_ledger {
 public:
  encode_ledger(int32_t max_waiting, uint64_t cache_bytes);

  // An image's key: a hash of its bytes.
  static size_t key(std::string_view bytes);
  // Admits the images (their keys) of request `owner`, in the order it
  // sends them; false (and counted as refused) when the distinct images
  // waiting would pass the bound.  An image waiting already, or in the
  // cache, costs the encoder next to nothing and does not count: the n
  // choices of one request send the same images n times at once.
  bool admit(uint64_t owner, const std::vector<size_t>& images);
  // Request `owner` ended: its images not yet taken are skipped.
  void withdraw(uint64_t owner);
  // The encoder takes one image of `owner`: false when it was withdrawn
  // (skip it).
  bool take(uint64_t owner);

  // The rows of an image encoded before, or nothing.
  std::optional<std::vector<float>> cached(const std::string& bytes);
  void remember(const std::string& bytes, const std::vector<float>& rows);

  struct stats {
    int32_t waiting = 0;   // images admitted and not yet taken
    int32_t distinct = 0;  // of those, different images (what the bound counts)
    uint64_t encoded = 0;  // remembered (encoded) images
    uint64_t cache_hits = 0, skipped = 0, refused = 0;
    uint64_t cache_bytes = 0;
  };
  stats snapshot() const;
  int32_t max_waiting() const { return max_waiting_; }

 private:
  struct owner_books {
    std::deque<size_t> waiting;  // keys of its images not yet taken, in order
    bool withdrawn = false;
  };
  struct entry {
    std::string bytes;
    std::vector<float> rows;
    uint64_t size() const { return bytes.size() + rows.size() * sizeof(float); }
  };

  const int32_t max_waiting_;
  const uint64_t cache_budget_;
  mutable std::mutex m_;
  std::unordered_map<uint64_t, owner_books> owners_;
  std::unordered_map<size_t, int32_t> waiting_keys_;  // distinct images waiting, and how often
  stats stats_;
  std::list<entry> lru_;  // most recent first
  std::unordered_multimap<size_t, std::list<entry>::iterator> by_hash_;
};

}  // namespace troupe
