#include "actors/node_set.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <functional>
#include <map>
#include <memory>
#include <set>

#include "actors/node_link.hpp"
#include "actors/relay.hpp"
#include "runtime/config/settings.hpp"
#include "runtime/service/membership.hpp"
#include "runtime/service/pd_policy.hpp"

namespace troupe {

namespace {

// How a node came into the service (named at start counts as by hand):
// the registry's may leave with it.
enum class joined_by { registry, hand };

struct member {
  node_link_full_actor link;
  joined_by how = joined_by::hand;
  bool removing = false;
};

struct node_set_state {
  node_set_options opts;
  std::map<std::string, member> members;  // by address
  // Removed by hand while registered: not joined again from the registry
  // until it leaves the registry (or is added by hand).
  std::set<std::string> removed_by_hand;
  // Registry reads in a row without a node it joined: it goes at
  // k_missing_reads (one read without it is not enough: a renewal late by
  // a few ms, on a busy machine, would drain a healthy node).
  std::map<std::string, int> missing;
  std::set<std::string> warned;  // records refused, logged once
  // Every link started, for the set's end: they stop with it.  (Monitored,
  // not linked: one link that fails must not take the set and every other
  // link down.)
  std::shared_ptr<std::vector<caf::actor>> all_links = std::make_shared<std::vector<caf::actor>>();
  static inline const char* name = "node_set";
};

using self_ptr = node_set_actor::stateful_pointer<node_set_state>;

constexpr int k_missing_reads = 3;

caf::error no_node(const std::string& address) {
  return caf::make_error(caf::sec::invalid_argument,
                         "no node " + address + " in this service (nodes lists them)");
}

std::vector<std::string> addresses(const node_set_state& st) {
  std::vector<std::string> out;
  for (const auto& [a, m] : st.members) out.push_back(a);
  return out;
}

// Every link learns the service's nodes now (their nodes connect to new
// peers for KV transfers).
void tell_peers(self_ptr self) {
  auto all = addresses(self->state);
  for (const auto& [a, m] : self->state.members) self->send(m.link, peers_atom::value, all);
}

caf::error refuse(const std::string& why) {
  return caf::make_error(caf::sec::invalid_argument, why);
}

// Starts the link to a node; the reason it cannot, else empty.
std::string add(self_ptr self, const std::string& address, int32_t count,
                std::vector<instance_spec> specs, joined_by how) {
  auto& st = self->state;
  // One spelling per node (a second spelling of a node already here
  // would take over its instances there).
  if (auto why = check_dial_address(address); !why.empty()) return "node " + why;
  if (st.members.count(address)) return "node " + address + " is in this service already";
  if (specs.empty()) {
    if (count < 1 || count > 64) return "give 1 to 64 instances, not " + std::to_string(count);
    specs.assign(static_cast<size_t>(count), st.opts.base);
  }
  // Roles continue the instances' order (the router's ids).
  for (auto& sp : specs) {
    if (st.opts.pd)
      sp.role =
          to_string(pd_start_role(st.opts.roles, size_t(st.opts.next_role++), st.opts.mixed_start));
    sp.owner = st.opts.share ? std::string() : st.opts.service_id;
  }
  node_link_options lo;
  const size_t colon = address.rfind(':');  // checked above: HOST:PORT
  lo.host = address.substr(0, colon);
  lo.port = static_cast<uint16_t>(std::stoi(address.substr(colon + 1)));
  lo.service_id = st.opts.service_id;
  lo.model_fingerprint = st.opts.model_fingerprint;
  lo.router = st.opts.router;
  lo.specs = std::move(specs);
  lo.peers = addresses(st);
  lo.peers.push_back(address);
  auto link = spawn_node_link(self->system(), std::move(lo));
  self->monitor(link);
  st.all_links->push_back(caf::actor_cast<caf::actor>(link));
  st.members[address] = member{link, how, false};
  st.removed_by_hand.erase(address);
  tell_peers(self);
  return {};
}

// Drains the node's instances, releases them, stops its link and drops it
// from the router; `done` gets what happened.
void remove(self_ptr self, const std::string& address, std::function<void(std::string)> done) {
  auto& st = self->state;
  auto it = st.members.find(address);
  it->second.removing = true;
  auto link = it->second.link;
  // The link gone, the router and the other links forget the node.
  auto drop = [self, address] {
    auto& st = self->state;
    st.members.erase(address);
    st.missing.erase(address);
    self->send(st.opts.router, forget_node_atom::value, address);
    tell_peers(self);
  };
  auto finish = [self, link, address, done, drop](size_t drained, const std::string& state) {
    self->request(link, std::chrono::seconds(15), detach_atom::value)
        .then(
            [address, drained, state, done, drop](bool heard) {
              drop();
              std::string what =
                  "node " + address + " removed (it was " + state +
                  "): " + std::to_string(drained) + " instances drained, " +
                  (heard ? "released on the node" : "the node did not answer (it may be stopping)");
              spdlog::info("cluster: {}", what);
              done(what);
            },
            [self, address, done, drop](caf::error& e) {
              drop();
              done("node " + address + " removed; its link: " + self->system().render(e));
            });
  };
  self->request(link, std::chrono::seconds(10), status_atom::value)
      .then(
          [self, finish](link_status& s) {
            // A node that is stopping ("leaving") drains too: its requests
            // may still be moving.
            if ((s.state != "up" && s.state != "leaving") || s.instances.empty())
              return finish(0, s.state);
            // Its sequences move elsewhere first (drain = migrate by default).
            auto left = std::make_shared<size_t>(s.instances.size());
            const size_t n = s.instances.size();
            for (uint64_t id : s.instances)
              self->request(self->state.opts.router, std::chrono::minutes(5),
                            drain_instance_atom::value, id)
                  .then(
                      [finish, left, n, state = s.state](uint64_t) {
                        if (--*left == 0) finish(n, state);
                      },
                      [finish, left, n, state = s.state](caf::error&) {
                        if (--*left == 0) finish(n, state);
                      });
          },
          [finish](caf::error&) { finish(0, "not answering"); });
}

}  // namespace

node_set_actor spawn_node_set(caf::actor_system& sys, node_set_options opts) {
  return sys.spawn([opts = std::move(opts)](self_ptr self) -> node_set_actor::behavior_type {
    self->state.opts = opts;
    // The links stop with the set.
    self->attach_functor([links = self->state.all_links](const caf::error&) {
      for (const auto& l : *links) caf::anon_send_exit(l, caf::exit_reason::user_shutdown);
    });
    // A link that failed (not one that quit after detach): its node leaves
    // the router (its requests recover elsewhere); a registry node is joined
    // again at the next read, with a new link (the node hands back the same
    // instances).
    self->set_down_handler([self](const caf::down_msg& dm) {
      auto& st = self->state;
      auto& links = *st.all_links;
      links.erase(std::remove_if(links.begin(), links.end(),
                                 [&](const caf::actor& l) { return l.address() == dm.source; }),
                  links.end());
      for (auto it = st.members.begin(); it != st.members.end(); ++it) {
        if (it->second.link.address() != dm.source || it->second.removing) continue;
        spdlog::error("cluster: the link to node {} failed ({}); the node leaves the service",
                      it->first, self->system().render(dm.reason));
        const std::string address = it->first;
        st.members.erase(it);
        st.missing.erase(address);
        self->send(st.opts.router, forget_node_atom::value, address);
        tell_peers(self);
        break;
      }
    });
    return {
        [self](node_add_atom, const std::string& address, int32_t count,
               std::vector<instance_spec>& specs) -> caf::result<link_status> {
          if (auto why = add(self, address, count, std::move(specs), joined_by::hand); !why.empty())
            return refuse(why);
          link_status s;
          s.address = address;
          s.state = "connecting";
          return s;
        },
        [self](settled_atom, const std::string& address) -> caf::result<link_status> {
          auto it = self->state.members.find(address);
          if (it == self->state.members.end()) return no_node(address);
          return relay<link_status>(self, it->second.link, std::chrono::minutes(11),
                                    settled_atom::value);
        },
        [self](node_remove_atom, const std::string& address) -> caf::result<std::string> {
          auto& st = self->state;
          auto it = st.members.find(address);
          if (it == st.members.end()) return no_node(address);
          if (it->second.removing) return refuse("node " + address + " is being removed already");
          // Not joined again from the registry while it stays registered.
          st.removed_by_hand.insert(address);
          auto rp = self->make_response_promise<std::string>();
          remove(self, address, [rp](std::string what) mutable { rp.deliver(std::move(what)); });
          return rp;
        },
        [self](registry_atom, const std::vector<std::string>& addrs,
               const std::vector<int32_t>& counts) {
          auto& st = self->state;
          std::vector<node_record> registered;
          for (size_t i = 0; i < addrs.size() && i < counts.size(); ++i) {
            node_record r;
            r.address = addrs[i];
            r.instances = counts[i];
            registered.push_back(std::move(r));
          }
          std::set<std::string> now(addrs.begin(), addrs.end());
          for (auto it = st.removed_by_hand.begin(); it != st.removed_by_hand.end();)
            it = now.count(*it) ? std::next(it) : st.removed_by_hand.erase(it);
          std::set<std::string> joined, other = st.removed_by_hand;
          for (const auto& [a, m] : st.members)
            (m.how == joined_by::registry && !m.removing ? joined : other).insert(a);
          auto change = diff_membership(joined, other, registered);
          for (const auto& r : change.join) {
            if (auto why = add(self, r.address, r.instances, {}, joined_by::registry);
                !why.empty()) {
              if (st.warned.insert(r.address).second)
                spdlog::warn("cluster: registry node {} not joined: {}", r.address, why);
              continue;
            }
            spdlog::info("cluster: node {} joins through the registry ({} instances)", r.address,
                         r.instances);
          }
          std::set<std::string> gone(change.leave.begin(), change.leave.end());
          for (auto it = st.missing.begin(); it != st.missing.end();)
            it = gone.count(it->first) ? std::next(it) : st.missing.erase(it);
          for (const auto& a : change.leave) {
            if (++st.missing[a] < k_missing_reads) continue;
            spdlog::warn("cluster: node {} left the registry; removing it", a);
            remove(self, a, [](std::string) {});
          }
        },
        [self](shrink_atom, const std::string& address) -> caf::result<uint64_t> {
          auto it = self->state.members.find(address);
          if (it == self->state.members.end()) return no_node(address);
          if (it->second.removing) return refuse("node " + address + " is being removed");
          return relay<uint64_t>(self, it->second.link, std::chrono::minutes(6),
                                 shrink_atom::value);
        },
        [self](grow_atom, const std::string& address,
               int32_t n) -> caf::result<std::vector<uint64_t>> {
          auto it = self->state.members.find(address);
          if (it == self->state.members.end()) return no_node(address);
          if (it->second.removing) return refuse("node " + address + " is being removed");
          return relay<std::vector<uint64_t>>(self, it->second.link, std::chrono::minutes(10),
                                              grow_atom::value, n);
        },
    };
  });
}

}  // namespace troupe
