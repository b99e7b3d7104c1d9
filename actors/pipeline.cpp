#include "actors/pipeline.hpp"

#include <algorithm>
#include <chrono>
#include <deque>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "actors/device.hpp"
#include "runtime/common/elapsed.hpp"
#include "runtime/engine/micro_batch.hpp"

namespace troupe {

namespace {

// Operations in the order they came.  A step starts at once: its
// micro-batches queue for the first stage (below).  A page operation waits
// for every step before it, and the operations after it wait for it (a
// stage's part of a page read must see the steps before the read and none
// after).
struct pipeline_op {
  bool exclusive = false;  // waits for every step in flight
  bool blocking = false;   // the operations after it wait for it
  std::function<void()> start;
};

struct step_run;

// A micro-batch waiting to enter the first stage.
struct group_ref {
  std::shared_ptr<step_run> run;
  size_t group = 0;
};

struct pipeline_state {
  pipeline_state() = default;  // not an aggregate: CAF would build it from the self pointer
  std::vector<device_actor> stages;
  std::vector<size_t> page_bytes;  // each stage's part of a page
  device_info info;
  int micro = 1;  // micro-batches per step
  std::deque<pipeline_op> queue;
  int steps_in_flight = 0;
  bool blocked = false;  // a page operation runs
  // The step started last: its draws fill the next step's placeholders.
  std::shared_ptr<step_run> last_run;
  // Micro-batches enter the first stage in the order of their steps, so
  // every stage sees a sequence's rows in step order (each stage serves
  // its messages in order, and the next stage gets them in the order the
  // one before answers).  One whose placeholders wait for draws of the
  // step before holds those behind it.
  std::deque<group_ref> entering;
  std::chrono::steady_clock::time_point last_end;
  bool ran = false;
  static inline const char* name = "pipeline";
};

using self_ptr = device_actor::stateful_pointer<pipeline_state>;

void pump(self_ptr self) {
  auto& st = self->state;
  while (!st.queue.empty() && !st.blocked) {
    auto& op = st.queue.front();
    if (op.exclusive && st.steps_in_flight > 0) return;
    auto start = std::move(op.start);
    st.blocked = op.blocking;
    st.queue.pop_front();
    start();
  }
}

void enqueue(self_ptr self, bool exclusive, bool blocking, std::function<void()> start) {
  self->state.queue.push_back({exclusive, blocking, std::move(start)});
  pump(self);
}

// One step through the stages.  Its micro-batches overlap those of the
// steps before and after it: with step overlap, the next step's
// micro-batch enters the first stage as soon as the draws it needs have
// come out of the last one, while this step's later micro-batches are
// still on their way (the pipeline stays full across steps).
struct step_run {
  micro_split split;
  std::vector<forward_result> results;
  size_t left = 0;  // micro-batches not yet answered by the last stage (or dropped)
  size_t entered = 0;
  bool failed = false;
  caf::typed_response_promise<forward_result> rp;
  uint64_t step = 0;
  std::chrono::steady_clock::time_point began;
  double idle_ms = -1;
  // This step's draws (per presample row), as its micro-batches come out.
  std::vector<int32_t> drawn;
  std::vector<char> known;
  // Placeholders: per micro-batch, (its row, the draw of `source` it takes).
  std::vector<std::vector<std::pair<int32_t, int32_t>>> holes;
  std::shared_ptr<step_run> source;  // held until every micro-batch has entered
};

void fail_step(step_run& run, const std::string& why) {
  if (run.failed) return;
  run.failed = true;
  run.rp.deliver(caf::make_error(caf::sec::invalid_argument, "forward: " + why));
}

// A micro-batch is through (answered, failed or dropped); the last one
// answers the step.
void group_done(self_ptr self, const std::shared_ptr<step_run>& run) {
  if (--run->left > 0) return;
  auto& st = self->state;
  if (!run->failed) {
    try {
      forward_result out = merge_micro_results(run->split, run->results);
      out.device_ms = ms_between(run->began, std::chrono::steady_clock::now());
      out.idle_ms = run->idle_ms;
      run->rp.deliver(std::move(out));
    } catch (const std::exception& e) {
      fail_step(*run, e.what());
    }
  }
  --st.steps_in_flight;
  st.last_end = std::chrono::steady_clock::now();
  st.ran = true;
  pump(self);
}

void run_stage(self_ptr self, std::shared_ptr<step_run> run, size_t g, size_t s,
               std::vector<float> input);

// Sends micro-batches into the first stage while the one in front has the
// draws its placeholders take.
void enter_groups(self_ptr self) {
  auto& st = self->state;
  while (!st.entering.empty()) {
    auto run = st.entering.front().run;
    const size_t g = st.entering.front().group;
    auto& holes = run->holes[g];
    if (!run->failed && !holes.empty()) {
      const auto& src = *run->source;
      if (src.failed) {
        fail_step(*run, "the step before failed; its draws do not exist");
      } else {
        for (const auto& h : holes)
          if (!src.known[h.second]) return;  // not out of the last stage yet
        // A refused draw (NaN logits) fills token 0, as the device does.
        for (const auto& h : holes)
          run->split.groups[g].tokens[h.first] = std::max(src.drawn[h.second], 0);
      }
    }
    st.entering.pop_front();
    if (++run->entered == run->split.groups.size()) run->source.reset();
    if (run->failed)
      group_done(self, run);
    else
      run_stage(self, run, g, 0, {});
  }
}

// Micro-batch g through stage s and, with its output, the stages after.
void run_stage(self_ptr self, std::shared_ptr<step_run> run, size_t g, size_t s,
               std::vector<float> input) {
  auto& st = self->state;
  const bool last = s + 1 == st.stages.size();
  const forward_batch& group = run->split.groups[g];
  forward_batch b;
  b.tokens = group.tokens;
  b.positions = group.positions;
  b.seqs = group.seqs;
  b.step = group.step;
  b.stage_input = std::move(input);
  if (last) {
    b.logit_rows = group.logit_rows;
    b.hidden_rows = group.hidden_rows;
    b.presample = group.presample;
  }
  self->request(st.stages[s], caf::infinite, forward_atom::value, std::move(b))
      .then(
          [self, run, g, s, last](forward_result& r) {
            if (!last && !run->failed) {
              run_stage(self, run, g, s + 1, std::move(r.stage_output));
              return;
            }
            if (!run->failed) {
              const auto& at = run->split.drawn;
              for (size_t k = 0; k < at.size(); ++k)
                if (at[k].group == static_cast<int32_t>(g) &&
                    static_cast<size_t>(at[k].index) < r.drawn.size()) {
                  run->drawn[k] = r.drawn[at[k].index];
                  run->known[k] = 1;
                }
              run->results[g] = std::move(r);
            }
            group_done(self, run);
            enter_groups(self);
          },
          [self, run, s](caf::error& e) {
            fail_step(*run, "stage " + std::to_string(s) + ": " + self->system().render(e));
            group_done(self, run);
            enter_groups(self);
          });
}

void start_step(self_ptr self, forward_batch b, caf::typed_response_promise<forward_result> rp) {
  auto& st = self->state;
  auto run = std::make_shared<step_run>();
  run->rp = std::move(rp);
  run->step = b.step;
  run->began = std::chrono::steady_clock::now();
  if (st.ran && st.steps_in_flight == 0) run->idle_ms = ms_between(st.last_end, run->began);
  ++st.steps_in_flight;
  auto source = std::move(st.last_run);
  st.last_run = run;
  try {
    // Placeholders take draws of the step before (step overlap): the
    // stages draw nothing for the next step themselves.
    std::vector<std::pair<int32_t, int32_t>> holes;
    if (!b.placeholders.empty()) {
      if (!source || source->step != b.after || b.after == 0)
        throw std::invalid_argument("placeholders follow step " + std::to_string(b.after) +
                                    ", not the step before");
      for (const auto& p : b.placeholders) {
        if (p.row < 0 || static_cast<size_t>(p.row) >= b.tokens.size() || p.drawn_index < 0 ||
            static_cast<size_t>(p.drawn_index) >= source->drawn.size())
          throw std::invalid_argument("placeholder row " + std::to_string(p.row) + " names draw " +
                                      std::to_string(p.drawn_index) + " of " +
                                      std::to_string(source->drawn.size()));
        b.tokens[p.row] = 0;  // until the draw is known
        holes.emplace_back(p.row, p.drawn_index);
      }
      b.placeholders.clear();
      run->source = std::move(source);
    }
    // A sequence stays in the micro-batch of the draw it takes, so each of
    // this step's micro-batches waits for one of the step before only.
    std::vector<int32_t> preferred(b.seqs.size(), -1);
    if (!holes.empty()) {
      std::vector<int32_t> seq_of(b.tokens.size(), -1);
      for (size_t q = 0; q < b.seqs.size(); ++q)
        for (int32_t r = b.seqs[q].first_row;
             r >= 0 && r < b.seqs[q].first_row + b.seqs[q].n_rows &&
             static_cast<size_t>(r) < seq_of.size();
             ++r)
          seq_of[r] = static_cast<int32_t>(q);
      for (const auto& [row, draw] : holes)
        if (seq_of[row] >= 0) preferred[seq_of[row]] = run->source->split.drawn[draw].group;
    }
    run->split = split_micro_batches(b, st.micro, preferred);
    run->holes.resize(run->split.groups.size());
    for (const auto& [row, draw] : holes) {
      const auto at = run->split.rows[row];
      run->holes[at.group].emplace_back(at.index, draw);
    }
  } catch (const std::exception& e) {
    run->source.reset();
    run->left = 1;
    fail_step(*run, e.what());
    group_done(self, run);
    return;
  }
  run->drawn.assign(run->split.drawn.size(), 0);
  run->known.assign(run->split.drawn.size(), 0);
  run->results.resize(run->split.groups.size());
  run->left = run->split.groups.size();
  for (size_t g = 0; g < run->split.groups.size(); ++g) st.entering.push_back({run, g});
  enter_groups(self);
}

// A page operation's answers from the stages still to come, and the first
// error among them.
struct gather {
  size_t left = 0;
  std::string error;
};

void page_op_ended(self_ptr self) {
  self->state.blocked = false;
  pump(self);
}

device_actor::behavior_type pipeline_behavior(self_ptr self, std::vector<device_actor> stages,
                                              std::vector<size_t> page_bytes, device_info info) {
  auto& st = self->state;
  st.stages = std::move(stages);
  st.page_bytes = std::move(page_bytes);
  st.info = std::move(info);
  st.micro = static_cast<int>(st.stages.size());
  // A stage that ends takes the pipeline with it (its instance sees the loss).
  for (const auto& s : st.stages) self->link_to(s);
  auto no_experts = [](const char* what) {
    return caf::make_error(caf::sec::invalid_argument,
                           std::string(what) + ": a pipelined device has no expert devices");
  };
  return {
      [self](forward_atom, forward_batch& batch) -> caf::result<forward_result> {
        auto rp = self->make_response_promise<forward_result>();
        enqueue(self, false, false,
                [self, b = std::move(batch), rp]() mutable { start_step(self, std::move(b), rp); });
        return rp;
      },
      [](step_done_atom, uint64_t) {},
      [self](info_atom) { return self->state.info; },
      // Each stage's part of every page, put together page by page.
      [self](read_pages_atom,
             const std::vector<int32_t>& pages) -> caf::result<std::vector<uint8_t>> {
        auto rp = self->make_response_promise<std::vector<uint8_t>>();
        enqueue(self, true, true, [self, pages, rp]() mutable {
          auto& st = self->state;
          auto g = std::make_shared<gather>();
          auto parts = std::make_shared<std::vector<std::vector<uint8_t>>>(st.stages.size());
          g->left = st.stages.size();
          for (size_t s = 0; s < st.stages.size(); ++s) {
            auto finish = [self, g, parts, pages, rp]() mutable {
              if (--g->left > 0) return;
              page_op_ended(self);
              if (!g->error.empty()) {
                rp.deliver(caf::make_error(caf::sec::invalid_argument, g->error));
                return;
              }
              const auto& pb = self->state.page_bytes;
              size_t per = 0;
              for (size_t b : pb) per += b;
              std::vector<uint8_t> out;
              out.reserve(pages.size() * per);
              for (size_t i = 0; i < pages.size(); ++i)
                for (size_t s = 0; s < parts->size(); ++s) {
                  const auto& part = (*parts)[s];
                  if (part.size() != pages.size() * pb[s]) {
                    rp.deliver(caf::make_error(
                        caf::sec::invalid_argument,
                        "readpages: stage " + std::to_string(s) + " answered a short read"));
                    return;
                  }
                  out.insert(out.end(), part.begin() + i * pb[s], part.begin() + (i + 1) * pb[s]);
                }
              rp.deliver(std::move(out));
            };
            self->request(st.stages[s], caf::infinite, read_pages_atom::value, pages)
                .then(
                    [parts, s, finish](std::vector<uint8_t>& data) mutable {
                      (*parts)[s] = std::move(data);
                      finish();
                    },
                    [self, g, finish](caf::error& e) mutable {
                      if (g->error.empty()) g->error = self->system().render(e);
                      finish();
                    });
          }
        });
        return rp;
      },
      // Each page's data split into the stages' parts.
      [self](write_pages_atom, const std::vector<int32_t>& pages,
             const std::vector<uint8_t>& data) -> caf::result<int32_t> {
        auto& st = self->state;
        size_t per = 0;
        for (size_t b : st.page_bytes) per += b;
        if (data.size() != pages.size() * per)
          return caf::make_error(caf::sec::invalid_argument,
                                 "writepages: " + std::to_string(data.size()) + " bytes for " +
                                     std::to_string(pages.size()) + " pages of " +
                                     std::to_string(per));
        auto rp = self->make_response_promise<int32_t>();
        enqueue(self, true, true, [self, pages, data, per, rp]() mutable {
          auto& st = self->state;
          auto g = std::make_shared<gather>();
          g->left = st.stages.size();
          size_t at = 0;  // the stage's part's offset within a page
          for (size_t s = 0; s < st.stages.size(); ++s) {
            const size_t pb = st.page_bytes[s];
            std::vector<uint8_t> part;
            part.reserve(pages.size() * pb);
            for (size_t i = 0; i < pages.size(); ++i)
              part.insert(part.end(), data.begin() + i * per + at,
                          data.begin() + i * per + at + pb);
            at += pb;
            auto finish = [self, g, rp, n = pages.size()]() mutable {
              if (--g->left > 0) return;
              page_op_ended(self);
              if (!g->error.empty()) {
                rp.deliver(caf::make_error(caf::sec::invalid_argument, g->error));
                return;
              }
              rp.deliver(static_cast<int32_t>(n));
            };
            self->request(st.stages[s], caf::infinite, write_pages_atom::value, pages,
                          std::move(part))
                .then([finish](int32_t) mutable { finish(); },
                      [self, g, finish](caf::error& e) mutable {
                        if (g->error.empty()) g->error = self->system().render(e);
                        finish();
                      });
          }
        });
        return rp;
      },
      // Every stage copies its part.
      [self](copy_pages_atom, const std::vector<int32_t>& src,
             const std::vector<int32_t>& dst) -> caf::result<int32_t> {
        auto rp = self->make_response_promise<int32_t>();
        enqueue(self, true, true, [self, src, dst, rp]() mutable {
          auto& st = self->state;
          auto g = std::make_shared<gather>();
          g->left = st.stages.size();
          for (size_t s = 0; s < st.stages.size(); ++s) {
            auto finish = [self, g, rp, n = src.size()]() mutable {
              if (--g->left > 0) return;
              page_op_ended(self);
              if (!g->error.empty()) {
                rp.deliver(caf::make_error(caf::sec::invalid_argument, g->error));
                return;
              }
              rp.deliver(static_cast<int32_t>(n));
            };
            self->request(st.stages[s], caf::infinite, copy_pages_atom::value, src, dst)
                .then([finish](int32_t) mutable { finish(); },
                      [self, g, finish](caf::error& e) mutable {
                        if (g->error.empty()) g->error = self->system().render(e);
                        finish();
                      });
          }
        });
        return rp;
      },
      [no_experts](expert_stats_atom) -> caf::result<expert_stats> {
        return no_experts("expstats");
      },
      [no_experts](expert_prepare_atom, const expert_plan&) -> caf::result<uint64_t> {
        return no_experts("expprepare");
      },
      [no_experts](expert_commit_atom, uint64_t) -> caf::result<uint64_t> {
        return no_experts("expcommit");
      },
      [no_experts](expert_abort_atom, uint64_t) -> caf::result<uint64_t> {
        return no_experts("expabort");
      },
  };
}

}  // namespace

std::pair<int, int> stage_layers(int layers, int n, int i) {
  return {static_cast<int>(static_cast<int64_t>(layers) * i / n),
          static_cast<int>(static_cast<int64_t>(layers) * (i + 1) / n)};
}

device_actor spawn_pipeline(caf::actor_system& sys, std::shared_ptr<const model_file> model,
                            const engine_options& opts) {
  const auto& hp = model->hparams();
  const int n = opts.pipeline_stages;
  if (n < 2) throw std::invalid_argument("a pipeline has 2 stages at least");
  if (n > hp.n_layer)
    throw std::invalid_argument(std::to_string(n) + " pipeline stages for a model of " +
                                std::to_string(hp.n_layer) + " layers");
  if (hp.n_expert > 0)
    throw model_error(model->path() +
                      ": a mixture-of-experts model runs on one device (no pipeline stages)");
  // Every stage's arena holds the same pages: a page is the same positions
  // of a sequence on every stage, its layers' part on each.
  const size_t elem = opts.kv_f16 ? 2 : 4;
  const size_t layer_page = 2 * static_cast<size_t>(hp.n_head_kv) * opts.page_size *
                            static_cast<size_t>(hp.head_dim) * elem;
  engine_options so = opts;
  so.pipeline_stages = 1;
  so.expert_devices = 0;
  so.n_pages =
      opts.n_pages > 0
          ? opts.n_pages
          : static_cast<int>(opts.kv_bytes / (layer_page * static_cast<size_t>(hp.n_layer)));
  if (so.n_pages <= 0) throw std::invalid_argument("KV arena holds no page; raise kv_bytes");
  // One slice of the device per stage where it has the compute units.
  const int units = compute_units_of(opts.device);
  const bool sliced = units >= n;
  std::vector<device_actor> stages;
  std::vector<size_t> page_bytes;
  for (int i = 0; i < n; ++i) {
    std::tie(so.layer_first, so.layer_end) = stage_layers(hp.n_layer, n, i);
    if (sliced) {
      so.device.cores = units / n;
      so.device.slice = (opts.device.cores > 0 ? opts.device.slice * n : 0) + i;
    }
    stages.push_back(spawn_device(sys, model, so));
    page_bytes.push_back(layer_page * static_cast<size_t>(so.layer_end - so.layer_first));
  }
  // What the pipeline holds: the first stage's answer, with every stage's
  // weights, names and page parts.
  device_info info;
  std::string names;
  size_t weights = 0;
  caf::scoped_actor self{sys};
  for (size_t i = 0; i < stages.size(); ++i) {
    std::string error;
    device_info d;
    self->request(stages[i], std::chrono::seconds(60), info_atom::value)
        .receive([&](device_info& x) { d = std::move(x); },
                 [&](caf::error& e) { error = sys.render(e); });
    if (!error.empty())
      throw std::runtime_error("pipeline stage " + std::to_string(i) + ": " + error);
    if (i == 0) info = d;
    names += (i ? " | " : "") + d.device_name;
    weights += d.weight_bytes;
  }
  // Every stage holds the embedding and the classifier (the first reads
  // tokens, the last makes logits; tied, they are one matrix): device
  // memory, summed.
  info.device_name = "pipeline of " + std::to_string(n) + " stages: " + names;
  info.weight_bytes = weights;
  info.kv_bytes_per_page = layer_page * static_cast<size_t>(hp.n_layer);
  info.kv_dtype = opts.kv_f16 ? "f16" : "f32";
  return sys.spawn(pipeline_behavior, std::move(stages), std::move(page_bytes), std::move(info));
}

}  // namespace troupe
