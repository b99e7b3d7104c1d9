#include "tools/troupe/cluster_view.hpp"

#include <set>
#include <stdexcept>

#include "net/etcd_client.hpp"
#include "runtime/common/user_text.hpp"
#include "runtime/config/settings.hpp"

namespace troupe::cli {

namespace {

// "/troupe/<fp>/<kind>/<name>" -> fp, kind; false for any other key.
bool split_key(const std::string& key, std::string& fp, std::string& kind) {
  const std::string root = "/troupe/";
  if (key.rfind(root, 0) != 0) return false;
  const size_t a = key.find('/', root.size());
  if (a == std::string::npos) return false;
  const size_t b = key.find('/', a + 1);
  if (b == std::string::npos || b + 1 >= key.size()) return false;
  fp = key.substr(root.size(), a - root.size());
  kind = key.substr(a + 1, b - a - 1);
  return !fp.empty();
}

}  // namespace

CLI::Validator cluster_fingerprint_check() {
  return CLI::Validator(
      [](const std::string& v) -> std::string {
        if (v.size() == 16 && v.find_first_not_of("0123456789abcdef") == std::string::npos)
          return {};
        return quoted_value(v) +
               " is not a cluster fingerprint (16 hex digits, as troupe node prints it)";
      },
      "FINGERPRINT");
}

cluster_view read_cluster(const std::string& url, const std::string& cluster) {
  etcd_client etcd(registry_endpoints(url));
  std::vector<etcd_kv> kvs;
  try {
    kvs = etcd.range_prefix(cluster.empty() ? "/troupe/" : "/troupe/" + cluster + "/");
  } catch (const etcd_error& e) {
    throw std::runtime_error(std::string("the registry does not answer: ") + e.what());
  }
  std::set<std::string> clusters;
  std::string fp, kind;
  for (const auto& kv : kvs)
    if (split_key(kv.key, fp, kind)) clusters.insert(fp);
  if (clusters.empty())
    throw std::runtime_error(cluster.empty()
                                 ? "the registry " + url + " holds no troupe cluster"
                                 : "the registry " + url + " holds no cluster " + cluster);
  if (clusters.size() > 1) {
    std::string names;
    for (const auto& c : clusters) names += (names.empty() ? "" : ", ") + c;
    throw std::runtime_error("the registry holds several clusters (" + names +
                             "): name one with --cluster");
  }
  cluster_view v;
  v.cluster = *clusters.begin();
  for (const auto& kv : kvs) {
    if (!split_key(kv.key, fp, kind)) continue;
    std::string why;
    if (kind == "nodes") {
      if (auto r = parse_registry_value(kv.value, &why))
        v.nodes.push_back(std::move(*r));
      else
        v.skipped.push_back(kv.key);
    } else if (kind == "services") {
      if (auto r = parse_service_record(kv.value, &why))
        v.services.push_back(std::move(*r));
      else
        v.skipped.push_back(kv.key);
    } else {
      v.skipped.push_back(kv.key);
    }
  }
  return v;
}

}  // namespace troupe::cli
