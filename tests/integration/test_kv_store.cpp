// The KV store's tiers in a real `troupe serve` (issue 39): a prompt whose
// prefix the device arena evicted is loaded back from the host tier, and
// from the disk tier after the server restarts on the same folder; the
// greedy tokens never change; a damaged page file is dropped, not served.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "process.hpp"
#include "requests.hpp"
#include "server_process.hpp"
#include "tools/client/client.hpp"

namespace troupe::testing {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

// Stories of about 120 tokens each, different from their first word on,
// so each fills its own pages.
std::vector<std::string> stories() {
  const std::vector<std::string> names = {"Lily", "Tom", "Anna", "Ben", "Sue", "Max"};
  std::vector<std::string> out;
  for (const auto& n : names) {
    std::string s = n + " had a big red ball.";
    for (int i = 0; i < 8; ++i)
      s += " " + n + " played with the ball in the park with a dog and a cat number " +
           std::to_string(i) + ".";
    out.push_back(s);
  }
  return out;
}

json generate(const server_process& s, const std::string& prompt) {
  auto r = run_process(troupe_bin() + " client --json --ignore-eos -n 16 --server " +
                       shell_quote(s.endpoint()) + " -p " + shell_quote(prompt));
  EXPECT_EQ(r.exit_code, 0) << r.err;
  return json::parse(r.out);
}

// `admin kv`'s disk tier once `ready` holds for it (its stats reach the
// store a poll behind), or as it is after 10 s.
template <class Ready>
json disk_when(const server_process& s, Ready&& ready);

// The first (only) store of `admin kv`, and its tier named `tier`.
json tier(const json& kv, const std::string& name) {
  for (const auto& st : kv["stores"])
    for (const auto& t : st["tiers"])
      if (t["tier"] == name) return t;
  ADD_FAILURE() << "no " << name << " tier in " << kv.dump();
  return json::object();
}

template <class Ready>
json disk_when(const server_process& s, Ready&& ready) {
  json d;
  for (int i = 0; i < 100; ++i) {
    d = tier(s.admin("kv"), "disk");
    if (ready(d)) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return d;
}

struct temp_dir {
  fs::path path = fs::temp_directory_path() / ("troupe-kvdisk-" + std::to_string(::getpid()));
  temp_dir() { fs::remove_all(path); }
  ~temp_dir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

// The arena holds about two stories (2 MiB of stories15m's KV): the later
// ones evict the first, whose pages the host tier keeps.
TEST(KvStore, HostTierGivesBackPromptsTheArenaEvicted) {
  server_process s("--kv-mb 2 --kv-host-mb 64");
  const auto prompts = stories();
  std::vector<json> first;
  for (const auto& p : prompts) first.push_back(generate(s, p));
  // Again, in the same order: each one's prefix left the arena meanwhile.
  for (size_t i = 0; i < prompts.size(); ++i) {
    auto again = generate(s, prompts[i]);
    EXPECT_EQ(again["token_ids"], first[i]["token_ids"]) << prompts[i];
    EXPECT_GE(again["usage"]["cached_tokens"].get<int>(), 96) << again.dump();
    // The trace says where the prefix came from (`troupe client` numbers
    // its requests from 1; the newest request 1 is this one).
    auto trace = s.admin("trace 1");
    EXPECT_GT(trace["tier_tokens"].get<int>(), 0) << trace.dump();
    EXPECT_LE(trace["tier_tokens"], trace["cached_tokens"]) << trace.dump();
  }
  auto kv = s.admin("kv");
  EXPECT_GT(kv["spilled_pages"].get<int>(), 0) << kv.dump();
  EXPECT_GT(kv["loaded_pages"].get<int>(), 0) << kv.dump();
  EXPECT_GT(tier(kv, "host")["hits"].get<int>(), 0) << kv.dump();
  EXPECT_EQ(kv["stores"][0]["check"], "") << kv.dump();
}

// A host tier of 1 MiB passes most pages down to disk; a new server on the
// same folder finds them.  Then every page file is damaged: the next
// server drops what it reads and computes the prompt afresh.
TEST(KvStore, DiskTierSurvivesARestartAndDropsDamagedPages) {
  temp_dir dir;
  const std::string flags =
      "--kv-mb 2 --kv-host-mb 1 --kv-disk-mb 64 --kv-disk-dir " + shell_quote(dir.path.string());
  const auto prompts = stories();
  std::vector<json> first;
  {
    server_process s(flags);
    for (const auto& p : prompts) first.push_back(generate(s, p));
    EXPECT_GT(disk_when(s, [](const json& d) { return d["pages"] > 0; })["pages"].get<int>(), 0);
    s.signal(SIGTERM);
    EXPECT_EQ(s.wait_exit(std::chrono::seconds(30)), 0);
  }
  {
    server_process s(flags);
    // The first story's pages went to disk first of all.
    auto again = generate(s, prompts[0]);
    EXPECT_EQ(again["token_ids"], first[0]["token_ids"]);
    EXPECT_GE(again["usage"]["cached_tokens"].get<int>(), 96) << again.dump();
    auto disk = disk_when(s, [](const json& d) { return d["hits"] > 0; });
    EXPECT_GT(disk["hits"].get<int>(), 0) << disk.dump();
    EXPECT_EQ(disk["dropped"], 0) << disk.dump();
    s.signal(SIGTERM);
    EXPECT_EQ(s.wait_exit(std::chrono::seconds(30)), 0);
  }
  int damaged = 0;
  for (const auto& de : fs::directory_iterator(dir.path)) {
    std::fstream f(de.path(), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(fs::file_size(de.path()) / 2));
    f.put('\x5a');
    f.put('\xa5');
    ++damaged;
  }
  ASSERT_GT(damaged, 0);
  {
    server_process s(flags);
    auto again = generate(s, prompts[0]);
    EXPECT_EQ(again["token_ids"], first[0]["token_ids"]);
    auto disk = disk_when(s, [](const json& d) { return d["dropped"] > 0; });
    EXPECT_GT(disk["dropped"].get<int>(), 0) << disk.dump();
    EXPECT_EQ(disk["hits"], 0) << disk.dump();
  }
}

}  // namespace
}  // namespace troupe::testing

namespace troupe::testing {
namespace {

// Preemption by swap with a KV store: the swapped-out KV waits in the
// kv_pool, not in the engine, and comes back; every answer as offline, and
// nothing is left in the store.
TEST(KvStore, SwappedOutKvWaitsInTheStore) {
  server_process s("--kv-mb 2 --kv-host-mb 64 --preemption swap --max-seqs 8");
  const auto prompts = stories();
  client::connection c(s.endpoint());
  std::vector<wire::Generate> gens;
  for (size_t i = 0; i < prompts.size(); ++i)
    gens.push_back(greedy_request(10 + i, prompts[i], 24));
  auto results = client::run(c, gens, std::chrono::seconds(120));
  ASSERT_EQ(results.size(), prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    ASSERT_FALSE(results[i].error) << results[i].error->message();
    EXPECT_EQ(results[i].token_ids, offline_tokens("stories15m", prompts[i], 24)) << prompts[i];
  }
  auto kv = s.admin("kv");
  const auto& store = kv["stores"][0];
  EXPECT_GT(store["swaps_kept"].get<int>(), 0) << kv.dump();
  EXPECT_EQ(store["swaps"].get<int>(), 0) << kv.dump();
  EXPECT_EQ(store["swap_bytes"].get<int>(), 0) << kv.dump();
  auto inst = s.wait_engine_idle(std::chrono::seconds(15));
  for (const auto& i : inst) EXPECT_GT(i["preempted_swap"].get<int>(), 0) << i.dump();
}

}  // namespace
}  // namespace troupe::testing
