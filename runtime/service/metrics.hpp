#pragma once
// A small metrics registry that renders the Prometheus text format
// (docs/architecture.md §2.2 "Processes, threads and boundaries"): counters,
// gauges and histograms, each a family of series told apart by their labels.
// Pure and thread-safe: request actors, the stats poller and the HTTP thread
// all use one registry at once.
#include <cstdint>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace troupe {

using metric_labels = std::vector<std::pair<std::string, std::string>>;

class metrics_registry {
 public:
  // Adds `v` (>= 0) to a counter.
  void counter_add(const std::string& name, const std::string& help, const metric_labels& labels,
                   double v = 1);
  // Sets a counter to a total kept elsewhere (an actor's own counter).
  void counter_set(const std::string& name, const std::string& help, const metric_labels& labels,
                   double v);
  void gauge_set(const std::string& name, const std::string& help, const metric_labels& labels,
                 double v);
  // Observes `v` in a histogram with the given upper bounds (ascending; +Inf
  // is implied).  The bounds are fixed by the family's first observation.
  void observe(const std::string& name, const std::string& help, const std::vector<double>& bounds,
               double v);

  // Declares a family before anything is recorded, so it is listed (with
  // zero samples: a histogram's buckets at 0; a counter family with no
  // labels at 0, one with labels with no series yet).
  void declare_counter(const std::string& name, const std::string& help, bool labelled);
  void declare_histogram(const std::string& name, const std::string& help,
                         const std::vector<double>& bounds);

  // Drops every series with a `label` whose value is not in `live` (an
  // instance or node that is gone: its series would be served forever).
  void keep_only(const std::string& label, const std::set<std::string>& live);
  // Drops every series of a family but those with the `live` label sets
  // (a family set whole at each poll: an instance's old role).
  void keep_series(const std::string& name, const std::vector<metric_labels>& live);

  // Every family in the text format, version 0.0.4.
  std::string render() const;

  // A counter's or gauge's value, or a histogram's count; 0 when absent.
  double value(const std::string& name, const metric_labels& labels = {}) const;

 private:
  enum class kind { counter, gauge, histogram };
  struct series {
    double value = 0;
    std::vector<uint64_t> buckets;  // per bound, not cumulative
    double sum = 0;
    uint64_t count = 0;
  };
  struct family {
    kind k = kind::counter;
    std::string help;
    std::vector<double> bounds;
    std::map<std::string, series> by_labels;  // rendered label set -> series
  };
  family& get(const std::string& name, kind k, const std::string& help);

  mutable std::mutex mu_;
  std::map<std::string, family> families_;
};

// Histogram bounds in seconds for request latencies (1 ms .. 60 s).
const std::vector<double>& latency_buckets();

}  // namespace troupe
