#pragma once
// An engine in an actor system for the golden tests (test_golden.cpp,
// test_moe.cpp): a model opened by name or path, its device actor, and greedy
// decoding through forward calls.
#include <gtest/gtest.h>

#include <algorithm>
#include <caf/all.hpp>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "actors/device.hpp"
#include "messages/actors.hpp"
#include "runtime/engine/sequence_runner.hpp"
#include "runtime/model/model_registry.hpp"
#include "runtime/text/tokenizer.hpp"

namespace troupe::testing {

struct engine_fixture {
  caf::actor_system_config cfg;
  std::unique_ptr<caf::actor_system> sys;
  std::shared_ptr<const model_file> model;
  device_actor dev;
  device_info info;

  explicit engine_fixture(const std::string& name, engine_options opts = {}) {
    register_message_types(cfg);
    sys = std::make_unique<caf::actor_system>(cfg);
    auto r = resolve_model(name);
    model = model_file::open(r.model_path, r.tokenizer_path);
    dev = spawn_device(*sys, model, opts);
    caf::scoped_actor self{*sys};
    self->request(dev, caf::infinite, info_atom::value)
        .receive([&](device_info& i) { info = i; }, [](caf::error&) { FAIL(); });
  }
  ~engine_fixture() { caf::anon_send_exit(dev, caf::exit_reason::user_shutdown); }

  forward_fn forward() {
    auto self = std::make_shared<caf::scoped_actor>(*sys);
    return [self, d = dev](const forward_batch& b) {
      forward_result out;
      (*self)
          ->request(d, caf::infinite, forward_atom::value, b)
          .receive([&](forward_result& r) { out = std::move(r); },
                   [&](caf::error& e) { ADD_FAILURE() << (*self)->system().render(e); });
      return out;
    };
  }

  std::vector<int32_t> greedy(const std::vector<int32_t>& prompt, int n) {
    linear_pages pages(info.n_pages, info.page_size);
    sequence_slot seq;
    auto fwd = forward();
    auto logits = feed_tokens(fwd, pages, seq, prompt, 512, false);
    std::vector<int32_t> out;
    for (int i = 0; i < n; ++i) {
      int32_t best =
          static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
      out.push_back(best);
      if (i + 1 < n) logits = feed_tokens(fwd, pages, seq, {best}, 1, false);
    }
    return out;
  }
};

// One prompt of a golden file (tools/record_*_golden.py): its text must
// encode to llama.cpp's prompt tokens; then `e`'s greedy tokens against
// llama.cpp's.  Returns troupe's tokens and how many agree before the first
// difference (all of them where none differs).
struct golden_run {
  std::vector<int32_t> want, got;
  size_t same = 0;
  bool whole() const { return same == want.size(); }
};
inline golden_run run_golden_prompt(engine_fixture& e, const tokenizer& tok,
                                    const nlohmann::json& p) {
  golden_run r;
  const auto prompt = p["prompt_token_ids"].get<std::vector<int32_t>>();
  r.want = p["greedy_token_ids"].get<std::vector<int32_t>>();
  EXPECT_EQ(tok.encode(p["prompt"].get<std::string>(), true, false), prompt) << p["prompt"];
  r.got = e.greedy(prompt, static_cast<int>(r.want.size()));
  while (r.same < r.want.size() && r.got[r.same] == r.want[r.same]) ++r.same;
  return r;
}

inline std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace troupe::testing
