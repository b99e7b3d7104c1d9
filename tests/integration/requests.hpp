#pragma once
// Requests the integration tests send again and again, and the references
// their outputs are held to.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "messages/client.pb.h"
#include "process.hpp"
#include "server_process.hpp"
#include "tools/client/client.hpp"

namespace troupe::testing {

// A greedy request for `n` tokens of `prompt`, EOS ignored (so it runs to
// its length and can be held to offline greedy).
inline wire::Generate greedy_request(uint64_t id, const std::string& prompt, int n) {
  wire::Generate g;
  g.set_request_id(id);
  g.set_text(prompt);
  g.set_max_tokens(n);
  g.set_ignore_eos(true);
  return g;
}

// 240 tokens of "Once upon a time" with EOS ignored: long enough to be
// caught mid-stream (cancel, migrate, drain) on stories15m.
inline wire::Generate long_request(uint64_t id) {
  wire::Generate g;
  g.set_request_id(id);
  g.set_text("Once upon a time");
  g.set_max_tokens(240);
  g.set_ignore_eos(true);
  return g;
}

// Applies the connection's messages to the results `find` names until
// `done()` holds; false when no message came for `quiet` first.
template <class Find, class Done>
bool receive_until(client::connection& c, Find&& find, Done&& done,
                   std::chrono::milliseconds quiet) {
  while (!done()) {
    auto m = c.receive(quiet);
    if (!m) return false;
    client::apply(*m, find);
  }
  return true;
}

// Offline `troupe generate --ignore-eos` of `prompt`: the greedy tokens a
// served request must equal, whatever moved it.
inline std::vector<int32_t> offline_tokens(const std::string& model, const std::string& prompt,
                                           int n) {
  auto r = run_process(troupe_bin() + " generate -m " + model + " --ignore-eos --json -n " +
                       std::to_string(n) + " -p " + shell_quote(prompt));
  EXPECT_EQ(r.exit_code, 0) << r.err;
  return nlohmann::json::parse(r.out)["token_ids"].get<std::vector<int32_t>>();
}

// Moves streaming request `id` (folded into `r` by `find`) back and forth
// between instances 2 and 1 through `admin migrate`, at most `attempts`
// times and until `enough` moves succeeded (a move to where it runs is
// refused: the next one goes the other way); returns the moves made.
template <class Find>
int migrate_back_and_forth(const server_process& server, client::connection& c,
                           const client::result& r, Find&& find, uint64_t id, int attempts,
                           int enough) {
  int moved = 0;
  for (int i = 0; i < attempts && moved < enough && !r.done(); ++i) {
    auto res = server.admin_command("migrate " + std::to_string(id) + " " + (i % 2 ? "1" : "2"));
    if (res.exit_code == 0) ++moved;
    while (auto m = c.receive(std::chrono::milliseconds(0))) client::apply(*m, find);
  }
  return moved;
}

}  // namespace troupe::testing
