#include "tools/troupe/shell_view.hpp"

#include <algorithm>
#include <cstdio>

namespace troupe::cli {

namespace {

using json = nlohmann::json;

std::string text(const json& v) {
  if (v.is_null()) return "-";
  if (v.is_string()) return v.get<std::string>();
  if (v.is_number_float()) {
    // Shares and rates (below 10) keep three decimals, times one.
    const double x = v.get<double>();
    char buf[32];
    std::snprintf(buf, sizeof buf, x > -10 && x < 10 ? "%.3f" : "%.1f", x);
    return buf;
  }
  return v.dump();
}

std::string field(const json& row, const char* key) {
  auto it = row.find(key);
  return it == row.end() ? "-" : text(*it);
}

bool numeric(const std::string& s) {
  return s.find_first_of("0123456789") != std::string::npos &&
         s.find_first_not_of("0123456789.-/%") == std::string::npos;
}

std::string fixed(double x, int digits) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.*f", digits, x);
  return buf;
}

}  // namespace

std::string render_table(const std::vector<std::string>& headers,
                         const std::vector<std::vector<std::string>>& rows) {
  std::vector<size_t> width(headers.size());
  for (size_t c = 0; c < headers.size(); ++c) width[c] = headers[c].size();
  for (const auto& r : rows)
    for (size_t c = 0; c < r.size() && c < width.size(); ++c)
      width[c] = std::max(width[c], r[c].size());
  auto line = [&](const std::vector<std::string>& cells, bool header) {
    std::string out;
    for (size_t c = 0; c < width.size(); ++c) {
      const std::string cell = c < cells.size() ? cells[c] : "";
      const std::string pad(width[c] - cell.size(), ' ');
      out += (!header && numeric(cell)) ? pad + cell : cell + pad;
      out += c + 1 < width.size() ? "  " : "";
    }
    while (!out.empty() && out.back() == ' ') out.pop_back();
    return out + "\n";
  };
  std::string out = line(headers, true);
  for (const auto& r : rows) out += line(r, false);
  if (rows.empty()) out += "(none)\n";
  return out;
}

std::string render_instances(const json& instances) {
  std::vector<std::vector<std::string>> rows;
  for (const auto& i : instances) {
    const auto& kv = i.value("kv", json::object());
    const double steps = i.value("steps", 0.0);
    rows.push_back(
        {field(i, "id"), field(i, "node"), field(i, "role"), field(i, "pool"), field(i, "state"),
         field(i, "waiting"), field(i, "running"), field(i, "queued_prefill_tokens"),
         field(kv, "used_pages") + "/" + field(kv, "total_pages"), field(kv, "free_pages"),
         steps > 0 ? fixed(i.value("step_ms", 0.0) / steps, 1) : "-"});
  }
  return render_table({"ID", "NODE", "ROLE", "POOL", "STATE", "WAITING", "RUNNING", "QUEUED_TOKENS",
                       "KV_USED", "KV_FREE", "STEP_MS"},
                      rows);
}

std::string render_requests(const json& requests) {
  std::vector<std::vector<std::string>> rows;
  for (const auto& r : requests)
    rows.push_back({field(r, "id"), field(r, "state"), field(r, "class"), field(r, "instance"),
                    field(r, "prompt_tokens"), field(r, "completion_tokens"),
                    r.value("completion_tokens", 0) > 0 ? fixed(r.value("ttft_ms", 0.0), 1) : "-",
                    fixed(r.value("age_ms", 0.0) / 1000, 1), field(r, "migrations"),
                    field(r, "recoveries")});
  return render_table({"ID", "STATE", "CLASS", "INSTANCE", "PROMPT", "GENERATED", "TTFT_MS",
                       "AGE_S", "MIGRATIONS", "RECOVERIES"},
                      rows);
}

std::string render_nodes(const json& nodes) {
  std::vector<std::vector<std::string>> rows;
  for (const auto& n : nodes) {
    std::string ids;
    for (const auto& i : n.value("instances", json::array())) {
      if (!ids.empty()) ids += ',';
      ids += text(i);
    }
    rows.push_back({field(n, "address"), field(n, "state"), ids.empty() ? "-" : ids,
                    field(n, "cores"),
                    fixed(n.value("mem_available", 0.0) / double(1u << 30), 1) + "/" +
                        fixed(n.value("mem_total", 0.0) / double(1u << 30), 1),
                    n.value("error", std::string()).empty() ? "-" : field(n, "error")});
  }
  return render_table({"ADDRESS", "STATE", "INSTANCES", "CORES", "MEM_GIB", "ERROR"}, rows);
}

std::string render_kv(const json& kv) {
  const double total = kv.value("total_pages", 0.0);
  std::vector<std::vector<std::string>> rows;
  for (const char* state : {"free_pages", "reusable_pages", "used_pages"}) {
    const double n = kv.value(state, 0.0);
    rows.push_back({std::string(state).substr(0, std::string(state).size() - 6), field(kv, state),
                    total > 0 ? fixed(100 * n / total, 1) + "%" : "-"});
  }
  std::string out = render_table({"PAGES", "COUNT", "SHARE"}, rows);
  out += "total " + field(kv, "total_pages") + " pages of " + field(kv, "page_size") +
         " tokens; prefix hit rate " + fixed(100 * kv.value("prefix_hit_rate", 0.0), 1) +
         "%; sequences " + field(kv, "sequences") + "\n";
  // The KV store's tiers, per process that has one.
  std::vector<std::vector<std::string>> tiers;
  for (const auto& st : kv.value("stores", json::array()))
    for (const auto& t : st.value("tiers", json::array()))
      tiers.push_back({st.value("node", ""), t.value("tier", ""), field(t, "pages"),
                       fixed(t.value("bytes", 0.0) / 1048576.0, 1) + "/" +
                           fixed(t.value("budget_bytes", 0.0) / 1048576.0, 0) + " MiB",
                       field(t, "hits"), field(t, "misses"), field(t, "evictions")});
  if (!tiers.empty())
    out += render_table({"NODE", "TIER", "PAGES", "HELD", "HITS", "MISSES", "EVICTED"}, tiers) +
           "spilled " + field(kv, "spilled_pages") + " pages from the arenas, loaded back " +
           field(kv, "loaded_pages") + "\n";
  return out;
}

