#include "actors/device.hpp"

#include <chrono>
#include <deque>
#include <mutex>
#include <optional>

#include "actors/head_route.hpp"
#include "actors/pipeline.hpp"
#include "runtime/common/elapsed.hpp"
#include "runtime/engine/step_overlap.hpp"

namespace troupe {

namespace {

// Pipelined steps (engine_options::queue_steps; step overlap on the device):
// a forward pass is submitted behind those still running and answered when
// the device reports it ended (step_done), so the device starts step N+1
// as soon as N ends.  A step whose placeholders need draws made on the
// host waits for the step before it to be answered first.
struct pending_step {
  uint64_t seq = 0;  // the actor's own count of submitted steps
  caf::typed_response_promise<forward_result> rp;
  // Drawn on the host when answered: the rows' sampling, and the tokens
  // and logit rows their penalties count the input token from.
  forward_batch drawn_from;
  bool device_draws = false;
  std::chrono::steady_clock::time_point submitted;
};

// Carries the driver's notes that a step ended (from a driver thread) to
// the actor, until the actor ends: a note may come after that (the
// driver calls back once the step is done, which can be after the engine
// has waited for it), when the actor and its system may be gone.  It
// holds the actor only while steps are pending (armed by the actor, and
// disarmed by it when none is left or it ends), so an idle device nobody
// references still ends, and the last reference is never dropped on a
// driver thread.
class step_notifier {
 public:
  void arm(caf::actor self) {
    std::lock_guard<std::mutex> lock(m_);
    self_ = std::move(self);
  }
  void disarm() { arm(nullptr); }
  void ended(uint64_t seq) {
    std::lock_guard<std::mutex> lock(m_);
    if (self_) caf::anon_send(self_, step_done_atom::value, seq);
  }

