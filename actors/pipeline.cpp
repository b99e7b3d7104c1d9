#include "actors/pipeline.hpp"

#include <algorithm>
#include <chrono>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <spdlog/spdlog.h>

#include "actors/device.hpp"
#include "actors/head_route.hpp"
#include "actors/remote_stage.hpp"
#include "actors/stage_probe.hpp"
#include "runtime/common/elapsed.hpp"
#include "runtime/device/head_migration.hpp"
#include "runtime/device/layer_migration.hpp"
#include "runtime/device/layer_placement.hpp"
#include "runtime/device/stage_rebalance.hpp"
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

// What spawn_pipeline built: the stages and what the pipeline needs to
// rebuild two of them around a moved boundary.
struct pipeline_setup {
  std::shared_ptr<const model_file> model;
  std::vector<engine_options> stage_opts;  // each stage's (its device slice, its layers)
  std::vector<device_actor> stages;
  std::vector<std::string> places;  // where each stage runs: "local" or a node's HOST:PORT
  size_t layer_page = 0;            // one layer's part of a page
  device_info info;
};

// What a move's loader (phase one) leaves the pipeline: the new pair, or
// why not.  A pipeline that ended meanwhile marks it abandoned, and the
// loader's stages end at once instead of lingering (on a node, a stage
// nobody links to would live as long as the node).
struct prepared_pair {
  std::mutex m;
  bool done = false;
  bool abandoned = false;
  device_actor a, b;
  std::string error;
};

struct pipeline_state {
  pipeline_state() = default;  // not an aggregate: CAF would build it from the self pointer
  pipeline_state(const pipeline_state&) = delete;
  pipeline_state& operator=(const pipeline_state&) = delete;
  ~pipeline_state() {
    // A move asked for by hand gets its answer: the pipeline ended (a
    // stage was lost) before it was done.
    const auto gone = caf::make_error(caf::sec::runtime_error,
                                      "movelayers: the pipeline ended before the move was done");
    if (move_reply) move_reply->deliver(gone);
    if (queued_move) queued_move->second.deliver(gone);
    if (!preparing) return;
    std::lock_guard<std::mutex> lock(preparing->m);
    preparing->abandoned = true;
    for (auto* d : {&preparing->a, &preparing->b})
      if (*d) caf::anon_send_exit(*d, caf::exit_reason::user_shutdown);
  }
  std::shared_ptr<const model_file> model;
  std::vector<engine_options> stage_opts;
  std::vector<device_actor> stages;
  std::vector<std::string> places;
  std::vector<size_t> page_bytes;  // each stage's part of a page
  size_t layer_page = 0;
  device_info info;
  // Layer migration (runtime/device/layer_migration.hpp): each stage's
  // busy time over the window, the window's steps, a move under way.
  layer_migration_options migration;
  int window = 64;
  std::vector<double> busy_s;
  int window_steps = 0;
  bool moving = false;
  // A move's first phase: the two new stages loading on a loader of their
  // own while steps go on (loading blocks).
  std::shared_ptr<prepared_pair> preparing;
  layer_move planned;
  // Pages any step or write has named: a move copies only these (the
  // others hold nothing yet).
  std::vector<char> touched;
  // After a move that failed (a stage did not load: memory), the windows
  // to skip before planning again: doubling with each failure in a row.
  int move_failures = 0;
  int skip_windows = 0;
  // A move asked for by hand (admin movelayers): answered once it is done;
  // one asked while another move runs waits for it.
  std::optional<caf::typed_response_promise<std::string>> move_reply;
  std::optional<std::pair<layer_move, caf::typed_response_promise<std::string>>> queued_move;
  // KV-head migration (actors/head_route.hpp): the stage whose group of
  // KV heads attends on another (-1: none), that one, the group's size.
  int heads_donor = -1, heads_helper = -1, heads_away = 0;
  bool heads_by_hand = false;  // moved by hand: the pipeline's rule leaves it
  // The window's rows and their contexts (for attention's share of a step).
  int64_t window_rows = 0;
  int64_t window_passes = 0;         // micro-batches through the stages (each pays a head trip)
  int windows_since_move = 1 << 30;  // windows ended since a move (of layers or heads) ended
  double window_context = 0;
  std::deque<pipeline_op> queue;
  int steps_in_flight = 0;
  bool blocked = false;  // a page operation runs
  // The step started last: its draws fill the next step's placeholders.
  std::shared_ptr<step_run> last_run;
  // Steps not yet answered, oldest first.
  std::deque<std::shared_ptr<step_run>> order;
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

void touch(pipeline_state& st, const std::vector<int32_t>& pages) {
  for (int32_t p : pages)
    if (p >= 0 && static_cast<size_t>(p) < st.touched.size()) st.touched[p] = 1;
}

// The pages any step or write has named (a move copies only these: the
// others hold nothing yet).
std::vector<int32_t> touched_pages(const pipeline_state& st) {
  std::vector<int32_t> pages;
  for (size_t i = 0; i < st.touched.size(); ++i)
    if (st.touched[i]) pages.push_back(static_cast<int32_t>(i));
  return pages;
}

// Where a group of KV heads is away, as refusals name it: "KV heads of
// stage D attend on stage H".
std::string heads_away(const pipeline_state& st) {
  return "KV heads of stage " + std::to_string(st.heads_donor) + " attend on stage " +
         std::to_string(st.heads_helper);
}

// How to bring it home: "moveheads D H 0".
std::string bring_home_command(const pipeline_state& st) {
  return "moveheads " + std::to_string(st.heads_donor) + " " + std::to_string(st.heads_helper) +
         " 0";
}

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
  std::string error;                 // why it failed
  forward_result out;                // its result, until answered
};

