#include "runtime/device/layer_placement.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>
#include <stdexcept>

namespace troupe {

namespace {

constexpr int kMaxDevices = 16;  // Held-Karp's table: 2^16 x 16 entries
constexpr double kInf = std::numeric_limits<double>::infinity();
// Bounds that keep every latency sum finite (16 hops, 1e6 layers).
constexpr double kMaxSeconds = 1e6;
constexpr int32_t kMaxLayers = 1000000;

struct mode_weights {
  double latency;
  double devices;
};

mode_weights weights_of(placement_mode m) {
  switch (m) {
    case placement_mode::he:
      return {0.0, 1.0};
    case placement_mode::lr:
      return {1.0, 0.0};  // latency alone; ties to fewer devices
    case placement_mode::helr:
      break;
  }
  return {1.0, 1.0};
}

// The best split of `model.layers` over the devices of `mask` (one layer
// each, the rest to the fastest with room): each device's layer count, and
// the compute time; empty counts when the set cannot hold the model.
struct split {
  std::vector<int32_t> layers;  // by device index, 0 outside the set
  double compute_s = kInf;
};

split split_layers(uint32_t mask, const std::vector<int32_t>& capacity,
                   const std::vector<placement_device>& devices, int32_t total_layers) {
  split s;
  std::vector<int> members;
  int64_t room = 0;
  for (int i = 0; i < static_cast<int>(devices.size()); ++i)
    if (mask & (1u << i)) {
      if (capacity[i] < 1) return s;
      members.push_back(i);
      room += capacity[i];
    }
  if (members.empty() || room < total_layers || static_cast<int32_t>(members.size()) > total_layers)
    return s;
  std::stable_sort(members.begin(), members.end(), [&](int a, int b) {
    return devices[a].seconds_per_layer < devices[b].seconds_per_layer;
  });
  s.layers.assign(devices.size(), 0);
  int32_t left = total_layers - static_cast<int32_t>(members.size());
  for (int i : members) {
    const int32_t extra = std::min(left, capacity[i] - 1);
    s.layers[i] = 1 + extra;
    left -= extra;
  }
  s.compute_s = 0;
  for (int i : members) s.compute_s += s.layers[i] * devices[i].seconds_per_layer;
  return s;
}

void check_input(const std::vector<placement_device>& devices,
                 const std::vector<std::vector<double>>& link_s, const layer_model& model) {
  if (devices.empty()) throw std::invalid_argument("layer placement: no device given");
  if (devices.size() > kMaxDevices)
    throw std::invalid_argument("layer placement: " + std::to_string(devices.size()) +
                                " devices given, at most " + std::to_string(kMaxDevices));
  if (model.layers < 1) throw std::invalid_argument("layer placement: the model has no layer");
  if (model.layers > kMaxLayers)
    throw std::invalid_argument("layer placement: more than " + std::to_string(kMaxLayers) +
                                " layers");
  if (!(model.layer_bytes > 0) || !(model.kv_reserve_bytes >= 0) ||
      !std::isfinite(model.layer_bytes) || !std::isfinite(model.kv_reserve_bytes))
    throw std::invalid_argument(
        "layer placement: layer_bytes must be positive and kv_reserve_bytes not negative");
  for (const auto& d : devices)
    if (!(d.memory_bytes >= 0) || !(d.seconds_per_layer > 0) || !std::isfinite(d.memory_bytes) ||
        !(d.seconds_per_layer <= kMaxSeconds))
      throw std::invalid_argument("layer placement: device '" + d.name +
                                  "' needs memory >= 0 and 0 < seconds_per_layer <= 1e6");
  if (link_s.size() != devices.size())
    throw std::invalid_argument("layer placement: the link matrix has " +
                                std::to_string(link_s.size()) + " rows for " +
                                std::to_string(devices.size()) + " devices");
  for (const auto& row : link_s) {
    if (row.size() != devices.size())
      throw std::invalid_argument("layer placement: the link matrix is not square");
    for (double v : row)
      if (!(v >= 0) || !(v <= kMaxSeconds))
        throw std::invalid_argument("layer placement: link latencies must be 0 to 1e6 s");
  }
}

std::string no_fit_message(const std::vector<placement_device>& devices,
                           const std::vector<int32_t>& capacity, const layer_model& model) {
  std::ostringstream o;
  o << "no set of devices holds the model: " << model.layers << " layers of "
    << model.layer_bytes / (1 << 20) << " MiB, with " << model.kv_reserve_bytes / (1 << 20)
    << " MiB kept for KV on each device; the devices hold";
  int64_t total = 0;
  for (size_t i = 0; i < devices.size(); ++i) {
    o << (i ? ", " : " ") << devices[i].name << " " << capacity[i];
    total += capacity[i];
  }
  o << " layers (" << total << " in all)";
  return o.str();
}

}  // namespace

placement_mode parse_placement_mode(const std::string& text) {
  if (text == "he") return placement_mode::he;
  if (text == "lr") return placement_mode::lr;
  if (text == "helr") return placement_mode::helr;
  throw std::invalid_argument("placement mode '" + text +
                              "' is not one of he (fewest devices), lr (lowest latency), helr "
                              "(balanced)");
}

const char* placement_mode_name(placement_mode m) {
  switch (m) {
    case placement_mode::he:
      return "he";
    case placement_mode::lr:
      return "lr";
    case placement_mode::helr:
      break;
  }
  return "helr";
}

int32_t layer_capacity(const placement_device& d, const layer_model& m) {
  const double free = d.memory_bytes - m.kv_reserve_bytes;
  if (free < m.layer_bytes) return 0;
  return static_cast<int32_t>(std::min<double>(std::floor(free / m.layer_bytes), m.layers));
}

namespace {

// The mode's score of a placement of `latency_s` on `devices` devices.
double score_of(double latency_s, int32_t devices, placement_mode mode, double best_latency_s,
                int32_t fewest_devices) {
  const mode_weights w = weights_of(mode);
  const double lat = best_latency_s > 0 ? latency_s / best_latency_s : 1.0;
  return w.latency * lat + w.devices * static_cast<double>(devices) / std::max(fewest_devices, 1);
}

}  // namespace

double placement_score(const layer_placement& p, placement_mode mode, double best_latency_s,
                       int32_t fewest_devices) {
  return score_of(p.latency_s(), static_cast<int32_t>(p.stages.size()), mode, best_latency_s,
                  fewest_devices);
}

layer_placement place_layers(const std::vector<placement_device>& devices,
                             const std::vector<std::vector<double>>& link_s,
                             const layer_model& model, placement_mode mode) {
  check_input(devices, link_s, model);
  const int n = static_cast<int>(devices.size());
  std::vector<int32_t> capacity(n);
  for (int i = 0; i < n; ++i) capacity[i] = layer_capacity(devices[i], model);

  // Held-Karp: path[mask][last], the shortest path visiting exactly `mask`
  // and ending at `last`, with its predecessor.
  const uint32_t full = 1u << n;
  std::vector<double> path(static_cast<size_t>(full) * n, kInf);
  std::vector<int8_t> prev(static_cast<size_t>(full) * n, -1);
  auto at = [n](uint32_t mask, int last) { return static_cast<size_t>(mask) * n + last; };
  for (int i = 0; i < n; ++i) path[at(1u << i, i)] = 0;
  for (uint32_t mask = 1; mask < full; ++mask)
    for (int last = 0; last < n; ++last) {
      const double here = path[at(mask, last)];
      if (!(mask & (1u << last)) || here == kInf) continue;
      for (int next = 0; next < n; ++next) {
        if (mask & (1u << next)) continue;
        const double via = here + link_s[last][next];
        const size_t k = at(mask | (1u << next), next);
        if (via < path[k]) {
          path[k] = via;
          prev[k] = static_cast<int8_t>(last);
        }
      }
    }

  // Every set that holds the model, with its latency.
  struct candidate {
    uint32_t mask;
    int last;
    double compute_s;
    double link_s;
    int32_t devices;
  };
  std::vector<candidate> feasible;
  double best_latency = kInf;
  int32_t fewest = std::numeric_limits<int32_t>::max();
  for (uint32_t mask = 1; mask < full; ++mask) {
    const split s = split_layers(mask, capacity, devices, model.layers);
    if (s.compute_s == kInf) continue;
    int last = -1;
    for (int i = 0; i < n; ++i)
      if ((mask & (1u << i)) && (last < 0 || path[at(mask, i)] < path[at(mask, last)])) last = i;
    const candidate c{mask, last, s.compute_s, path[at(mask, last)],
                      static_cast<int32_t>(__builtin_popcount(mask))};
    best_latency = std::min(best_latency, c.compute_s + c.link_s);
    fewest = std::min(fewest, c.devices);
    feasible.push_back(c);
  }
  if (feasible.empty()) throw std::runtime_error(no_fit_message(devices, capacity, model));

  auto score = [&](const candidate& c) {
    return score_of(c.compute_s + c.link_s, c.devices, mode, best_latency, fewest);
  };
  // Lowest score; ties (within rounding) to lower latency, then fewer
  // devices, then the lower mask: deterministic.
  const candidate* best = nullptr;
  for (const candidate& c : feasible) {
    if (!best) {
      best = &c;
      continue;
    }
    const double a = score(c), b = score(*best);
    const double eps = 1e-12 * std::max(1.0, std::abs(b));
    if (a < b - eps) {
      best = &c;
    } else if (a <= b + eps) {
      const double la = c.compute_s + c.link_s, lb = best->compute_s + best->link_s;
      if (la < lb - 1e-12 * std::max(1.0, lb) ||
          (std::abs(la - lb) <= 1e-12 * std::max(1.0, lb) && c.devices < best->devices))
        best = &c;
    }
  }

  // The path's order, first stage first.
  std::vector<int> order;
  for (uint32_t mask = best->mask, last = static_cast<uint32_t>(best->last); mask;) {
    order.push_back(static_cast<int>(last));
    const int p = prev[at(mask, static_cast<int>(last))];
    mask &= ~(1u << last);
    // Every set's path is finite (check_input bounds the latencies), so a
    // predecessor exists until the set is used up.
    if (mask && p < 0) throw std::logic_error("layer placement: a path without a predecessor");
    last = static_cast<uint32_t>(p);
  }
  std::reverse(order.begin(), order.end());
  const split s = split_layers(best->mask, capacity, devices, model.layers);
  layer_placement out;
  int32_t first = 0;
  for (int d : order) {
    out.stages.push_back({d, first, s.layers[d]});
    first += s.layers[d];
  }
  out.compute_s = best->compute_s;
  out.link_s = best->link_s;
  return out;
}

}  // namespace troupe