std::string render_fields(const json& j, const std::string& indent) {
  std::string out;
  if (j.is_array()) {
    if (j.empty()) return indent + "(none)\n";
    for (const auto& el : j) out += render_fields(el, indent) + "\n";
    return out;
  }
  if (!j.is_object()) return indent + text(j) + "\n";
  for (const auto& [k, v] : j.items()) {
    if (v.is_object())
      out += indent + k + ":\n" + render_fields(v, indent + "  ");
    else
      out += indent + k + ": " + (v.is_array() ? v.dump() : text(v)) + "\n";
  }
  return out;
}

std::string render_dp(const json& dp) {
  json head = dp;
  head.erase("replicas");
  std::vector<std::vector<std::string>> rows;
  for (const auto& r : dp.value("replicas", json::array()))
    rows.push_back({field(r, "instance"), field(r, "state"), field(r, "kv_tokens"),
                    field(r, "capacity_tokens"), field(r, "sequences"), field(r, "admitted"),
                    field(r, "moved_in"), field(r, "moved_out"), field(r, "wait_ms"),
                    field(r, "dummy_steps")});
  return render_fields(head) + render_table({"INSTANCE", "STATE", "KV_TOKENS", "CAPACITY", "SEQS",
                                             "ADMITTED", "IN", "OUT", "WAIT_MS", "DUMMY"},
                                            rows);
}

std::string render_experts(const json& experts) {
  json head = experts;
  head.erase("layers");
  std::vector<std::vector<std::string>> rows;
  for (const auto& l : experts.value("layers", json::array())) {
    std::string placement;
    for (const auto& d : l.value("placement", json::array())) {
      if (!placement.empty()) placement += " | ";
      bool first = true;
      for (const auto& e : d) {
        if (!first) placement += ',';
        placement += e.dump();
        first = false;
      }
    }
    std::string load;
    for (const auto& x : l.value("device_load", json::array())) {
      if (!load.empty()) load += '/';
      load += fixed(x.get<double>(), 0);
    }
    rows.push_back({field(l, "layer"), field(l, "imbalance"), load, placement});
  }
  return render_fields(head) +
         render_table({"LAYER", "IMBALANCE", "TOKENS_PER_DEVICE", "EXPERTS_PER_DEVICE"}, rows);
}

json headline_metrics(const json& instances, const json& requests) {
  int64_t serving = 0, running = 0, waiting = 0, used = 0, total = 0, steps = 0, prefill = 0,
          decode = 0, preempted = 0, migrations = 0, recoveries = 0;
  double hits = 0, queries = 0;
  for (const auto& i : instances) {
    serving += i.value("state", "") == "serving" ? 1 : 0;
    running += i.value("running", 0);
    waiting += i.value("waiting", 0);
    steps += i.value("steps", 0);
    prefill += i.value("prefill_tokens", 0);
    decode += i.value("decode_tokens", 0);
    preempted += i.value("preempted_recompute", 0) + i.value("preempted_swap", 0);
    const auto& kv = i.value("kv", json::object());
    used += kv.value("used_pages", 0);
    total += kv.value("total_pages", 0);
    hits += kv.value("prefix_hit_tokens", 0.0);
    queries += kv.value("prefix_query_tokens", 0.0);
  }
  for (const auto& r : requests) {
    migrations += r.value("migrations", 0);
    recoveries += r.value("recoveries", 0);
  }
  return {{"instances", instances.size()},
          {"instances_serving", serving},
          {"requests_in_flight", requests.size()},
          {"sequences_running", running},
          {"sequences_waiting", waiting},
          {"kv_used_pages", used},
          {"kv_total_pages", total},
          {"kv_utilization", total > 0 ? double(used) / double(total) : 0.0},
          {"prefix_hit_rate", queries > 0 ? hits / queries : 0.0},
          {"steps", steps},
          {"prefill_tokens", prefill},
          {"decode_tokens", decode},
          {"preemptions", preempted},
          {"in_flight_migrations", migrations},
          {"in_flight_recoveries", recoveries}};
}

std::string nearest(const std::string& word, const std::vector<std::string>& valid) {
  std::string best;
  size_t best_d = 4;
  for (const auto& v : valid) {
    // Levenshtein distance, one row at a time.
    std::vector<size_t> row(v.size() + 1);
    for (size_t j = 0; j <= v.size(); ++j) row[j] = j;
    for (size_t i = 1; i <= word.size(); ++i) {
      size_t diag = row[0];
      row[0] = i;
      for (size_t j = 1; j <= v.size(); ++j) {
        const size_t up = row[j];
        row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (word[i - 1] == v[j - 1] ? 0 : 1)});
        diag = up;
      }
    }
    if (row[v.size()] < best_d) best_d = row[v.size()], best = v;
  }
  return best;
}

}  // namespace troupe::cli
