#include "runtime/service/metrics.hpp"

#include <cmath>
#include <cstdio>
#include <stdexcept>

namespace troupe {

namespace {

std::string escape(const std::string& s, bool quote) {
  std::string out;
  for (char c : s) {
    if (c == '\\')
      out += "\\\\";
    else if (c == '\n')
      out += "\\n";
    else if (c == '"' && quote)
      out += "\\\"";
    else
      out += c;
  }
  return out;
}

bool valid_name(const std::string& n) {
  if (n.empty() || (n[0] >= '0' && n[0] <= '9')) return false;
  for (char c : n)
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
          c == ':'))
      return false;
  return true;
}

std::string render_labels(const metric_labels& labels) {
  std::string out;
  for (const auto& [k, v] : labels) {
    if (!valid_name(k) || k.find(':') != std::string::npos)
      throw std::invalid_argument("metrics: bad label name '" + k + "'");
    out += (out.empty() ? "" : ",") + k + "=\"" + escape(v, true) + "\"";
  }
  return out;
}

std::string number(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  char buf[64];
  if (v == std::floor(v) && std::fabs(v) < 1e15)
    std::snprintf(buf, sizeof buf, "%.0f", v);
  else
    std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}

// name{labels} value, with `extra` (le="...") joined to the labels.
void line(std::string& out, const std::string& name, const std::string& labels,
          const std::string& extra, double v) {
  out.append(name);
  if (!labels.empty() || !extra.empty()) {
    out.push_back('{');
    out.append(labels);
    if (!labels.empty() && !extra.empty()) out.push_back(',');
    out.append(extra);
    out.push_back('}');
  }
  out.push_back(' ');
  out.append(number(v));
  out.push_back('\n');
}

}  // namespace

metrics_registry::family& metrics_registry::get(const std::string& name, kind k,
                                                const std::string& help) {
  if (!valid_name(name)) throw std::invalid_argument("metrics: bad metric name '" + name + "'");
  auto [it, fresh] = families_.try_emplace(name);
  if (fresh) {
    it->second.k = k;
    it->second.help = help;
  } else if (it->second.k != k) {
    throw std::invalid_argument("metrics: " + name + " is already a metric of another type");
  }
  return it->second;
}

void metrics_registry::counter_add(const std::string& name, const std::string& help,
                                   const metric_labels& labels, double v) {
  if (!(v >= 0)) throw std::invalid_argument("metrics: counter " + name + " cannot go down");
  const auto key = render_labels(labels);
  std::lock_guard lock(mu_);
  get(name, kind::counter, help).by_labels[key].value += v;
}

void metrics_registry::counter_set(const std::string& name, const std::string& help,
                                   const metric_labels& labels, double v) {
  const auto key = render_labels(labels);
  std::lock_guard lock(mu_);
  get(name, kind::counter, help).by_labels[key].value = v;
}

void metrics_registry::gauge_set(const std::string& name, const std::string& help,
                                 const metric_labels& labels, double v) {
  const auto key = render_labels(labels);
  std::lock_guard lock(mu_);
  get(name, kind::gauge, help).by_labels[key].value = v;
}

void metrics_registry::observe(const std::string& name, const std::string& help,
                               const std::vector<double>& bounds, double v) {
  std::lock_guard lock(mu_);
  auto& f = get(name, kind::histogram, help);
  if (f.by_labels.empty()) {
    for (size_t i = 1; i < bounds.size(); ++i)
      if (!(bounds[i - 1] < bounds[i]))
        throw std::invalid_argument("metrics: " + name + ": bounds must ascend");
    f.bounds = bounds;
  }
  auto& s = f.by_labels[""];  // declared (bounds fixed) or the first observation
  s.buckets.resize(f.bounds.size());
  for (size_t i = 0; i < f.bounds.size(); ++i)
    if (v <= f.bounds[i]) {
      ++s.buckets[i];
      break;
    }
  s.sum += v;
  ++s.count;
}

void metrics_registry::declare_counter(const std::string& name, const std::string& help,
                                       bool labelled) {
  std::lock_guard lock(mu_);
  auto& f = get(name, kind::counter, help);
  if (!labelled) f.by_labels[""];
}

