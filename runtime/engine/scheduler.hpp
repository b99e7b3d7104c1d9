#pragma once
// The instance's step policy (docs/architecture.md §4.3 "One step" and
// §4.5 "Preemption"): which sequences compute how many tokens in the next
// forward pass, which waiting sequences are admitted, and which running ones
// are preempted when the KV arena runs short.  Pure: no actors, no pages, no
// device; the engine (runtime/engine/engine) describes its sequences and applies
// the plan.
#include <cstdint>
#include <string>
#include <vector>

namespace troupe {

// Online requests are latency-bound clients; offline ones are batch jobs
// that yield pages to online ones first.
enum class seq_class : uint8_t { online = 0, offline = 1 };
const char* to_string(seq_class c);

// One sequence as the scheduler sees it.  Its tokens [0, computed) have KV
// (in the arena when running, in the host tier when swapped); tokens
// [computed, total) are still to compute: the prompt's rest while
// prefilling, the last sampled token while decoding (total - computed == 1).
struct sched_seq {
  uint64_t id = 0;
  seq_class cls = seq_class::online;
  uint64_t order = 0;    // arrival order, smaller first; kept across preemption
  int32_t computed = 0;  // a waiting sequence that is not swapped has 0
  int32_t total = 0;     // > computed
  int32_t pages = 0;     // pages its table holds now (0 while waiting)
  bool swapped = false;  // waiting, its first `computed` tokens' KV in the host tier
  // The arena pages its table holds, when known.  Running sequences may
  // share pages (a cached prefix): preempting one frees only the pages no
  // other running sequence holds, and the plan must count exactly those, or
  // it preempts a victim that frees nothing and the step comes up short.
  // Empty: its `pages` are its own.
  std::vector<int32_t> table;
  // Earliest deadline first within the online class (issue 11): the time
  // (any clock, ms) by which its next token is due; 0: none (after every
  // sequence that has one, then arrival order).
  double deadline = 0;
};

struct scheduler_limits {
  int32_t max_batch_tokens = 256;  // rows of one forward pass
  int32_t max_seqs = 64;           // running sequences at once
  int32_t chunk_size = 128;        // most prefill rows of one sequence in one step
  int32_t page_size = 16;
  // Online/offline co-location (xLLM §3.1, issue 11): offline work only
  // takes what online work leaves.  Each step plans online rows first
  // (decode, prefill chunks, admissions), then offline ones with the rest:
  // an offline prefill pauses at its chunk boundary and an offline decode
  // skips steps, both keeping their KV; an online sequence that cannot be
  // admitted (sequence cap or pages) preempts running offline ones.  Off:
  // online-priority admission only, running offline work keeps its rows.
  bool offline_yields = false;
  // With offline_yields: the most offline rows a step takes beside online
  // rows (the instance lowers it while online decodes run slower than
  // their TPOT target, and raises it again when they are fast).
  int32_t offline_rows = 1 << 30;
};

// Returns an empty string when usable, else what is wrong.
std::string validate(const scheduler_limits& lim);

// Rows [start, start + n_tokens) of sequence `id`; `start` is its computed.
struct step_chunk {
  uint64_t id = 0;
  int32_t start = 0;
  int32_t n_tokens = 0;
  bool sample = false;  // reaches total: the last row's logits give the next token
  // Speculative decoding (the instance fills it, never the scheduler): draft
  // tokens verified after a decode row, rows start + 1 .. start + n_tokens - 1;
  // every row's logits are sampled, in order, while they agree.
  std::vector<int32_t> draft;
};

struct step_plan {
  std::vector<uint64_t> preempted;  // running, to preempt before the step, victims in order
  std::vector<uint64_t> admitted;   // waiting, to start now (match a prefix or swap in)
  std::vector<step_chunk> decode;   // running sequences with one token to compute
  std::vector<step_chunk> prefill;  // running prefill chunks, then the admitted ones'
  int32_t tokens = 0;               // rows of the step
  int32_t new_pages = 0;            // pages the step takes from the free ones (swap-ins too)

  bool empty() const { return decode.empty() && prefill.empty(); }
};

// Plans one step.  Decode rows come first, then the running sequences'
// prefill chunks, then new admissions, highest priority first (online
// before offline, then arrival order), within max_batch_tokens rows,
// chunk_size rows per prefill chunk and max_seqs running sequences.
//
// Pages: every scheduled decode row gets its page; when `free_pages` cannot
// cover them, running sequences are preempted, the lowest priority first
// (offline before online, then the most recently arrived), until they fit.
// A victim gives back only the pages no surviving sequence shares (see
// sched_seq::table).
// Prefill chunks shrink to the pages left.  When nothing at all could run,
// victims are preempted until something can.  A plan that preempts admits
// nobody.  Admission is first come first served within priority: it stops
// at the first waiting sequence whose first chunk (and, when swapped, its
// swapped-out pages) does not fit.  An admitted sequence that is not
// swapped is planned from position 0; the instance maps its cached prefix
// and plans again, so the final plan admits nobody and is exact.
step_plan plan_step(const std::vector<sched_seq>& running, const std::vector<sched_seq>& waiting,
                    const scheduler_limits& lim, int32_t free_pages);

// True when `a` runs before `b` (and is preempted after it): online before
// offline, then the earlier deadline (none last), then arrival order.
bool runs_before(const sched_seq& a, const sched_seq& b);

}  // namespace troupe
