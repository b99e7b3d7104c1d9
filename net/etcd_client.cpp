#include "net/etcd_client.hpp"

#include <httplib.h>

#include <charconv>
#include <nlohmann/json.hpp>

#include "runtime/common/base64.hpp"

namespace troupe {

namespace {

using json = nlohmann::json;

std::string from_base64_or_throw(const std::string& s) {
  auto bytes = from_base64(s);
  if (!bytes) throw etcd_error("etcd: a reply holds bad base64");
  return std::move(*bytes);
}

// etcd's gateway writes 64-bit numbers as strings.
int64_t number_of(const json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return 0;
  if (it->is_number_integer()) return it->get<int64_t>();
  if (it->is_string()) {
    const auto& s = it->get_ref<const std::string&>();
    int64_t v = 0;
    auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    if (ec == std::errc() && end == s.data() + s.size()) return v;
  }
  throw etcd_error(std::string("etcd: a reply's '") + key + "' is not a number");
}

json parse_reply(const std::string& text) {
  json j = json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) throw etcd_error("etcd: a reply is not a JSON object");
  if (j.contains("error")) {
    const auto& e = j["error"];
    throw etcd_error("etcd: " + (e.is_string() ? e.get<std::string>() : e.dump()));
  }
  return j;
}

}  // namespace

std::string prefix_end(const std::string& prefix) {
  std::string end = prefix;
  while (!end.empty()) {
    auto& c = end.back();
    if (static_cast<unsigned char>(c) < 0xff) {
      c = static_cast<char>(static_cast<unsigned char>(c) + 1);
      return end;
    }
    end.pop_back();
  }
  return std::string(1, '\0');  // every key (etcd's convention)
}

etcd_client::etcd_client(std::vector<std::string> endpoints, std::chrono::milliseconds timeout)
    : endpoints_(std::move(endpoints)), timeout_(timeout) {
  if (endpoints_.empty()) throw std::invalid_argument("etcd: no endpoint");
  for (const auto& ep : endpoints_) {
    const auto colon = ep.rfind(':');
    if (colon == std::string::npos || colon == 0 || colon + 1 == ep.size() ||
        colon + 6 < ep.size() || ep.find_first_not_of("0123456789", colon + 1) != std::string::npos)
      throw std::invalid_argument("etcd: '" + ep + "' is not HOST:PORT");
  }
}

std::string etcd_client::call(const std::string& path, const std::string& body) {
  std::string failures;
  for (size_t k = 0; k < endpoints_.size(); ++k) {
    const size_t i = (preferred_ + k) % endpoints_.size();
    const auto& ep = endpoints_[i];
    const size_t colon = ep.rfind(':');
    httplib::Client cli(ep.substr(0, colon), std::stoi(ep.substr(colon + 1)));
    const auto secs = timeout_.count() / 1000;
    const auto usecs = (timeout_.count() % 1000) * 1000;
    cli.set_connection_timeout(secs, usecs);
    cli.set_read_timeout(secs, usecs);
    cli.set_write_timeout(secs, usecs);
    auto res = cli.Post("/v3/" + path, body, "application/json");
    if (!res) {
      failures += (failures.empty() ? "" : "; ") + ep + ": " + httplib::to_string(res.error());
      continue;
    }
    if (res->status >= 500 || res->status == 404) {
      failures += (failures.empty() ? "" : "; ") + ep + ": HTTP " + std::to_string(res->status);
      continue;
    }
    preferred_ = i;
    return res->body;
  }
  throw etcd_error("etcd unreachable (" + failures + ")");
}

int64_t etcd_client::grant(int ttl_s, int64_t* granted_ttl_s) {
  auto j = parse_reply(call("lease/grant", json{{"TTL", ttl_s}}.dump()));
  const int64_t id = number_of(j, "ID");
  if (id == 0) throw etcd_error("etcd: lease/grant gave no lease");
  if (granted_ttl_s) *granted_ttl_s = number_of(j, "TTL");
  return id;
}

int64_t etcd_client::keep_alive(int64_t lease) {
  // A keep-alive stream of one message: the gateway answers {"result": ...}
  // and closes it.
  auto text = call("lease/keepalive", json{{"ID", std::to_string(lease)}}.dump());
  // The stream may hold one JSON object per line; the first says it.
  const size_t nl = text.find('\n');
  auto j = parse_reply(nl == std::string::npos ? text : text.substr(0, nl));
  auto it = j.find("result");
  if (it == j.end() || !it->is_object()) return 0;
  return number_of(*it, "TTL");
}

void etcd_client::revoke(int64_t lease) {
  parse_reply(call("lease/revoke", json{{"ID", std::to_string(lease)}}.dump()));
}

void etcd_client::put(const std::string& key, const std::string& value, int64_t lease) {
  json body{{"key", to_base64(key)}, {"value", to_base64(value)}};
  if (lease != 0) body["lease"] = std::to_string(lease);
  parse_reply(call("kv/put", body.dump()));
}

std::vector<etcd_kv> etcd_client::range_prefix(const std::string& prefix) {
  auto j = parse_reply(
      call("kv/range",
           json{{"key", to_base64(prefix)}, {"range_end", to_base64(prefix_end(prefix))}}.dump()));
  std::vector<etcd_kv> out;
  auto it = j.find("kvs");
  if (it == j.end() || !it->is_array()) return out;
  for (const auto& kv : *it) {
    if (!kv.is_object()) continue;
    etcd_kv x;
    x.key = from_base64_or_throw(kv.value("key", ""));
    x.value = from_base64_or_throw(kv.value("value", ""));
    x.lease = number_of(kv, "lease");
    out.push_back(std::move(x));
  }
  return out;
}

void etcd_client::remove(const std::string& key) {
  parse_reply(call("kv/deleterange", json{{"key", to_base64(key)}}.dump()));
}

}  // namespace troupe
