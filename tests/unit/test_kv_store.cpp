// The KV store (runtime/kvstore, actors/kv_pool, actors/kv_disk): the
// eviction policy, the host tier's budget, the page file format, the disk
// tier across a restart and with damaged files, and the kv_pool actor
// moving pages host -> disk -> host.
#include <gtest/gtest.h>
#include <unistd.h>

#include <caf/all.hpp>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "actors/kv_pool.hpp"
#include "messages/actors.hpp"
#include "runtime/kvstore/disk_tier.hpp"
#include "runtime/kvstore/memory_tier.hpp"
#include "runtime/kvstore/page_file.hpp"
#include "runtime/kvstore/tier_index.hpp"
#include "runtime/kvstore/tier_policy.hpp"

namespace troupe {
namespace {

namespace fs = std::filesystem;

// Page i of a made-up prompt: 4 tokens, 100 bytes that say which page it is.
kv_page page(int i, uint64_t space = 7) {
  kv_page p;
  p.space = space;
  p.hash = 1000 + uint64_t(i);
  p.parent = i == 0 ? 0 : 1000 + uint64_t(i - 1);
  p.depth = i;
  p.tokens = {i, i + 1, i + 2, i + 3};
  p.bytes.assign(100, static_cast<uint8_t>(i));
  return p;
}

std::vector<uint64_t> hashes(int from, int to) {
  std::vector<uint64_t> out;
  for (int i = from; i < to; ++i) out.push_back(1000 + uint64_t(i));
  return out;
}

// A fresh folder under the build tree's temp, removed at the end.
struct temp_dir {
  fs::path path;
  temp_dir() {
    path = fs::temp_directory_path() /
           ("troupe-kv-" + std::to_string(::getpid()) + "-" + std::to_string(counter()++));
    fs::remove_all(path);
  }
  ~temp_dir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  static int& counter() {
    static int n = 0;
    return n;
  }
};

TEST(TierPolicy, LruEvictsOldestAndDeepestFirst) {
  std::vector<tier_entry_use> e = {
      {10, 5, 9, 0},  // 0: used at 5
      {10, 1, 0, 0},  // 1: oldest
      {10, 3, 0, 0},  // 2
      {10, 3, 0, 2},  // 3: same age as 2, deeper: goes first
  };
  EXPECT_EQ(pick_victims(e, 15, tier_eviction::lru), (std::vector<size_t>{1, 3}));
  EXPECT_EQ(pick_victims(e, 0, tier_eviction::lru), (std::vector<size_t>{}));
  EXPECT_EQ(pick_victims(e, 1000, tier_eviction::lru).size(), 4u);
  // LFU: the page hit 9 times stays longest.
  EXPECT_EQ(pick_victims(e, 40, tier_eviction::lfu), (std::vector<size_t>{1, 3, 2, 0}));
  EXPECT_EQ(parse_tier_eviction("lfu"), tier_eviction::lfu);
  EXPECT_FALSE(parse_tier_eviction("mru"));
}

// The tiers' shared bookkeeping: budget, evictions in the policy's order
// with their depths, hits and misses, invariants.
TEST(TierIndex, EvictsByThePolicyAndKeepsItsCounts) {
  tier_index t("host", 30, tier_eviction::lru);
  t.insert({1, 10}, 10, 0, t.tick());
  t.insert({1, 11}, 10, 1, t.tick());
  t.insert({1, 12}, 10, 2, t.tick());
  EXPECT_TRUE(t.evict_for(0).empty());
  EXPECT_TRUE(t.hit({1, 10}, t.tick()));  // 10 is now the newest
  EXPECT_FALSE(t.hit({1, 99}, t.tick()));
  auto v = t.evict_for(15);  // two pages must go: 11 then 12
  ASSERT_EQ(v.size(), 2u);
  EXPECT_EQ(v[0].key.hash, 11u);
  EXPECT_EQ(v[0].depth, 1);
  EXPECT_EQ(v[1].key.hash, 12u);
  const auto st = t.stats();
  EXPECT_EQ(st.pages, 1);
  EXPECT_EQ(st.bytes, 10u);
  EXPECT_EQ(st.hits, 1u);
  EXPECT_EQ(st.misses, 1u);
  EXPECT_EQ(st.evictions, 2u);
  EXPECT_EQ(st.check, "");
  const std::vector<uint64_t> run = {10, 11};
  EXPECT_EQ(t.run_length(1, run), 1u);
  EXPECT_EQ(t.run_length(2, run), 0u);  // another space
  // Re-inserting a held key replaces it, counting it once.
  t.insert({1, 10}, 20, 0, t.tick());
  EXPECT_EQ(t.stats().bytes, 20u);
  EXPECT_EQ(t.check_invariants(), "");
}

TEST(MemoryTier, KeepsItsBudgetAndServesLeadingRuns) {
  const uint64_t one = page(0).footprint();
  memory_tier t(3 * one, tier_eviction::lru);
  EXPECT_TRUE(t.put({page(0), page(1), page(2)}).empty());
  EXPECT_EQ(t.stats().pages, 3);
  // The run stops at the first page it lacks.
  auto run = t.take_run(7, hashes(0, 5));
  ASSERT_EQ(run.size(), 3u);
  EXPECT_EQ(run[2].bytes[0], 2);
  EXPECT_EQ(t.stats().hits, 3u);
  EXPECT_EQ(t.stats().misses, 1u);
  EXPECT_EQ(t.take_run(8, hashes(0, 1)).size(), 0u);  // another space
  // Room for page 3: page 2 goes (the run used 0, 1 and 2 at once: the
  // deepest first).
  auto out = t.put({page(3)});
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].depth, 2);
  EXPECT_EQ(t.run_length(7, hashes(0, 4)), 2u);
  // Then the least recently used: 0 and 1 (used together), deepest first.
  out = t.put({page(4)});
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].depth, 1);
  EXPECT_TRUE(t.put({page(1)}).size() == 1u);  // evicts 0 now: older than 3 and 4
  // A page already held is only touched; duplicates in one put count once.
  EXPECT_TRUE(t.put({page(3), page(3)}).empty());
  EXPECT_EQ(t.stats().pages, 3);
  // A page larger than the whole budget passes straight through.
  kv_page big = page(9);
  big.bytes.resize(4 * one);
  EXPECT_EQ(t.put({big}).size(), 1u);
  EXPECT_EQ(t.check_invariants(), "");
  EXPECT_LE(t.stats().bytes, 3 * one);
}