 private:
  std::mutex m_;
  caf::actor self_;
};

struct step_chain {
  uint64_t step = 0;                 // the last step submitted (0: none, or it failed)
  bool drawn_on_device = false;      // its draws are on the device
  size_t n_drawn = 0;                // how many
  std::vector<int32_t> drawn;        // its draws, where made on the host (once answered)
  uint64_t submitted = 0;            // steps submitted so far
  std::deque<pending_step> pending;  // submitted, not yet answered, oldest first
  // When the device last ended a step (the idle time before the next is
  // the gap step overlap hides).
  std::optional<std::chrono::steady_clock::time_point> ended;
  std::shared_ptr<step_notifier> notifier;
};

// Answers the oldest pending step, waiting for the device where it has not
// ended yet.
void answer_oldest(llama_forward& engine, step_chain& chain) {
  pending_step p = std::move(chain.pending.front());
  chain.pending.pop_front();
  if (chain.pending.empty()) chain.notifier->disarm();
  const bool last = p.seq == chain.submitted;
  try {
    forward_result r = engine.collect();
    const auto now = std::chrono::steady_clock::now();
    if (!p.device_draws) r.drawn = presample(p.drawn_from, r);
    if (last) chain.drawn = r.drawn;
    // The device started this step when it was submitted or when the one
    // before ended, whichever came later.
    const auto began = chain.ended ? std::max(p.submitted, *chain.ended) : p.submitted;
    r.idle_ms = chain.ended ? std::max(0.0, ms_between(*chain.ended, p.submitted)) : -1;
    r.device_ms = ms_between(began, now);
    chain.ended = now;
    p.rp.deliver(std::move(r));
  } catch (const std::exception& e) {
    if (last) chain.step = 0;
    p.rp.deliver(caf::make_error(caf::sec::invalid_argument, std::string("forward: ") + e.what()));
  }
}

void answer_all(llama_forward& engine, step_chain& chain) {
  while (!chain.pending.empty()) answer_oldest(engine, chain);
}

// Submits one forward pass: placeholders named (device draws of the step
// before) or filled (host draws, waiting for that step's answer first).
caf::typed_response_promise<forward_result> submit_forward(device_actor::pointer self,
                                                           llama_forward& engine, step_chain& chain,
                                                           forward_batch& b) {
  auto rp = self->make_response_promise<forward_result>();
  try {
    const bool pipelined = engine.options().queue_steps;
    const bool device_draws =
        pipelined && !b.presample.empty() && llama_forward::draws_on_device(b.presample);
    // Penalized rows drawn on the host count their input tokens: those must
    // be known, not named draws of the step before.
    const bool counts_inputs = std::any_of(b.presample.begin(), b.presample.end(),
                                           [](const presample_row& q) { return q.count_input; });
    if (!b.placeholders.empty() && chain.drawn_on_device && (device_draws || !counts_inputs)) {
      name_device_draws(b, chain.step, chain.n_drawn);
    } else {
      if (!b.placeholders.empty()) answer_all(engine, chain);
      fill_placeholders(b, chain.step, chain.drawn);
    }
    const uint64_t seq = chain.submitted + 1;
    auto notify = [n = chain.notifier, seq](bool) { n->ended(seq); };
    if (pipelined) chain.notifier->arm(caf::actor_cast<caf::actor>(self));
    // Host draws need the rows' sampling when the step is answered.
    pending_step p{seq, rp, {}, device_draws, std::chrono::steady_clock::now()};
    if (!device_draws && !b.presample.empty()) {
      p.drawn_from.presample = b.presample;
      if (counts_inputs) {
        p.drawn_from.tokens = b.tokens;
        p.drawn_from.logit_rows = b.logit_rows;
      }
    }
    engine.submit(b, device_draws, pipelined ? std::function<void(bool)>(notify) : nullptr);
    chain.submitted = seq;
    chain.step = b.step;
    chain.drawn_on_device = device_draws;
    chain.n_drawn = b.presample.size();
    chain.drawn.clear();
    chain.pending.push_back(std::move(p));
    if (!pipelined) answer_all(engine, chain);
  } catch (const std::exception& e) {
    chain.step = 0;
    chain.drawn_on_device = false;
    if (chain.pending.empty()) chain.notifier->disarm();  // armed for a step never submitted
    rp.deliver(caf::make_error(caf::sec::invalid_argument, std::string("forward: ") + e.what()));
  }
  return rp;
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

caf::error not_pipelined(const char* what) {
  return caf::make_error(caf::sec::invalid_argument,
                         std::string(what) +
                             ": this instance's device is not pipelined (it has no stages; "
                             "engine.pipeline_parallel)");
}

device_actor::behavior_type device_behavior(device_actor::pointer self,
                                            std::shared_ptr<llama_forward> engine) {
  auto swap = std::make_shared<expert_swap>();
  auto chain = std::make_shared<step_chain>();
  auto heads = std::make_shared<head_route_state>();
  chain->notifier = std::make_shared<step_notifier>();
  self->attach_functor([n = chain->notifier] { n->disarm(); });
  return {
      // Expert loads since the last read (reading resets the token counts).
      [engine, swap](expert_stats_atom) { return read_expert_stats(*engine, *swap); },
      // Swap phase one: upload the plan's changed layers beside the ones in use.
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
      // Swap phase two: the prepared experts serve from the next step on.
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
      // The swap was given up: drop the plan prepared for this epoch.
      [swap](expert_abort_atom, uint64_t epoch) {
        if (swap->prepared_epoch == epoch) swap->prepared.clear();
        return epoch;
      },
      // Layer and head moves are between a pipeline's stages; one device
      // has none.
      [](move_layers_atom, int32_t, int32_t, int32_t) -> caf::result<std::string> {
        return not_pipelined("movelayers");
      },
      [](move_heads_atom, int32_t, int32_t, int32_t) -> caf::result<std::string> {
        return not_pipelined("moveheads");
      },
      // KV-head migration, as a pipeline's stage (actors/head_route.hpp).
      [engine, heads](head_guest_atom, const head_op& op) -> caf::result<head_answer> {
        try {
          return serve_head_op(*engine, *heads, op);
        } catch (const std::exception& e) {
          return caf::make_error(caf::sec::invalid_argument, std::string("headguest: ") + e.what());
        }
      },
      [self, engine, heads](head_route_atom, caf::actor helper, int32_t kv_lo,
                            int32_t kv_hi) -> caf::result<int32_t> {
        try {
          route_heads(self->system(), *engine, *heads, std::move(helper), kv_lo, kv_hi);
          return kv_hi - kv_lo;
        } catch (const std::exception& e) {
          return caf::make_error(caf::sec::invalid_argument, std::string("headroute: ") + e.what());
        }
      },
      // One step: submitted behind those running, answered when it ends.
      [self, engine, chain](forward_atom, forward_batch& batch) -> caf::result<forward_result> {
        return submit_forward(self, *engine, *chain, batch);
      },
      // The driver's note: steps up to `seq` ended, so answer them in order.
      [engine, chain](step_done_atom, uint64_t seq) {
        while (!chain->pending.empty() && chain->pending.front().seq <= seq)
          answer_oldest(*engine, *chain);
      },
      // What the device holds: the model and its KV arena's geometry.
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
        info.memory_bytes = engine->device_memory_bytes();
        info.n_embd = engine->hparams().n_embd;
        info.kv_bytes_per_page = engine->kv_bytes_per_page();
        const auto& hp = engine->hparams();
        info.n_layers = hp.n_layer;
        info.n_kv_heads = hp.n_head_kv;
        info.head_dim = hp.head_dim;
        const uint64_t elems = 2ull * hp.n_layer * hp.n_head_kv * hp.head_dim * info.page_size;
        info.kv_dtype = info.kv_bytes_per_page == 2 * elems ? "f16" : "f32";
        return info;
      },
      // The pages' KV data, in order (swap-out, export).
      [engine](read_pages_atom,
               const std::vector<int32_t>& pages) -> caf::result<std::vector<uint8_t>> {
        try {
          return engine->read_pages(pages);
        } catch (const std::exception& e) {
          return caf::make_error(caf::sec::invalid_argument, std::string("readpages: ") + e.what());
        }
      },
      // Write KV data into the pages (swap-in, import).
      [self, engine, heads](write_pages_atom, const std::vector<int32_t>& pages,
                            const std::vector<uint8_t>& data) -> caf::result<int32_t> {
        try {
          engine->write_pages(pages, data);
          mirror_page_write(self->system(), *engine, *heads, pages, data);
          return static_cast<int32_t>(pages.size());
        } catch (const std::exception& e) {
          return caf::make_error(caf::sec::invalid_argument,
                                 std::string("writepages: ") + e.what());
        }
      },
      // Copy the pages' data, src to dst (copy-on-write).
      [self, engine, heads](copy_pages_atom, const std::vector<int32_t>& src,
                            const std::vector<int32_t>& dst) -> caf::result<int32_t> {
        try {
          engine->copy_pages(src, dst);
          mirror_page_copy(self->system(), *heads, src, dst);
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
  if (opts.pipeline_stages >= 2) return spawn_pipeline(sys, std::move(model), opts);
  // Places for stages of a device that has none: a mistake to say, not to
  // ignore.
  if (!opts.pipeline_nodes.empty())
    throw std::invalid_argument("engine.pipeline_nodes (--pipeline-nodes) names " +
                                std::to_string(opts.pipeline_nodes.size()) +
                                " stage places, but --pipeline-parallel is " +
                                std::to_string(opts.pipeline_stages) + ": give one per stage");
  auto engine = std::make_shared<llama_forward>(std::move(model), opts);
  return sys.spawn<caf::detached>(device_behavior, std::move(engine));
}

}  // namespace troupe
