#pragma once
// What `troupe shell` prints for people: the admin endpoint's JSON as
// aligned tables (one row per instance, request or node) and key: value
// blocks.  Plain functions of JSON, so the shell's tests can feed them
// what the endpoint sends.
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace troupe::cli {

// Rows of a table: each cell text already; columns aligned, numbers right.
std::string render_table(const std::vector<std::string>& headers,
                         const std::vector<std::vector<std::string>>& rows);

// admin `instances`, `requests`, `nodes`, `kv` as tables; `trace` and
// anything else as indented key: value lines.
std::string render_instances(const nlohmann::json& instances);
std::string render_requests(const nlohmann::json& requests);
std::string render_nodes(const nlohmann::json& nodes);
std::string render_kv(const nlohmann::json& kv);
std::string render_fields(const nlohmann::json& j, const std::string& indent = "");

// admin `dp`: the group's figures, then a table of its replicas.
std::string render_dp(const nlohmann::json& dp);
// admin `experts`: the controller's figures, then per layer the imbalance
// and the placement (experts on each expert device).
std::string render_experts(const nlohmann::json& experts);

// The headline figures of the service from `instances` and `requests`.
nlohmann::json headline_metrics(const nlohmann::json& instances, const nlohmann::json& requests);

// The valid word nearest `word` (edit distance at most 3), or "".
std::string nearest(const std::string& word, const std::vector<std::string>& valid);

}  // namespace troupe::cli
