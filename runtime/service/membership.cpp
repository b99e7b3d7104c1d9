#include "runtime/service/membership.hpp"

#include <nlohmann/json.hpp>

namespace troupe {

using json = nlohmann::json;

std::string to_registry_value(const node_record& r) {
  return json{{"address", r.address},     {"instances", r.instances}, {"cores", r.cores},
              {"mem_total", r.mem_total}, {"devices", r.devices},     {"load", to_json(r.load)}}
      .dump();
}

std::optional<node_record> parse_registry_value(const std::string& value, std::string* why) {
  auto fail = [&](const std::string& w) -> std::optional<node_record> {
    if (why) *why = w;
    return std::nullopt;
  };
  // A record is a few hundred bytes: a huge value is not one (and is not
  // parsed at every read).
  if (value.size() > (64u << 10)) return fail("larger than 64 KiB");
  json j = json::parse(value, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return fail("not a JSON object");
  node_record r;
  auto addr = j.find("address");
  if (addr == j.end() || !addr->is_string() || addr->get<std::string>().empty())
    return fail("no address");
  r.address = addr->get<std::string>();
  for (unsigned char c : r.address)
    if (c <= ' ' || c >= 0x7f) return fail("the address holds a space or a control character");
  if (r.address.size() > 255) return fail("the address is longer than 255 bytes");
  if (r.address.find(':') == std::string::npos)
    return fail("address '" + r.address + "' has no port");
  if (auto it = j.find("instances"); it != j.end()) {
    if (!it->is_number_integer() || it->get<int64_t>() < 1 || it->get<int64_t>() > 64)
      return fail("instances is not 1 to 64");
    r.instances = it->get<int32_t>();
  }
  if (auto it = j.find("cores"); it != j.end() && it->is_number_integer())
    r.cores = it->get<int32_t>();
  if (auto it = j.find("mem_total"); it != j.end() && it->is_number_integer())
    r.mem_total = it->get<int64_t>();
  if (auto it = j.find("devices"); it != j.end() && it->is_array())
    for (const auto& d : *it)
      if (d.is_string()) r.devices.push_back(d.get<std::string>());
  if (auto it = j.find("load"); it != j.end()) r.load = node_load_from(*it);
  return r;
}

membership_change diff_membership(const std::set<std::string>& joined,
                                  const std::set<std::string>& fixed,
                                  const std::vector<node_record>& registered) {
  membership_change out;
  std::set<std::string> now;
  for (const auto& r : registered) {
    if (!now.insert(r.address).second) continue;  // the same address twice: once
    if (!joined.count(r.address) && !fixed.count(r.address)) out.join.push_back(r);
  }
  for (const auto& a : joined)
    if (!now.count(a)) out.leave.push_back(a);
  return out;
}

}  // namespace troupe