TEST(PageFile, RoundTripsAndRefusesDamage) {
  const kv_page p = page(3);
  auto bytes = encode_page_file(p);
  kv_page back = decode_page_file(bytes);
  EXPECT_EQ(back.hash, p.hash);
  EXPECT_EQ(back.parent, p.parent);
  EXPECT_EQ(back.depth, 3);
  EXPECT_EQ(back.tokens, p.tokens);
  EXPECT_EQ(back.bytes, p.bytes);
  auto flipped = bytes;
  flipped[flipped.size() / 2] ^= 0x40;  // inside the page data
  EXPECT_THROW(decode_page_file(flipped), kv_blob_error);
  auto cut = bytes;
  cut.resize(cut.size() - 20);
  EXPECT_THROW(decode_page_file(cut), kv_blob_error);
  EXPECT_THROW(decode_page_file(std::vector<uint8_t>{0x93, 1, 2, 3}), kv_blob_error);
  EXPECT_THROW(decode_page_file(std::vector<uint8_t>{}), kv_blob_error);
}

TEST(DiskTier, PagesSurviveARestartAndDamagedFilesAreDropped) {
  temp_dir dir;
  const uint64_t one = encode_page_file(page(1)).size();  // page 0's parent is shorter
  {
    disk_tier t(dir.path, 10 * one, tier_eviction::lru);
    t.put({page(0), page(1), page(2), page(3)});
    EXPECT_EQ(t.stats().pages, 4);
    EXPECT_EQ(t.check_invariants(), "");
  }
  // A half-written file from a crash is cleaned up; a stranger is left alone.
  std::ofstream(dir.path / "0000000000000007-00000000000003e8-0.kvpage.tmp") << "half";
  std::ofstream(dir.path / "notes.txt") << "mine";
  {
    disk_tier t(dir.path, 10 * one, tier_eviction::lru);
    EXPECT_EQ(t.stats().pages, 4);
    auto run = t.read_run(7, hashes(0, 4));
    ASSERT_EQ(run.size(), 4u);
    EXPECT_EQ(run[3].bytes, page(3).bytes);
    EXPECT_EQ(run[1].tokens, page(1).tokens);
  }
  EXPECT_FALSE(fs::exists(dir.path / "0000000000000007-00000000000003e8-0.kvpage.tmp"));
  EXPECT_TRUE(fs::exists(dir.path / "notes.txt"));
  // Damage page 2's file: the run ends before it, and the file is gone.
  for (const auto& de : fs::directory_iterator(dir.path)) {
    const auto name = de.path().filename().string();
    if (name.find("-00000000000003ea-2.kvpage") == std::string::npos) continue;
    std::fstream f(de.path(), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(60);
    f.put('\x7f');
  }
  {
    disk_tier t(dir.path, 10 * one, tier_eviction::lru);
    EXPECT_EQ(t.read_run(7, hashes(0, 4)).size(), 2u);
    EXPECT_EQ(t.stats().dropped, 1u);
    EXPECT_EQ(t.stats().pages, 3);
    EXPECT_EQ(t.check_invariants(), "");
  }
  // A smaller budget at the next start evicts down to it.
  {
    disk_tier t(dir.path, 2 * one, tier_eviction::lru);
    EXPECT_EQ(t.stats().pages, 2);
    EXPECT_EQ(t.check_invariants(), "");
  }
  // One process's tier a folder: a second one is refused while the first lives.
  {
    disk_tier t(dir.path, 10 * one, tier_eviction::lru);
    EXPECT_THROW(disk_tier(dir.path, one, tier_eviction::lru), std::runtime_error);
  }
  EXPECT_NO_THROW(disk_tier(dir.path, 10 * one, tier_eviction::lru));
  // A path that is a file is refused with the reason.
  std::ofstream(dir.path / "plain") << "x";
  EXPECT_THROW(disk_tier(dir.path / "plain", one, tier_eviction::lru), std::runtime_error);
}

template <class T, class Handle, class... Ts>
T ask(caf::scoped_actor& self, const Handle& to, Ts&&... xs) {
  T out{};
  self->request(to, std::chrono::seconds(30), std::forward<Ts>(xs)...)
      .receive([&](T& x) { out = std::move(x); },
               [&](caf::error& e) { ADD_FAILURE() << self->system().render(e); });
  return out;
}

// Host full -> its evictions go to disk -> a fetch reads them back (and
// they move up to the host again).
TEST(KvPoolActor, SpillsToDiskAndFetchesAcrossTiers) {
  temp_dir dir;
  caf::actor_system_config cfg;
  register_message_types(cfg);
  caf::actor_system sys{cfg};
  kv_store_options o;
  o.host_bytes = 2 * page(0).footprint();
  o.disk_dir = dir.path.string();
  o.disk_bytes = 1 << 20;
  auto pool = spawn_kv_pool(sys, o);
  caf::scoped_actor self{sys};
  self->send(pool, kv_put_atom::value, std::vector<kv_page>{page(0), page(1), page(2), page(3)});
  auto st = ask<kv_store_stats>(self, pool, stats_atom::value);
  ASSERT_EQ(st.tiers.size(), 2u);
  EXPECT_EQ(st.tiers[0].pages, 2);
  EXPECT_EQ(st.offered_pages, 4u);
  EXPECT_EQ(st.check, "");
  // The disk got the host's evictions (the put to it is a message behind
  // the stats request's; ask again until it shows, bounded).
  for (int i = 0; i < 100 && st.tiers[1].pages < 2; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    st = ask<kv_store_stats>(self, pool, stats_atom::value);
  }
  EXPECT_EQ(st.tiers[1].pages, 2);
  auto run = ask<std::vector<kv_page>>(self, pool, kv_fetch_atom::value, uint64_t{7}, hashes(0, 5));
  ASSERT_EQ(run.size(), 4u);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(run[i].depth, i);
    EXPECT_EQ(run[i].bytes, page(i).bytes);
  }
  st = ask<kv_store_stats>(self, pool, stats_atom::value);
  // The disk tier's stats come a request behind (the pool never waits on
  // the disk to answer stats).
  for (int i = 0; i < 100 && st.tiers[1].hits < 4; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    st = ask<kv_store_stats>(self, pool, stats_atom::value);
  }
  EXPECT_EQ(st.fetched_pages, 4u);
  // Pages 0 and 1 from disk moved up and pushed 2 and 3 down, which the
  // run then read from disk too: a two-page host tier for a four-page run.
  EXPECT_EQ(st.tiers[1].hits, 4u);
  EXPECT_EQ(st.check, "");
  EXPECT_EQ(
      ask<std::vector<kv_page>>(self, pool, kv_fetch_atom::value, uint64_t{9}, hashes(0, 2)).size(),
      0u);
  caf::anon_send_exit(pool, caf::exit_reason::user_shutdown);
}

}  // namespace
}  // namespace troupe
