#include "runtime/service/cluster_state.hpp"

#include <algorithm>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

namespace troupe {

using json = nlohmann::json;

namespace {

// An integer field clamped to T's range (a huge or negative value in a
// record must not wrap); 0 when missing or not an integer.
template <class T>
T number_or_zero(const json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_number_integer()) return T{0};
  constexpr auto lo = std::numeric_limits<T>::lowest();
  constexpr auto hi = std::numeric_limits<T>::max();
  if (it->is_number_unsigned()) {
    const uint64_t v = it->get<uint64_t>();
    return v > uint64_t(hi) ? hi : T(v);
  }
  const int64_t v = it->get<int64_t>();
  if (v < 0 && std::is_unsigned_v<T>) return T{0};
  if (!std::is_unsigned_v<T> && v < int64_t(lo)) return lo;
  if (v > 0 && uint64_t(v) > uint64_t(hi)) return hi;
  return T(v);
}

bool clean_text(const std::string& s, size_t most) {
  if (s.empty() || s.size() > most) return false;
  for (unsigned char c : s)
    if (c < ' ' || c == 0x7f) return false;
  return true;
}

}  // namespace

json to_json(const node_load& l) {
  return {{"instances", l.instances},
          {"running", l.running},
          {"waiting", l.waiting},
          {"used_pages", l.used_pages},
          {"total_pages", l.total_pages},
          {"kv_host_pages", l.kv_host_pages},
          {"kv_disk_pages", l.kv_disk_pages},
          {"kv_hits", l.kv_hits},
          {"kv_misses", l.kv_misses}};
}

node_load node_load_from(const json& j) {
  node_load l;
  if (!j.is_object()) return l;
  l.instances = number_or_zero<int32_t>(j, "instances");
  l.running = number_or_zero<int64_t>(j, "running");
  l.waiting = number_or_zero<int64_t>(j, "waiting");
  l.used_pages = number_or_zero<int64_t>(j, "used_pages");
  l.total_pages = number_or_zero<int64_t>(j, "total_pages");
  l.kv_host_pages = number_or_zero<int64_t>(j, "kv_host_pages");
  l.kv_disk_pages = number_or_zero<int64_t>(j, "kv_disk_pages");
  l.kv_hits = number_or_zero<uint64_t>(j, "kv_hits");
  l.kv_misses = number_or_zero<uint64_t>(j, "kv_misses");
  return l;
}

std::string registry_services_prefix(const std::string& cluster_fingerprint) {
  return "/troupe/" + cluster_fingerprint + "/services/";
}

std::string to_registry_value(const service_record& r) {
  return json{{"id", r.id},           {"endpoints", r.endpoints},
              {"model", r.model},     {"instances", r.instances},
              {"serving", r.serving}, {"running", r.running},
              {"waiting", r.waiting}, {"in_flight", r.in_flight}}
      .dump();
}

std::optional<service_record> parse_service_record(const std::string& value, std::string* why) {
  auto fail = [&](const std::string& w) -> std::optional<service_record> {
    if (why) *why = w;
    return std::nullopt;
  };
  if (value.size() > (64u << 10)) return fail("larger than 64 KiB");
  json j = json::parse(value, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return fail("not a JSON object");
  service_record r;
  auto id = j.find("id");
  if (id == j.end() || !id->is_string() || !clean_text(id->get<std::string>(), 64))
    return fail("no id");
  r.id = id->get<std::string>();
  auto eps = j.find("endpoints");
  if (eps == j.end() || !eps->is_array() || eps->empty() || eps->size() > 16)
    return fail("no endpoints (1 to 16)");
  for (const auto& e : *eps) {
    if (!e.is_string() || !clean_text(e.get<std::string>(), 255))
      return fail("an endpoint is not a short printable string");
    r.endpoints.push_back(e.get<std::string>());
  }
  if (auto m = j.find("model");
      m != j.end() && m->is_string() && clean_text(m->get<std::string>(), 255))
    r.model = m->get<std::string>();
  r.instances = number_or_zero<int32_t>(j, "instances");
  r.serving = number_or_zero<int32_t>(j, "serving");
  r.running = number_or_zero<int64_t>(j, "running");
  r.waiting = number_or_zero<int64_t>(j, "waiting");
  r.in_flight = number_or_zero<int64_t>(j, "in_flight");
  return r;
}

std::string dialable_endpoint(const std::string& bound, const std::string& host) {
  const std::string tcp = "tcp://";
  if (bound.rfind(tcp, 0) != 0 || host.empty()) return bound;
  const size_t colon = bound.rfind(':');
  if (colon == std::string::npos || colon < tcp.size()) return bound;
  const std::string h = bound.substr(tcp.size(), colon - tcp.size());
  if (h != "0.0.0.0" && h != "*" && h != "[::]" && h != "::") return bound;
  return tcp + host + bound.substr(colon);
}

std::vector<std::string> rank_service_endpoints(std::vector<service_record> services) {
  auto load = [](const service_record& s) {
    return s.serving > 0 ? double(std::max<int64_t>(0, s.in_flight)) / s.serving : 1e300;
  };
  std::stable_sort(services.begin(), services.end(),
                   [&](const service_record& a, const service_record& b) {
                     const double la = load(a), lb = load(b);
                     return la != lb ? la < lb : a.id < b.id;
                   });
  std::vector<std::string> out;
  std::set<std::string> seen;
  for (const auto& s : services)
    for (const auto& e : s.endpoints)
      if (seen.insert(e).second) out.push_back(e);
  return out;
}

}  // namespace troupe
