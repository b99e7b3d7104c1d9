#include "actors/device.hpp"

#include <chrono>
#include <optional>

#include "runtime/elapsed.hpp"
#include "runtime/step_overlap.hpp"

namespace troupe {

namespace {

// Step overlap: what the last forward pass drew for the next one, and when
// it ended (the idle time before the next is the gap overlap hides).
struct step_chain {
  uint64_t step = 0;  // 0: the last forward failed, or named no step
  std::vector<int32_t> drawn;
  std::optional<std::chrono::steady_clock::time_point> ended;
};

// One forward pass: placeholders filled from the last pass's draws, the
// pass, then this pass's draws for the next.
forward_result run_forward(llama_forward& engine, forward_batch& batch, step_chain& chain) {
  const auto start = std::chrono::steady_clock::now();
  const double idle = chain.ended ? ms_between(*chain.ended, start) : -1;
  const uint64_t last = std::exchange(chain.step, 0);
  auto drawn = std::move(chain.drawn);
  chain.drawn.clear();
  struct mark_end {
    step_chain& c;
    ~mark_end() { c.ended = std::chrono::steady_clock::now(); }
  } end{chain};
  fill_placeholders(batch, last, drawn);
  forward_result r = engine.run(batch);
  r.drawn = presample(batch, r);
  chain.step = batch.step;
  chain.drawn = r.drawn;
  r.idle_ms = idle;
  r.device_ms = ms_between(start, std::chrono::steady_clock::now());
  return r;
}

// The expert swap's state: a prepared placement waiting for its commit.
struct expert_swap {
  uint64_t prepared_epoch = 0;
  std::vector<std::shared_ptr<device_moe>> prepared;  // [layer]
  uint64_t epoch = 0;
  uint64_t swaps = 0;
};

expert_stats read_expert_stats(llama_forward& engine, const expert_swap& swap) {
  expert_stats s;
  const auto& hp = engine.hparams();
  s.n_layers = hp.n_layer;
  s.n_experts = hp.n_expert;
  if (hp.n_expert == 0) return s;
  s.devices = engine.expert_devices();
  s.tokens = engine.take_expert_counts();
  s.busy_s = engine.expert_busy_seconds();
  for (int l = 0; l < hp.n_layer; ++l) s.layouts.push_back(engine.experts_of(l));
  s.epoch = swap.epoch;
  s.swaps = swap.swaps;
  return s;
}

device_actor::behavior_type device_behavior(device_actor::pointer self,
                                            std::shared_ptr<llama_forward> engine) {
  auto swap = std::make_shared<expert_swap>();
  auto chain = std::make_shared<step_chain>();
  return {
      [engine, swap](expert_stats_atom) { return read_expert_stats(*engine, *swap); },
      [engine, swap](expert_prepare_atom, const expert_plan& plan) -> caf::result<uint64_t> {
        const auto& hp = engine->hparams();
        if (hp.n_expert == 0)
          return caf::make_error(caf::sec::invalid_argument, "expprepare: a dense model");
        if (plan.layouts.size() != static_cast<size_t>(hp.n_layer))
          return caf::make_error(caf::sec::invalid_argument,
                                 "expprepare: a plan of " + std::to_string(plan.layouts.size()) +
                                     " layers for " + std::to_string(hp.n_layer));
        try {
          std::vector<std::shared_ptr<device_moe>> staged;
          for (int l = 0; l < hp.n_layer; ++l) {
            if (plan.layouts[l].size() != static_cast<size_t>(engine->expert_devices()))
              throw std::invalid_argument("layer " + std::to_string(l) + " places experts on " +
                                          std::to_string(plan.layouts[l].size()) +
                                          " devices; this one has " +
                                          std::to_string(engine->expert_devices()));
            // Unchanged layers keep their buffers.
            staged.push_back(
                plan.layouts[l] == engine->experts_of(l)
                    ? nullptr
                    : upload_experts(engine->context(), engine->model(), l, plan.layouts[l]));
          }
          swap->prepared = std::move(staged);
          swap->prepared_epoch = plan.epoch;
          return plan.epoch;
        } catch (const std::exception& e) {
          return caf::make_error(caf::sec::invalid_argument,
                                 std::string("expprepare: ") + e.what());
        }
      },
      [engine, swap](expert_commit_atom, uint64_t epoch) -> caf::result<uint64_t> {
        if (swap->prepared.empty() || swap->prepared_epoch != epoch)
          return caf::make_error(
              caf::sec::invalid_argument,
              "expcommit: placement " + std::to_string(epoch) + " is not prepared");
        for (size_t l = 0; l < swap->prepared.size(); ++l)
          if (swap->prepared[l]) engine->set_experts(static_cast<int>(l), swap->prepared[l]);
        swap->prepared.clear();
        swap->epoch = epoch;
        ++swap->swaps;
        return epoch;
      },
      [swap](expert_abort_atom, uint64_t epoch) {
        if (swap->prepared_epoch == epoch) swap->prepared.clear();
        return epoch;
      },
      [engine, chain](forward_atom, forward_batch& batch) -> caf::result<forward_result> {
        try {
          return run_forward(*engine, batch, *chain);
        } catch (const std::exception& e) {
          return caf::make_error(caf::sec::invalid_argument, std::string("forward: ") + e.what());
        }
      },
      [engine](info_atom) {
        device_info info;
        info.device_name = engine->device_name();
        info.model_path = engine->model().path();
        info.model_fingerprint = engine->model().fingerprint();
        info.n_vocab = engine->hparams().n_vocab;
        info.n_ctx = engine->hparams().n_ctx_train;
        info.n_pages = engine->n_pages();
        info.page_size = engine->page_size();
        info.weight_bytes = engine->weight_bytes();
        info.kv_bytes_per_page = engine->kv_bytes_per_page();
        const auto& hp = engine->hparams();
        info.n_layers = hp.n_layer;
        info.n_kv_heads = hp.n_head_kv;
        info.head_dim = hp.head_dim;
        const uint64_t elems = 2ull * hp.n_layer * hp.n_head_kv * hp.head_dim * info.page_size;
        info.kv_dtype = info.kv_bytes_per_page == 2 * elems ? "f16" : "f32";
        return info;
      },
      [engine](read_pages_atom,
               const std::vector<int32_t>& pages) -> caf::result<std::vector<uint8_t>> {
        try {
          return engine->read_pages(pages);
        } catch (const std::exception& e) {
          return caf::make_error(caf::sec::invalid_argument, std::string("readpages: ") + e.what());
        }
      },
      [engine](write_pages_atom, const std::vector<int32_t>& pages,
               const std::vector<uint8_t>& data) -> caf::result<int32_t> {
        try {
          engine->write_pages(pages, data);
          return static_cast<int32_t>(pages.size());
        } catch (const std::exception& e) {
          return caf::make_error(caf::sec::invalid_argument,
                                 std::string("writepages: ") + e.what());
        }
      },
      [engine](copy_pages_atom, const std::vector<int32_t>& src,
               const std::vector<int32_t>& dst) -> caf::result<int32_t> {
        try {
          engine->copy_pages(src, dst);
          return static_cast<int32_t>(src.size());
        } catch (const std::exception& e) {
          return caf::make_error(caf::sec::invalid_argument, std::string("copypages: ") + e.what());
        }
      },
  };
}

}  // namespace

device_actor spawn_device(caf::actor_system& sys, std::shared_ptr<const model_file> model,
                          const engine_options& opts) {
  auto engine = std::make_shared<llama_forward>(std::move(model), opts);
  return sys.spawn<caf::detached>(device_behavior, std::move(engine));
}

}  // namespace troupe
