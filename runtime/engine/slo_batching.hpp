#pragma once
// SLO- and output-driven batching (UELLM's SLO-ODBS, the thesis's
// Algorithm 3-1, issue 36 item 2), with the output-length predictor it
// feeds on: plain functions, called by the static-batch simulator (troupe
// bench static-batch) and tested on synthetic requests.
//
// Static batching is where the thesis's effect exists: a static batch runs
// until its longest output is done, so a batch mixing short and long
// outputs computes padding for the short ones, and a request returns only
// when its batch does.  Grouping by predicted output length cuts the
// padding; ordering by SLO serves the tight deadlines first.
//
// The predictor buckets output lengths as the thesis's classifier does:
// [0,8), [8,16), [16,32), ..., [1024,2048), and [2048, inf).  It learns
// online from finished requests, per prompt class (the caller's key: an
// application, a template, a prompt's first words), and predicts the
// class's most frequent bucket (the global one for an unseen class).
//
// The batching rule (REFERENCES.md 7.1, with its corrections): requests
// sorted by SLO ascending; a request joins the first batch (in the order
// they opened) that has room and where
//   w1 * |slo - L_CM| * (n + 1) * L1 + w2 * |len - O_CM| * (n + 1) * L2
// is at most the threshold (n: the batch's size, L_CM / O_CM: its largest
// SLO and predicted length so far, L1 / L2 scale seconds and tokens to
// one unit), else it opens a batch of its own.  Batches run in the order
// they opened, so the most urgent request's batch runs first.  The printed
// algorithm only ever compares a request with the batch before it (which,
// after the SLO sort, makes a batch of nearly every request when lengths
// are mixed: measured, 997 batches for 1000 requests); first fit is the
// grouping its text describes.  It adds SLOs where the equation subtracts
// lengths; both terms are spreads here, so a batch holds requests alike in
// deadline and in length.  w2 = 0 is SLO-DBS, w1 = 0 ODBS (the thesis swaps the two
// names).  Baselines: FIFO (arrival order), length-only (S3-like: sorted
// by predicted length) and SLO-only (sorted by SLO), each cut into batches
// of max_batch.
#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace troupe {

constexpr int kLengthBuckets = 10;  // [0,8) .. [1024,2048), [2048, inf)
// Classes a predictor keeps apart at most; later new ones share the
// global counts (the names come from clients: their number is theirs).
constexpr size_t kMaxLengthClasses = 4096;
int length_bucket(int64_t tokens);
// The tokens a bucket stands for when planning: its upper bound (4096 for
// the last), so a prediction errs on the long side within its bucket.
int32_t bucket_tokens(int bucket);

class output_length_predictor {
 public:
  // The predicted bucket for a prompt of class `cls` (the class's most
  // frequent bucket, ties to the longer; the global one for a class not
  // seen; `fallback` before anything is seen).
  int predict(const std::string& cls, int fallback = 4) const;
  // A finished request: scores the prediction made for it, then learns.
  void observe(const std::string& cls, int predicted_bucket, int64_t actual_tokens);
  // Share of observed requests whose predicted bucket was right.
  double bucket_accuracy() const { return observed_ ? double(correct_) / observed_ : 0.0; }
  uint64_t observed() const { return observed_; }
  uint64_t right() const { return correct_; }  // observed ones predicted in the right bucket
  size_t classes() const { return by_class_.size(); }

 private:
  using counts = std::array<uint64_t, kLengthBuckets>;
  static int mode_of(const counts& c);
  std::unordered_map<std::string, counts> by_class_;
  counts all_{};
  uint64_t observed_ = 0, correct_ = 0;
};

enum class batch_order { fifo, length, slo, slo_odbs };
const char* to_string(batch_order o);
std::optional<batch_order> parse_batch_order(std::string_view name);

struct batch_candidate {
  uint64_t id = 0;
  double slo_s = 0;              // its deadline, seconds from now
  int32_t predicted_tokens = 0;  // predicted output length
};

struct odbs_params {
  double w1 = 1, w2 = 1;   // weights of the SLO and length spreads
  double l1 = 0, l2 = 0;   // unit scales (0: 1 / the median |SLO|, 1 / the median length)
  double threshold = 1.0;  // a request joins while the cost is at most this
  int32_t max_batch = 8;   // never more in one batch
  // After grouping, fill each group up to max_batch with later requests
  // (in SLO order) predicted no longer than its longest member.  Without
  // padding (troupe's batches: a finished row frees at once) they do not
  // lengthen the group, and its empty rows would otherwise idle; the
  // thesis's algorithm (off) leaves groups as formed.
  bool fill = false;
};

// `queue` in arrival order -> batches of ids, the first to run first.
std::vector<std::vector<uint64_t>> plan_batches(const std::vector<batch_candidate>& queue,
                                                batch_order order, const odbs_params& p);

}  // namespace troupe