void metrics_registry::declare_histogram(const std::string& name, const std::string& help,
                                         const std::vector<double>& bounds) {
  std::lock_guard lock(mu_);
  auto& f = get(name, kind::histogram, help);
  if (!f.by_labels.empty()) return;
  for (size_t i = 1; i < bounds.size(); ++i)
    if (!(bounds[i - 1] < bounds[i]))
      throw std::invalid_argument("metrics: " + name + ": bounds must ascend");
  f.bounds = bounds;
  f.by_labels[""].buckets.resize(bounds.size());
}

std::string metrics_registry::render() const {
  std::lock_guard lock(mu_);
  std::string out;
  for (const auto& [name, f] : families_) {
    static const char* types[] = {"counter", "gauge", "histogram"};
    out += "# HELP " + name + " " + escape(f.help, false) + "\n";
    out += "# TYPE " + name + " " + types[static_cast<int>(f.k)] + "\n";
    for (const auto& [labels, s] : f.by_labels) {
      if (f.k != kind::histogram) {
        line(out, name, labels, "", s.value);
        continue;
      }
      uint64_t cum = 0;
      for (size_t i = 0; i < f.bounds.size(); ++i) {
        cum += i < s.buckets.size() ? s.buckets[i] : 0;
        line(out, name + "_bucket", labels, "le=\"" + number(f.bounds[i]) + "\"",
             static_cast<double>(cum));
      }
      line(out, name + "_bucket", labels, "le=\"+Inf\"", static_cast<double>(s.count));
      line(out, name + "_sum", labels, "", s.sum);
      line(out, name + "_count", labels, "", static_cast<double>(s.count));
    }
  }
  return out;
}

void metrics_registry::keep_only(const std::string& label, const std::set<std::string>& live) {
  // Series are keyed by their rendered labels: `label="value"` after the
  // start or a comma, the value escaped as render_labels escapes it.
  std::set<std::string> kept;
  for (const auto& v : live) kept.insert(label + "=\"" + escape(v, true) + "\"");
  const std::string head = label + "=\"";
  const std::lock_guard<std::mutex> lock(mu_);
  for (auto& [name, f] : families_)
    for (auto it = f.by_labels.begin(); it != f.by_labels.end();) {
      const std::string& key = it->first;
      size_t at = key.rfind(head, 0) == 0 ? 0 : key.find("," + head);
      if (at == std::string::npos) {
        ++it;
        continue;
      }
      if (at != 0) ++at;  // past the comma
      // The value ends at the first quote no backslash escapes.
      size_t end = at + head.size();
      while (end < key.size() && key[end] != '"') end += key[end] == '\\' ? 2 : 1;
      const bool live_one = kept.count(key.substr(at, end + 1 - at)) > 0;
      it = live_one ? std::next(it) : f.by_labels.erase(it);
    }
}

void metrics_registry::keep_series(const std::string& name,
                                   const std::vector<metric_labels>& live) {
  std::set<std::string> kept;
  for (const auto& l : live) kept.insert(render_labels(l));
  const std::lock_guard<std::mutex> lock(mu_);
  auto f = families_.find(name);
  if (f == families_.end()) return;
  auto& series = f->second.by_labels;
  for (auto it = series.begin(); it != series.end();)
    it = kept.count(it->first) ? std::next(it) : series.erase(it);
}

double metrics_registry::value(const std::string& name, const metric_labels& labels) const {
  const auto key = render_labels(labels);
  std::lock_guard lock(mu_);
  auto it = families_.find(name);
  if (it == families_.end()) return 0;
  auto s = it->second.by_labels.find(key);
  if (s == it->second.by_labels.end()) return 0;
  return it->second.k == kind::histogram ? static_cast<double>(s->second.count) : s->second.value;
}

const std::vector<double>& latency_buckets() {
  static const std::vector<double> b{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                                     0.5,   1,      2.5,   5,    10,    30,   60};
  return b;
}

}  // namespace troupe