void consider_moving_layers(self_ptr self);
void start_move(self_ptr self, layer_move m);

// A failed step is answered with its error in its turn (answer_in_order);
// the steps after it that take its draws fail too.
void fail_step(step_run& run, const std::string& why) {
  if (run.failed) return;
  run.failed = true;
  run.error = why;
}

// Answers the steps that are through, oldest first: the engine takes its
// answers in the order it sent the steps, as one device gives them (an
// answer ahead of an older step's would be dropped, and the older one
// then wait for ever).
void answer_in_order(self_ptr self) {
  auto& st = self->state;
  bool answered = false;
  while (!st.order.empty() && st.order.front()->left == 0) {
    auto run = std::move(st.order.front());
    st.order.pop_front();
    if (run->failed)
      run->rp.deliver(caf::make_error(caf::sec::invalid_argument, "forward: " + run->error));
    else
      run->rp.deliver(std::move(run->out));
    --st.steps_in_flight;
    st.last_end = std::chrono::steady_clock::now();
    st.ran = true;
    answered = true;
    if (!run->failed && ++st.window_steps >= st.window) consider_moving_layers(self);
  }
  if (answered) pump(self);
}

// A micro-batch is through (answered, failed or dropped); after the last
// one the step's result is put together, to be answered in its turn.
void group_done(self_ptr self, const std::shared_ptr<step_run>& run) {
  if (--run->left > 0) return;
  if (!run->failed) {
    try {
      run->out = merge_micro_results(run->split, run->results);
      run->out.device_ms = ms_between(run->began, std::chrono::steady_clock::now());
      run->out.idle_ms = run->idle_ms;
    } catch (const std::exception& e) {
      fail_step(*run, e.what());
    }
  }
  // The next step may hold this one (its draws) until it starts: not its logits.
  run->results = {};
  answer_in_order(self);
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
  if (s == 0) {
    b.embed_rows = group.embed_rows;
    b.embed_input = group.embed_input;
  }
  if (last) {
    b.logit_rows = group.logit_rows;
    b.hidden_rows = group.hidden_rows;
    b.presample = group.presample;
  }
  self->request(st.stages[s], caf::infinite, forward_atom::value, std::move(b))
      .then(
          [self, run, g, s, last](forward_result& r) {
            self->state.busy_s[s] += r.device_ms / 1000.0;
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
  st.order.push_back(run);
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
    // As many micro-batches as stages keep every stage busy.
    run->split = split_micro_batches(b, static_cast<int>(st.stages.size()), preferred);
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
  for (const auto& q : b.seqs) touch(st, q.pages);
  st.window_rows += static_cast<int64_t>(b.positions.size());
  st.window_passes += static_cast<int64_t>(run->split.groups.size());
  for (int32_t p : b.positions) st.window_context += p + 1.0;
  run->drawn.assign(run->split.drawn.size(), 0);
  run->known.assign(run->split.drawn.size(), 0);
  run->results.resize(run->split.groups.size());
  run->left = run->split.groups.size();
  for (size_t g = 0; g < run->split.groups.size(); ++g) st.entering.push_back({run, g});
  enter_groups(self);
}

// A page operation on every stage: `ask(s)` sends stage s its request,
// `take(s, reply)` keeps its answer; once every stage has answered, the
// operations after it may start and `done` gets the first error (empty:
// none).
template <class Reply, class Ask, class Take>
void on_every_stage(self_ptr self, Ask ask, Take take,
                    std::function<void(const std::string& error)> done) {
  struct gather {
    size_t left = 0;
    std::string error;
  };
  auto g = std::make_shared<gather>();
  g->left = self->state.stages.size();
  auto finish = [self, g, done] {
    if (--g->left > 0) return;
    self->state.blocked = false;
    pump(self);
    done(g->error);
  };
  for (size_t s = 0; s < self->state.stages.size(); ++s)
    ask(s).then(
        [s, take, finish](Reply& r) mutable {
          take(s, r);
          finish();
        },
        [self, g, finish](caf::error& e) {
          if (g->error.empty()) g->error = self->system().render(e);
          finish();
        });
}

// A page operation's answer: the pages it covered, or the first stage's error.
std::function<void(const std::string&)> answer_count(caf::typed_response_promise<int32_t> rp,
                                                     size_t n) {
  return [rp, n](const std::string& error) mutable {
    if (error.empty())
      rp.deliver(static_cast<int32_t>(n));
    else
      rp.deliver(caf::make_error(caf::sec::invalid_argument, error));
  };
}

void set_stage_layout(pipeline_state& st) {
  st.page_bytes.clear();
  st.info.stage_first_layers.clear();
  for (const auto& o : st.stage_opts) {
    st.page_bytes.push_back(st.layer_page * static_cast<size_t>(o.layer_end - o.layer_first));
    st.info.stage_first_layers.push_back(o.layer_first);
  }
}

// A new window of busy times, steps, passes and contexts.
void start_window(pipeline_state& st) {
  std::fill(st.busy_s.begin(), st.busy_s.end(), 0.0);
  st.window_steps = 0;
  st.window_rows = 0;
  st.window_passes = 0;
  st.window_context = 0;
}

void move_failed(pipeline_state& st) {
  st.move_failures = std::min(st.move_failures + 1, 10);
  st.skip_windows = 1 << st.move_failures;
}

// A stage's device where the pipeline places it: on a slice of this
// process's device, or on a troupe node.
device_actor spawn_stage(caf::actor_system& sys, const std::shared_ptr<const model_file>& model,
                         const engine_options& so, const std::string& place) {
  if (place == "local") return spawn_device(sys, model, so);
  stage_spec spec;
  spec.engine = *so.settings;
  spec.layer_first = so.layer_first;
  spec.layer_end = so.layer_end;
  spec.n_pages = so.n_pages;
  return spawn_remote_stage(sys, place, spec);
}

// Why a move asked for by hand cannot run on the stages as they are (empty:
// it can).
std::string check_manual_move(const pipeline_state& st, const layer_move& m) {
  const int32_t n = static_cast<int32_t>(st.stages.size());
  if (m.from < 0 || m.from >= n || m.to < 0 || m.to >= n ||
      (m.to != m.from - 1 && m.to != m.from + 1))
    return "stages " + std::to_string(m.from) + " and " + std::to_string(m.to) +
           " are not neighbours among the " + std::to_string(n) + " stages (0.." +
           std::to_string(n - 1) + ")";
  if (st.heads_donor >= 0)
    return heads_away(st) + ": bring them home first (" + bring_home_command(st) + ")";
  const auto& o = st.stage_opts[static_cast<size_t>(m.from)];
  const int32_t have = o.layer_end - o.layer_first;
  if (have <= 1) return "stage " + std::to_string(m.from) + " holds one layer: it has none to give";
  if (m.layers < 1 || m.layers >= have)
    return "stage " + std::to_string(m.from) + " holds " + std::to_string(have) +
           " layers: it can give 1 to " + std::to_string(have - 1) + ", not " +
           std::to_string(m.layers);
  return {};
}

// A move asked for by hand while another ran: it starts now, checked
// against the stages as that move left them.
void start_queued_move(self_ptr self) {
  auto& st = self->state;
  if (st.moving || !st.queued_move) return;
  auto [m, rp] = std::move(*st.queued_move);
  st.queued_move.reset();
  if (auto why = check_manual_move(st, m); !why.empty()) {
    rp.deliver(caf::make_error(caf::sec::invalid_argument, "movelayers: " + why));
    return;
  }
  st.move_reply = rp;
  start_move(self, m);
}

// The answer to a move asked for by hand, if one was.
void answer_move(pipeline_state& st, const std::string& what, bool ok) {
  if (!st.move_reply) return;
  if (ok)
    st.move_reply->deliver(what);
  else
    st.move_reply->deliver(caf::make_error(caf::sec::runtime_error, "movelayers: " + what));
  st.move_reply.reset();
}

// The two stages around a move's boundary with their new layers: the
// pair's options after the move.
std::pair<engine_options, engine_options> moved_pair(const pipeline_state& st, layer_move m) {
  const size_t a = static_cast<size_t>(std::min(m.from, m.to));
  auto oa = st.stage_opts[a], ob = st.stage_opts[a + 1];
  const int shift = m.to < m.from ? m.layers : -m.layers;  // the boundary moves by this
  oa.layer_end += shift;
  ob.layer_first += shift;
  return {oa, ob};
}

// A move's second phase, between steps (an exclusive, blocking operation:
// every step before it has ended, none after it has started, so no step
// sees half a move): every used page's KV of the pair's layers is read
// from the old pair and written, split at the new boundary, into the new
// pair (loaded in the first phase), which then replaces it.  Should
// anything fail, the old pair stays.
void move_layers(self_ptr self, layer_move m, device_actor na, device_actor nb) {
  auto& st = self->state;
  const auto began = std::chrono::steady_clock::now();
  const size_t a = static_cast<size_t>(std::min(m.from, m.to)), b = a + 1;
  const auto [oa, ob] = moved_pair(st, m);
  try {
    caf::scoped_actor io{self->system()};
    const std::vector<int32_t> pages = touched_pages(st);
    auto fail = [&](caf::error& e) { throw std::runtime_error(self->system().render(e)); };
    auto read_all = [&](const device_actor& d) {
      std::vector<uint8_t> out;
      io->request(d, std::chrono::seconds(120), read_pages_atom::value, pages)
          .receive([&](std::vector<uint8_t>& x) { out = std::move(x); }, fail);
      return out;
    };
    auto write_all = [&](const device_actor& d, const std::vector<uint8_t>& data) {
      io->request(d, std::chrono::seconds(120), write_pages_atom::value, pages, data)
          .receive([](int32_t) {}, fail);
    };
    const auto pa = read_all(st.stages[a]);
    const auto pb = read_all(st.stages[b]);
    // Per page, the pair's layers in order: a's part, then b's; split anew.
    const size_t old_a = st.page_bytes[a], old_b = st.page_bytes[b];
    const size_t new_a = st.layer_page * static_cast<size_t>(oa.layer_end - oa.layer_first);
    const size_t new_b = old_a + old_b - new_a;
    if (pa.size() != pages.size() * old_a || pb.size() != pages.size() * old_b)
      throw std::runtime_error("a stage answered a short page read");
    std::vector<uint8_t> wa, wb, joined(old_a + old_b);
    wa.reserve(pages.size() * new_a);
    wb.reserve(pages.size() * new_b);
    for (size_t i = 0; i < pages.size(); ++i) {
      std::copy_n(pa.begin() + i * old_a, old_a, joined.begin());
      std::copy_n(pb.begin() + i * old_b, old_b, joined.begin() + old_a);
      wa.insert(wa.end(), joined.begin(), joined.begin() + new_a);
      wb.insert(wb.end(), joined.begin() + new_a, joined.end());
    }
    write_all(na, wa);
    write_all(nb, wb);
    for (size_t i : {a, b}) {
      self->unlink_from(st.stages[i]);
      caf::anon_send_exit(st.stages[i], caf::exit_reason::user_shutdown);
    }
    st.stages[a] = na;
    st.stages[b] = nb;
    self->link_to(na);
    self->link_to(nb);
    st.stage_opts[a] = oa;
    st.stage_opts[b] = ob;
    set_stage_layout(st);
    ++st.info.layer_moves;
    st.windows_since_move = 0;
    st.move_failures = 0;
    const double s = ms_between(began, std::chrono::steady_clock::now()) / 1000.0;
    // What a layer's move costs here (the pause), for the next decision.
    st.migration.move_cost_s = s / m.layers;
    std::string firsts;
    for (int32_t f : st.info.stage_first_layers)
      firsts += (firsts.empty() ? "" : ", ") + std::to_string(f);
    const std::string what = fmt::format(
        "moved {} layer(s) from stage {} to stage {}: steps paused {:.0f} ms for {:.1f} MiB of KV "
        "({} pages); the stages start at layers {}",
        m.layers, m.from, m.to, 1000 * s, static_cast<double>(wa.size() + wb.size()) / (1 << 20),
        pages.size(), firsts);
    if (st.move_reply)
      spdlog::info("pipeline: {} (asked for by hand)", what);
    else
      spdlog::info("pipeline: {} (predicted gain {:.0f}%)", what, 100 * m.gain);
    answer_move(st, what, true);
  } catch (const std::exception& e) {
    spdlog::warn(
        "pipeline: moving {} layer(s) from stage {} to stage {} failed ({}); the stages "
        "stay as they were",
        m.layers, m.from, m.to, e.what());
    // The new pair is not used: it ends (on a node it would linger).
    for (const auto* d : {&na, &nb})
      if (*d && *d != st.stages[a] && *d != st.stages[b])
        caf::anon_send_exit(*d, caf::exit_reason::user_shutdown);
    move_failed(st);
    answer_move(st, std::string(e.what()) + "; the stages stay as they were", false);
  }
  st.moving = false;
  start_window(st);
  start_queued_move(self);
}

// Phase one of move `m`: the new pair loads beside the old one, where the
// old one runs, while steps go on; the pipeline looks in on it
// (step_done ticks) and queues phase two.
void start_move(self_ptr self, layer_move m) {
  auto& st = self->state;
  st.moving = true;
  st.planned = m;
  const size_t a = static_cast<size_t>(std::min(m.from, m.to));
  auto [oa, ob] = moved_pair(st, m);
  auto slot = std::make_shared<prepared_pair>();
  st.preparing = slot;
  // A detached actor of its own (the actor system waits for it at exit;
  // the pipeline never does): it loads the pair, leaves it in the slot and
  // ticks the pipeline (step_done 0).
  self->system().spawn<caf::detached>(
      [slot, model = st.model, oa = oa, ob = ob, pa = st.places[a], pb = st.places[a + 1],
       pipeline = caf::actor_cast<device_actor>(self)](caf::event_based_actor* loader) {
        auto& sys = loader->system();
        device_actor na, nb;
        std::string error;
        try {
          na = spawn_stage(sys, model, oa, pa);
          nb = spawn_stage(sys, model, ob, pb);
        } catch (const std::exception& e) {
          error = e.what();
        }
        {
          std::lock_guard<std::mutex> lock(slot->m);
          slot->done = true;
          if (slot->abandoned || !error.empty()) {
            for (auto* d : {&na, &nb})
              if (*d) caf::anon_send_exit(*d, caf::exit_reason::user_shutdown);
            slot->error = error.empty() ? "the pipeline ended" : error;
          } else {
            slot->a = std::move(na);
            slot->b = std::move(nb);
          }
        }
        caf::anon_send(pipeline, step_done_atom::value, uint64_t{0});
      });
}

// Why a head move asked for cannot run (empty: it can).
std::string check_head_move(const pipeline_state& st, int32_t from, int32_t to, int32_t heads) {
  const int32_t n = static_cast<int32_t>(st.stages.size());
  const int32_t n_kv = st.info.n_kv_heads;
  if (from < 0 || from >= n || to < 0 || to >= n || from == to)
    return "stages " + std::to_string(from) + " and " + std::to_string(to) +
           " are not two of the " + std::to_string(n) + " stages (0.." + std::to_string(n - 1) +
           ")";
  if (n_kv < 2) return "a stage of this model has one KV head: it has none to give";
  if (heads < 0 || heads >= n_kv)
    return "a stage has " + std::to_string(n_kv) + " KV heads and keeps one at least: move 1 to " +
           std::to_string(n_kv - 1) + " (0 brings a group home), not " + std::to_string(heads);
  if (st.moving) return "a layer move is under way; ask again once it is done";
  if (heads == 0 && (st.heads_donor != from || st.heads_helper != to))
    return "no KV heads of stage " + std::to_string(from) + " attend on stage " +
           std::to_string(to);
  if (heads > 0 && st.heads_donor >= 0)
    return heads_away(st) +
           " already: one group at a time (bring it home: " + bring_home_command(st) + ")";
  return {};
}

// A head move, between steps (exclusive and blocking, as a layer move's
// phase two): the group's pages go to the helper and the donor routes the
// group there, or the group comes home.
std::string move_heads(self_ptr self, int32_t from, int32_t to, int32_t heads) {
  auto& st = self->state;
  const auto began = std::chrono::steady_clock::now();
  const auto donor = caf::actor_cast<caf::actor>(st.stages[static_cast<size_t>(from)]);
  const auto helper = caf::actor_cast<caf::actor>(st.stages[static_cast<size_t>(to)]);
  if (heads == 0) {
    const auto not_dropped = bring_head_group_home(self->system(), donor, helper);
    if (!not_dropped.empty())
      spdlog::warn("pipeline: stage {} kept its copy of the head group: {}", to, not_dropped);
    const int32_t away = st.heads_away;
    st.heads_donor = st.heads_helper = -1;
    st.heads_away = 0;
    st.windows_since_move = 0;
    return fmt::format(
        "{} KV head(s) of stage {} attend at home again (from stage {}): steps "
        "paused {:.0f} ms",
        away, from, to, ms_between(began, std::chrono::steady_clock::now()));
  }
  const auto& o = st.stage_opts[static_cast<size_t>(from)];
  head_move m;
  m.layer_first = o.layer_first;
  m.layer_end = o.layer_end;
  m.n_kv = st.info.n_kv_heads;
  m.kv_lo = m.n_kv - heads;  // the last ones
  m.kv_hi = m.n_kv;
  m.head_bytes = kv_head_bytes(st.info.page_size, st.info.head_dim, st.info.kv_dtype == "f16");
  const std::vector<int32_t> pages = touched_pages(st);
  const size_t bytes = move_head_group(self->system(), donor, helper, m, pages);
  st.heads_donor = from;
  st.heads_helper = to;
  st.heads_away = heads;
  st.windows_since_move = 0;
  const double ms = ms_between(began, std::chrono::steady_clock::now());
  // What moving every head of a layer costs here (the pause), for the next
  // decision: this group's pause over its share.
  st.migration.head_move_cost_s =
      ms / 1000 / ((m.layer_end - m.layer_first) * static_cast<double>(heads) / m.n_kv);
  return fmt::format(
      "moved the attention of KV heads [{}, {}) of stage {}'s layers [{}, {}) to stage {}: steps "
      "paused {:.0f} ms for {:.2f} MiB of KV ({} pages)",
      m.kv_lo, m.kv_hi, from, m.layer_first, m.layer_end, to, ms,
      static_cast<double>(bytes) / (1 << 20), pages.size());
}

// A head move in line after the steps already sent, answered on `rp`
// where one was asked for by hand.
void queue_head_move(self_ptr self, int32_t from, int32_t to, int32_t heads,
                     std::optional<caf::typed_response_promise<std::string>> rp, double gain = 0) {
  enqueue(self, true, true, [self, from, to, heads, rp, gain]() mutable {
    // Checked again: a move queued behind another sees its result.
    auto why = check_head_move(self->state, from, to, heads);
    if (why.empty()) {
      try {
        const auto what = move_heads(self, from, to, heads);
        if (heads > 0) self->state.heads_by_hand = rp.has_value();
        if (rp)
          spdlog::info("pipeline: {} (asked for by hand)", what);
        else
          spdlog::info("pipeline: {} (predicted gain {:.0f}%)", what, 100 * gain);
        if (rp) rp->deliver(what);
      } catch (const std::exception& e) {
        why = std::string(e.what()) + "; the heads stay where they were";
      }
    }
    if (!why.empty()) {
      if (rp)
        rp->deliver(caf::make_error(caf::sec::invalid_argument, "moveheads: " + why));
      else
        spdlog::warn("pipeline: moving {} KV head(s) of stage {} to stage {}: {}", heads, from, to,
                     why);
    }
    self->state.blocked = false;
    pump(self);
  });
}

// At the end of a window: the stages' busy times to plan_stage_rebalance
// (runtime/device/stage_rebalance.hpp, the simulator's rule too); a move it
// finds goes in line after the steps already sent.
void consider_moving_layers(self_ptr self) {
  auto& st = self->state;
  stage_rebalance_inputs in;
  for (size_t i = 0; i < st.stages.size(); ++i)
    in.load.stages.push_back(
        {st.stage_opts[i].layer_end - st.stage_opts[i].layer_first, st.busy_s[i]});
  in.load.steps = st.window_passes;
  in.windows_since_move = st.windows_since_move;
  st.windows_since_move = std::min(st.windows_since_move + 1, 1 << 30);
  const double context = st.window_rows > 0 ? st.window_context / st.window_rows : 0;
  start_window(st);
  // A group moved by hand stays until brought home by hand; a layer move
  // under way finishes first.
  if (st.moving || (st.heads_donor >= 0 && st.heads_by_hand)) return;
  if (st.heads_donor >= 0)
    in.away = head_group_away{st.heads_donor, st.heads_helper, st.heads_away};
  else if (st.skip_windows > 0) {
    --st.skip_windows;
    return;
  }
  const auto& hp = st.model->hparams();
  in.load.n_kv = hp.n_head_kv;
  in.load.attention_share =
      attention_share(hp.n_embd, hp.n_head, hp.n_head_kv, hp.head_dim, hp.n_ff, context);
  const auto m = plan_stage_rebalance(in, st.migration);
  if (m.heads_home)
    queue_head_move(self, st.heads_donor, st.heads_helper, 0, std::nullopt);
  else if (m.layers)
    start_move(self, *m.layers);
  else if (m.heads)
    queue_head_move(self, m.heads->from, m.heads->to, m.heads->heads, std::nullopt, m.heads->gain);
}

// A tick while a move's new stages load: once loaded, phase two goes in
// line after the steps already sent.
void check_prepared(self_ptr self) {
  auto& st = self->state;
  if (!st.moving || !st.preparing) return;
  device_actor na, nb;
  std::string error;
  {
    std::lock_guard<std::mutex> lock(st.preparing->m);
    if (!st.preparing->done) return;
    na = std::move(st.preparing->a);
    nb = std::move(st.preparing->b);
    error = st.preparing->error;
  }
  st.preparing.reset();
  if (error.empty()) {
    enqueue(self, true, true, [self, m = st.planned, na = na, nb = nb] {
      move_layers(self, m, na, nb);
      self->state.blocked = false;
      pump(self);
    });
    return;
  }
  spdlog::warn(
      "pipeline: the stages for moving {} layer(s) from stage {} to stage {} did not "
      "load ({}); the stages stay as they were",
      st.planned.layers, st.planned.from, st.planned.to, error);
  st.moving = false;
  move_failed(st);
  answer_move(st, "the new stages did not load: " + error, false);
  start_queued_move(self);
}

device_actor::behavior_type pipeline_behavior(self_ptr self, pipeline_setup setup) {
  auto& st = self->state;
  st.model = std::move(setup.model);
  st.stage_opts = std::move(setup.stage_opts);
  st.stages = std::move(setup.stages);
  st.places = std::move(setup.places);
  st.layer_page = setup.layer_page;
  st.info = std::move(setup.info);
  set_stage_layout(st);
  st.busy_s.assign(st.stages.size(), 0.0);
  st.touched.assign(static_cast<size_t>(std::max(st.info.n_pages, 0)), 0);
  st.migration.threshold = st.stage_opts.front().pipeline_rebalance;
  st.window = std::max(1, st.stage_opts.front().pipeline_window);
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
      // The loader's tick: a layer move's new stages are loaded.
      [self](step_done_atom, uint64_t) { check_prepared(self); },
      [self](info_atom) { return self->state.info; },
      // Each stage's part of every page, put together page by page.
      [self](read_pages_atom,
             const std::vector<int32_t>& pages) -> caf::result<std::vector<uint8_t>> {
        auto rp = self->make_response_promise<std::vector<uint8_t>>();
        enqueue(self, true, true, [self, pages, rp]() mutable {
          auto parts =
              std::make_shared<std::vector<std::vector<uint8_t>>>(self->state.stages.size());
          on_every_stage<std::vector<uint8_t>>(
              self,
              [self, pages](size_t s) {
                return self->request(self->state.stages[s], caf::infinite, read_pages_atom::value,
                                     pages);
              },
              [parts](size_t s, std::vector<uint8_t>& data) { (*parts)[s] = std::move(data); },
              [self, parts, pages, rp](const std::string& error) mutable {
                if (!error.empty()) {
                  rp.deliver(caf::make_error(caf::sec::invalid_argument, error));
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
              });
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
          touch(st, pages);
          // Stage s's part of a page starts at offsets[s] within it.
          std::vector<size_t> offsets{0};
          for (size_t b : st.page_bytes) offsets.push_back(offsets.back() + b);
          on_every_stage<int32_t>(
              self,
              [self, pages, data, per, offsets](size_t s) {
                const size_t pb = self->state.page_bytes[s];
                std::vector<uint8_t> part;
                part.reserve(pages.size() * pb);
                for (size_t i = 0; i < pages.size(); ++i)
                  part.insert(part.end(), data.begin() + i * per + offsets[s],
                              data.begin() + i * per + offsets[s] + pb);
                return self->request(self->state.stages[s], caf::infinite, write_pages_atom::value,
                                     pages, std::move(part));
              },
              [](size_t, int32_t&) {}, answer_count(rp, pages.size()));
        });
        return rp;
      },
      // Every stage copies its part.
      [self](copy_pages_atom, const std::vector<int32_t>& src,
             const std::vector<int32_t>& dst) -> caf::result<int32_t> {
        auto rp = self->make_response_promise<int32_t>();
        enqueue(self, true, true, [self, src, dst, rp]() mutable {
          touch(self->state, dst);
          on_every_stage<int32_t>(
              self,
              [self, src, dst](size_t s) {
                return self->request(self->state.stages[s], caf::infinite, copy_pages_atom::value,
                                     src, dst);
              },
              [](size_t, int32_t&) {}, answer_count(rp, src.size()));
        });
        return rp;
      },
      // A layer move by hand (admin, shell): the same two phases as the
      // pipeline's own moves.
      [self](move_layers_atom, int32_t from, int32_t to,
             int32_t layers) -> caf::result<std::string> {
        auto& st = self->state;
        const layer_move m{from, to, layers, 0.0};
        if (auto why = check_manual_move(st, m); !why.empty())
          return caf::make_error(caf::sec::invalid_argument, "movelayers: " + why);
        if (st.queued_move || st.move_reply)
          return caf::make_error(caf::sec::invalid_argument,
                                 "movelayers: a move asked for by hand is under way; ask again "
                                 "once it is done");
        auto rp = self->make_response_promise<std::string>();
        if (st.moving) {
          // The pipeline's own move runs: this one follows it.
          st.queued_move.emplace(m, rp);
          return rp;
        }
        st.move_reply = rp;
        start_move(self, m);
        return rp;
      },
      // KV-head migration by hand (admin, shell): between two steps.
      [self](move_heads_atom, int32_t from, int32_t to, int32_t heads) -> caf::result<std::string> {
        if (auto why = check_head_move(self->state, from, to, heads); !why.empty())
          return caf::make_error(caf::sec::invalid_argument, "moveheads: " + why);
        auto rp = self->make_response_promise<std::string>();
        queue_head_move(self, from, to, heads, rp);
        return rp;
      },
      // A stage's part of head migration is the stages' business.
      [](head_guest_atom, const head_op&) -> caf::result<head_answer> {
        return caf::make_error(
            caf::sec::invalid_argument,
            "headguest: a pipeline's stages serve head groups, not the pipeline");
      },
      [](head_route_atom, caf::actor, int32_t, int32_t) -> caf::result<int32_t> {
        return caf::make_error(caf::sec::invalid_argument,
                               "headroute: a pipeline's stages route head groups (moveheads)");
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

// UELLM's HELR placement over the stages' devices (engine.pipeline_placement
// he, lr or helr; runtime/device/layer_placement): each stage's device is
// measured (a token through its layers, a message there and back, its
// memory), and place_layers picks the devices, their order and their
// layers; where that differs from the even split the stages are spawned
// anew (before the pipeline serves: no KV to carry).  A placement may use
// fewer devices than stages.  Throws where no set of the devices holds the
// model.
void place_stages(caf::actor_system& sys, pipeline_setup& setup, const model_hparams& hp,
                  const engine_options& opts) {
  const auto mode = parse_placement_mode(opts.pipeline_placement);
  const size_t n = setup.stages.size();
  std::vector<placement_device> devices;
  std::vector<double> trip;
  std::string measured;
  for (size_t i = 0; i < n; ++i) {
    const auto& o = setup.stage_opts[i];
    const auto p =
        probe_stage(sys, setup.stages[i], o.layer_end - o.layer_first, hp.n_embd, i == 0);
    placement_device d;
    d.name = setup.places[i] + (o.device.cores > 0 && setup.places[i] == "local"
                                    ? " slice " + std::to_string(o.device.slice)
                                    : "");
    d.memory_bytes = opts.pipeline_device_mb > 0 ? double(opts.pipeline_device_mb) * (1 << 20)
                                                 : static_cast<double>(p.memory_bytes);
    d.seconds_per_layer = p.seconds_per_layer;
    measured += fmt::format("{}{}: {:.3f} ms a layer, {:.0f} MiB, {:.2f} ms there and back",
                            i ? "; " : "", d.name, 1000 * d.seconds_per_layer,
                            d.memory_bytes / (1 << 20), 1000 * p.round_trip_s);
    devices.push_back(std::move(d));
    trip.push_back(p.round_trip_s);
  }
  // A step's hidden states go from one stage to the next through the
  // pipeline: half of each stage's round trip.
  std::vector<std::vector<double>> link(n, std::vector<double>(n, 0.0));
  for (size_t i = 0; i < n; ++i)
    for (size_t j = 0; j < n; ++j)
      if (i != j) link[i][j] = (trip[i] + trip[j]) / 2;
  // A layer's weights and its part of the KV arena live with its stage.
  size_t weights = 0;
  caf::scoped_actor self{sys};
  for (const auto& st : setup.stages)
    self->request(st, std::chrono::seconds(60), info_atom::value)
        .receive([&](device_info& d) { weights += d.weight_bytes; }, [](caf::error&) {});
  layer_model lm;
  lm.layers = hp.n_layer;
  lm.layer_bytes = static_cast<double>(weights) / hp.n_layer +
                   static_cast<double>(setup.layer_page) * setup.stage_opts.front().n_pages;
  const auto plan = place_layers(devices, link, lm, mode);
  std::string chosen;
  bool same = plan.stages.size() == n;
  for (size_t k = 0; k < plan.stages.size(); ++k) {
    const auto& ps = plan.stages[k];
    const auto& o = setup.stage_opts[static_cast<size_t>(ps.device)];
    same = same && ps.device == static_cast<int32_t>(k) && ps.first_layer == o.layer_first &&
           ps.first_layer + ps.layers == o.layer_end;
    chosen += fmt::format("{}{} [{}..{}]", k ? " -> " : "", devices[size_t(ps.device)].name,
                          ps.first_layer, ps.first_layer + ps.layers - 1);
  }
  spdlog::info("pipeline: placement {} ({}): {}, {:.2f} ms a token ({:.2f} compute + {:.2f} links)",
               placement_mode_name(mode), measured, chosen, 1000 * plan.latency_s(),
               1000 * plan.compute_s, 1000 * plan.link_s);
  if (same) return;
  std::vector<device_actor> stages;
  std::vector<engine_options> stage_opts;
  std::vector<std::string> places;
  try {
    for (const auto& ps : plan.stages) {
      auto so = setup.stage_opts[static_cast<size_t>(ps.device)];
      so.layer_first = ps.first_layer;
      so.layer_end = ps.first_layer + ps.layers;
      const auto& place = setup.places[static_cast<size_t>(ps.device)];
      stages.push_back(spawn_stage(sys, setup.model, so, place));
      stage_opts.push_back(so);
      places.push_back(place);
    }
  } catch (...) {
    for (auto& s : stages) caf::anon_send_exit(s, caf::exit_reason::user_shutdown);
    throw;
  }
  for (auto& s : setup.stages) caf::anon_send_exit(s, caf::exit_reason::user_shutdown);
  setup.stages = std::move(stages);
  setup.stage_opts = std::move(stage_opts);
  setup.places = std::move(places);
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
    throw std::invalid_argument("--pipeline-parallel " + std::to_string(n) +
                                " (engine.pipeline_parallel): more stages than the model's " +
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
  so.pipeline_nodes.clear();  // a stage is one device: its place is the pipeline's to say
  so.expert_devices = 0;
  so.n_pages =
      opts.n_pages > 0
          ? opts.n_pages
          : static_cast<int>(opts.kv_bytes / (layer_page * static_cast<size_t>(hp.n_layer)));
  if (so.n_pages <= 0) throw std::invalid_argument("KV arena holds no page; raise kv_bytes");
  // Where each stage runs: engine.pipeline_nodes, one entry per stage,
  // "local" or a troupe node's address; none: every stage here.
  pipeline_setup setup;
  setup.places = opts.pipeline_nodes;
  if (setup.places.empty()) setup.places.assign(static_cast<size_t>(n), "local");
  if (setup.places.size() != static_cast<size_t>(n))
    throw std::invalid_argument("engine.pipeline_nodes names " +
                                std::to_string(setup.places.size()) + " places for " +
                                std::to_string(n) + " stages (--pipeline-parallel): one per stage");
  const int local = static_cast<int>(std::count(setup.places.begin(), setup.places.end(), "local"));
  if (local < n && !opts.settings)
    throw std::invalid_argument("pipeline stages on troupe nodes need the engine's settings");
  // One slice of the device per local stage where it can be split so (a
  // slice of a slice only where it divides evenly: local stage i of slice
  // k is slice k * L + i of the whole device, L the local stages); else every local stage on
  // the whole device.  A stage on a node has the node's device.
  const int units = partition_units(opts.device);
  const bool sliced =
      local >= 2 && units >= local && (opts.device.cores == 0 || units % local == 0);
  setup.model = model;
  setup.layer_page = layer_page;
  auto& stages = setup.stages;
  try {
    for (int i = 0, j = 0; i < n; ++i) {
      std::tie(so.layer_first, so.layer_end) = stage_layers(hp.n_layer, n, i);
      const auto& place = setup.places[static_cast<size_t>(i)];
      if (sliced && place == "local") {
        so.device.cores = units / local;
        so.device.slice = (opts.device.cores > 0 ? opts.device.slice * local : 0) + j++;
      }
      stages.push_back(spawn_stage(sys, model, so, place));
      setup.stage_opts.push_back(so);
      so.device = opts.device;
    }
  } catch (...) {
    for (auto& s : stages) caf::anon_send_exit(s, caf::exit_reason::user_shutdown);
    throw;
  }
  if (opts.pipeline_placement != "even") {
    try {
      place_stages(sys, setup, hp, opts);
    } catch (...) {
      for (auto& s : stages) caf::anon_send_exit(s, caf::exit_reason::user_shutdown);
      throw;
    }
  }
  // What the pipeline holds: the first stage's answer, with every stage's
  // weights, names and page parts.
  auto& info = setup.info;
  std::string names;
  size_t weights = 0;
  caf::scoped_actor self{sys};
  try {
    for (size_t i = 0; i < stages.size(); ++i) {
      std::string error;
      device_info d;
      self->request(stages[i], std::chrono::seconds(60), info_atom::value)
          .receive([&](device_info& x) { d = std::move(x); },
                   [&](caf::error& e) { error = sys.render(e); });
      if (!error.empty())
        throw std::runtime_error("pipeline stage " + std::to_string(i) + ": " + error);
      // A node opens the model by name: it must be this very file.
      if (d.model_fingerprint != model->fingerprint())
        throw std::runtime_error("pipeline stage " + std::to_string(i) + " on " + setup.places[i] +
                                 " loaded another file for " + model->path() + " (fingerprint " +
                                 d.model_fingerprint + ", here " + model->fingerprint() + ")");
      if (i == 0) info = d;
      const auto& place = setup.places[i];
      names += (i ? " | " : "") + (place == "local" ? "" : "node " + place + ": ") + d.device_name;
      weights += d.weight_bytes;
    }
  } catch (...) {
    for (auto& s : stages) caf::anon_send_exit(s, caf::exit_reason::user_shutdown);
    throw;
  }
  // Every stage holds the embedding and the classifier (the first reads
  // tokens, the last makes logits; tied, they are one matrix): device
  // memory, summed.
  info.device_name = "pipeline of " + std::to_string(stages.size()) + " stage" +
                     (stages.size() == 1 ? "" : "s") + ": " + names;
  info.weight_bytes = weights;
  info.kv_bytes_per_page = layer_page * static_cast<size_t>(hp.n_layer);
  info.kv_dtype = opts.kv_f16 ? "f16" : "f32";
  // Detached: a layer move loads stages and waits for their pages.
  return sys.spawn<caf::detached>(pipeline_behavior, std::move(setup));
}

}  // namespace troupe
