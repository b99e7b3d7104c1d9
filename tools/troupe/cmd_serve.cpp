// troupe serve: device, instance and gateway in one process, serving the
// client protocol on the --listen endpoints until SIGINT/SIGTERM, then
// draining within a grace period.  Every key of the settings schema
// (runtime/config/settings.def) is a flag here and a key of the TOML file
// (--config; [engine], [service], [cluster]); the command line wins over the
// file, the file over TROUPE_* variables, and a bad value stops the start
// with the key's name (tools/troupe/settings_flags.hpp).
#include <pthread.h>
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <caf/io/all.hpp>
#include <cstdio>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <thread>

#include <spdlog/spdlog.h>
#include <sys/resource.h>

#include "actors/admin_endpoint.hpp"
#include "actors/autoscaler.hpp"
#include "actors/device.hpp"
#include "actors/dp_group.hpp"
#include "actors/encoder.hpp"
#include "actors/expert_controller.hpp"
#include "actors/gateway.hpp"
#include "actors/instance.hpp"
#include "actors/monitor.hpp"
#include "actors/node.hpp"
#include "actors/node_set.hpp"
#include "actors/router.hpp"
#include "net/cluster_tls.hpp"
#include "net/registry.hpp"
#include "net/secret.hpp"
#include "runtime/engine/page_pool.hpp"
#include "runtime/service/epd_policy.hpp"
#include "runtime/service/membership.hpp"
#include "runtime/text/chat_template.hpp"
#include "runtime/text/tokenizer.hpp"
#include "tools/troupe/common.hpp"
#include "tools/troupe/http_front.hpp"
#include "tools/troupe/serve_admin.hpp"

namespace troupe::cli {

namespace {

// How the model's chat template writes tools: Llama 3's and Mistral's
// families have their own conventions; the others (and a template troupe
// does not read, whose chats are refused anyway) get Hermes.
openai::tool_format tool_format_of(const std::string& chat_template) {
  try {
    const auto info = parse_chat_template(chat_template);
    switch (info.format) {
      case chat_format::llama3:
        return openai::tool_format::llama3;
      case chat_format::mistral:  // (v1 templates have no tool turns)
        return info.mistral == mistral_style::tekken ? openai::tool_format::mistral
               : info.mistral == mistral_style::v3   ? openai::tool_format::mistral_v3
                                                     : openai::tool_format::hermes;
      default:
        return openai::tool_format::hermes;
    }
  } catch (const std::exception&) {
    return openai::tool_format::hermes;
  }
}

// Whether the router has an instance that takes requests now (GET
// /health): asked from the HTTP front's thread, so with a scoped actor and
// a short wait; no answer counts as no.
bool any_instance_serving(caf::actor_system& sys, const router_actor& router) {
  caf::scoped_actor self{sys};
  bool serving = false;
  self->request(router, std::chrono::seconds(2), registry_atom::value)
      .receive(
          [&](const std::vector<router_instance>& all) {
            for (const auto& i : all) serving = serving || i.state == "serving";
          },
          [](caf::error&) {});
  return serving;
}

// Hybrid EPD's checks across keys (service.epd): its strategy, or none.
// The encode role is E-P-D's, which needs a local instance of it and one
// of another role; the other disaggregated strategies need --pd.
std::optional<epd_strategy> check_hybrid_epd(const service_settings& s, const engine_settings& e,
                                             const std::vector<instance_role>& roles, int local) {
  const auto encode_roles = std::count(roles.begin(), roles.end(), instance_role::encode);
  if (s.epd.empty()) {
    if (encode_roles > 0)
      throw std::invalid_argument("service.roles: 'encode' is hybrid EPD's E pool (--epd E-P-D)");
    return std::nullopt;
  }
  const auto epd = parse_epd_strategy(s.epd);  // (the schema checked the name)
  const std::string key = "service.epd " + std::string(to_string(*epd)) + ": ";
  if (e.mmproj.empty()) throw std::invalid_argument(key + "needs engine.mmproj (--mmproj)");
  if (s.dp_group) throw std::invalid_argument(key + "not with service.dp_group");
  if (local < 1) throw std::invalid_argument(key + "the encoders run beside local instances");
  if (*epd != epd_strategy::colocated && !s.pd)
    throw std::invalid_argument(key +
                                "needs service.pd (--pd): it places prefill and decode "
                                "on instances of their own");
  if (encode_roles > 0 && roles.size() > size_t(local) &&
      std::count(roles.begin() + local, roles.end(), instance_role::encode) > 0)
    throw std::invalid_argument("service.roles: 'encode' only for local instances (the first " +
                                std::to_string(local) + "): the encoders run beside them");
  if (*epd == epd_strategy::e_p_d) {
    int n_encode = 0;
    for (int i = 0; i < local; ++i)
      n_encode += size_t(i) < roles.size() && roles[size_t(i)] == instance_role::encode;
    if (n_encode == 0 || n_encode == local)
      throw std::invalid_argument(key +
                                  "give some local instances, not all, the encode role "
                                  "(--roles, e.g. encode,prefill,decode)");
  } else if (encode_roles > 0) {
    throw std::invalid_argument("service.roles: 'encode' is hybrid EPD's E pool (--epd E-P-D)");
  }
  return epd;
}

// How often a service reads the registry's nodes.
constexpr auto k_registry_poll = std::chrono::milliseconds(500);

// Waits until a node that joined through the registry is up; its first
// instance's device, or nullopt when SIGINT/SIGTERM came first.
std::optional<device_info> wait_for_first_node(caf::actor_system& sys, const router_actor& router,
                                               const sigset_t& sigs) {
  std::fprintf(stderr, "troupe serve: no instance yet; waiting for a node to join\n");
  caf::scoped_actor self{sys};
  for (;;) {
    std::optional<device_info> up;
    self->request(router, std::chrono::seconds(5), nodes_atom::value)
        .receive(
            [&](const std::vector<link_status>& all) {
              for (const auto& n : all)
                if (n.state == "up" && !up) up = n.info;
            },
            [](caf::error&) {});
    if (up) return up;
    timespec wait{0, 250'000'000};
    if (sigtimedwait(&sigs, nullptr, &wait) > 0) return std::nullopt;
  }
}

int run_serve(settings_flags& flags, const std::string& config) {
  const settings all = flags.resolve(config);
  const engine_settings& e = all.engine;
  const service_settings& s = all.service;
  const cluster_settings& cl = all.cluster;
  // The checks across keys, at the edge, before anything starts (the
  // engine repeats the limits' check only for live changes).
  // The HTTP budget has room for one largest body, its headers (32 KiB) and framing.
  if (int64_t(s.http_max_unfinished_bytes) < int64_t(s.http_max_body_bytes) + (64 << 10))
    throw std::invalid_argument(
        "service.http_max_unfinished_bytes (" + std::to_string(s.http_max_unfinished_bytes) +
        ") is below service.http_max_body_bytes (" + std::to_string(s.http_max_body_bytes) +
        ") + 64 KiB: a body of the largest size could never be read");
  auto check_limits = [](const engine_settings& x, const std::string& where) {
    if (auto why = validate(limits_of(x)); !why.empty())
      throw std::invalid_argument(where + "max_batch_tokens/max_seqs/chunk_size: " + why);
  };
  check_limits(e, "engine.");
  for (const auto& n : flags.node_entries())
    check_limits(n.apply(e), "cluster.node " + n.address + ": ");

  // Every client connection and every PoCL kernel build takes fds: use all
  // the process may have, so a connection flood meets the bounded
  // endpoints' limits long before PoCL's dlopen fails.
  if (rlimit rl{}; ::getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
    rl.rlim_cur = rl.rlim_max;
    ::setrlimit(RLIMIT_NOFILE, &rl);
  }

  // Signals go to the thread that waits for them, not to CAF's workers:
  // block them before any thread starts.
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGINT);
  sigaddset(&sigs, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);
  // A write to a socket its peer has reset fails with EPIPE, handled where
  // it happens, instead of ending the process (libevent writes with
  // writev, which has no MSG_NOSIGNAL).
  ::signal(SIGPIPE, SIG_IGN);

  // Opened once: the local instances share it.
  auto model = open_model(e);
  std::shared_ptr<const tokenizer> tok = tokenizer::create(model->vocab());
  // The vision encoder (EPD's E stage), checked before anything starts:
  // its rows must be the model's width.
  std::shared_ptr<const clip_model> vision;
  if (!e.mmproj.empty()) {
    vision = load_clip_model(e.mmproj);
    if (vision->hp.n_out != model->hparams().n_embd)
      throw std::runtime_error(e.mmproj + ": the vision encoder writes rows of " +
                               std::to_string(vision->hp.n_out) + " values; " + e.model +
                               " takes rows of " + std::to_string(model->hparams().n_embd));
  }

  // Where the instances run: --nodes (one each), [[cluster.node]] tables,
  // and --local-instances in this process.
  std::vector<node_entry> nodes = flags.node_entries();
  for (const auto& a : cl.nodes) nodes.push_back(node_entry{a, 1, {}});
  // With a registry, nodes join while the service runs (none may be there yet).
  const bool use_registry = !cl.registry.empty();
  {
    std::set<std::string> seen;
    for (const auto& n : nodes)
      if (!seen.insert(n.address).second)
        throw std::invalid_argument("cluster.nodes: " + n.address +
                                    " is named twice (--nodes and [[cluster.node]] together)");
  }
  const int local =
      s.local_instances >= 0 ? s.local_instances : (nodes.empty() && !use_registry ? 1 : 0);
  if (local == 0 && nodes.empty() && !use_registry)
    throw std::invalid_argument(
        "service.local_instances: 0 and no nodes (--nodes, [[cluster.node]], --registry): no "
        "instance would serve");
  // Pipeline stages on troupe nodes (engine.pipeline_nodes) speak the
  // cluster's TLS too.
  const bool remote_stages = std::any_of(e.pipeline_nodes.begin(), e.pipeline_nodes.end(),
                                         [](const std::string& place) { return place != "local"; });
  std::unique_ptr<actor_env> envp = nodes.empty() && !use_registry && !remote_stages
                                        ? std::make_unique<actor_env>()
                                        : std::make_unique<actor_env>(load_cluster_secret(cl), cl);
  actor_env& env = *envp;

  instance_spec base;
  base.engine = e;
  base.tpot_target_ms = s.tpot_target_ms;
  if (s.role_switching && !s.pd)
    throw std::invalid_argument("service.role_switching: needs service.pd (--pd)");
  std::vector<instance_role> roles;
  for (const auto& r : s.roles) roles.push_back(*parse_role(r));
  const auto epd = check_hybrid_epd(s, e, roles, local);

  if (s.dp_group) {
    if (s.pd) throw std::invalid_argument("service.dp_group: not with service.pd");
    // Local instances and the nodes' (which join as their nodes link).
    int replicas = local;
    for (const auto& n : nodes) replicas += n.instances;
    if (replicas < 2 && !use_registry)
      throw std::invalid_argument(
          "service.dp_group: needs 2 or more instances (service.local_instances, nodes)");
  }
  const bool moe = model->hparams().n_expert > 0;

  // Local instances: each owns a device actor (its queue, its KV arena).
  std::vector<device_actor> local_devices;
  std::vector<caf::actor> owned;  // told to stop at the end (or when start fails)
  // Whatever throws before the service runs (a device that fails, a node
  // address, a busy --listen) leaves through here: the actors started so far
  // are told to stop, or ~actor_system would wait for them forever (a probe
  // found serve hung for good, SIGTERM ignored, on a busy port).
  struct stop_on_throw {
    const std::vector<caf::actor>& actors;
    const int pending = std::uncaught_exceptions();
    ~stop_on_throw() {
      if (std::uncaught_exceptions() > pending)
        for (const auto& a : actors) caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
    }
  } stop_started{owned};
  std::vector<router_instance> registry;
  std::vector<device_info> infos;
  // The process's KV store, shared by its local instances.
  kv_pool_actor tiers;
  if (local > 0 && kv_store_options_of(e).enabled()) {
    tiers = spawn_kv_pool(*env.sys, kv_store_options_of(e));
    owned.push_back(caf::actor_cast<caf::actor>(tiers));
  }
  for (int i = 0; i < local; ++i) {
    instance_spec spec = base;
    if (s.pd)
      spec.role = to_string(pd_start_role(roles, size_t(i), s.role_switching && s.flip_via_mixed));
    if (e.instance_cores > 0) {
      spec.cores = e.instance_cores;
      spec.slice = i;
    }
    auto h = spawn_engine(*env.sys, i, spec, model, tiers);
    owned.push_back(caf::actor_cast<caf::actor>(h.hosted.actor));
    owned.push_back(caf::actor_cast<caf::actor>(h.device));
    local_devices.push_back(h.device);
    infos.push_back(h.hosted.info);
    router_instance ri;
    ri.id = static_cast<uint64_t>(i + 1);
    ri.actor = h.hosted.actor;
    ri.store = tiers;
    ri.device = h.device;
    registry.push_back(std::move(ri));
  }
  router_options ro;
  ro.policy = *parse_placement_policy(s.router);
  ro.ttft_target_ms = s.ttft_target_ms;
  ro.drain_migrates = s.drain == "migrate";
  ro.pd = s.pd;
  ro.role_switching = s.role_switching;
  ro.tpot_target_ms = s.tpot_target_ms;
  ro.pd_cfg.min_decode = s.min_decode;
  ro.pd_cfg.min_prefill = s.min_prefill;
  ro.pd_cfg.violation_windows = s.flip_windows;
  ro.pd_cfg.cooldown_s = s.flip_cooldown_s;
  ro.pd_cfg.miss_share = s.flip_miss_share;
  ro.pd_cfg.via_mixed = s.flip_via_mixed;
  ro.pd_cfg.max_flips = s.flip_max;
  ro.pd_cfg.preempt_migrate = s.flip_migrate;
  ro.pd_cfg.mixed_slack = s.flip_mixed_slack;
  ro.pd_cfg.idle_busy = s.idle_busy;
  ro.pd_cfg.kv_high = s.decode_kv_high;
  ro.window = std::chrono::milliseconds(s.window_ms);
  ro.roles = roles;
  ro.page_size = e.page_size;                // every instance's, local or on a node
  ro.max_batch_tokens = e.max_batch_tokens;  // the TTFT predictor's step limits
  ro.chunk_size = e.chunk_size;
  ro.max_seqs = e.max_seqs;  // rebalancing: queued requests of full instances move
  ro.epd = epd;
  if (epd)  // an encoder per local instance (ids 1..local)
    for (int i = 1; i <= local; ++i) ro.encoders.insert(static_cast<uint64_t>(i));
  auto monitor = spawn_monitor(*env.sys, s.window_ms / 1000.0);
  ro.monitor = monitor;
  // The data-parallel group places requests for the router (issue 15).
  admin_groups groups;
  if (s.dp_group) {
    dp_group_config dc;
    dc.interval_ms = s.dp_interval_ms;
    dc.gap_share = s.dp_gap_share;
    dc.max_moves = s.dp_max_moves;
    dc.min_left = s.dp_min_left;
    dc.patience = s.dp_patience;
    dc.rebalance = s.dp_rebalance;
    dc.lockstep = s.dp_lockstep == "on" || (s.dp_lockstep == "auto" && moe);
    groups.dp = spawn_dp_group(*env.sys, registry, dc, e.page_size);
    ro.dp_group = groups.dp;
    owned.push_back(caf::actor_cast<caf::actor>(groups.dp));
    std::fprintf(stderr, "troupe serve: dp group of %d local instances%s (lockstep %s)\n", local,
                 nodes.empty() ? "" : " and the nodes' instances", dc.lockstep ? "on" : "off");
  }
  // Experts spread over sub-devices: the controller balances them live,
  // in every engine (nodes' engines join it as their instances join).
  if (moe && e.expert_devices >= 2) {
    expert_controller_config xc;
    xc.threshold = s.expert_threshold;
    xc.interval_ms = s.expert_interval_ms;
    xc.spare_slots = s.expert_spare_slots;
    groups.experts = spawn_expert_controller(*env.sys, local_devices, xc);
    ro.experts = groups.experts;
    owned.push_back(caf::actor_cast<caf::actor>(groups.experts));
    std::fprintf(stderr,
                 "troupe serve: expert controller over %d expert devices per engine "
                 "(threshold %.2f)\n",
                 e.expert_devices, xc.threshold);
  }
  auto router = spawn_router(*env.sys, registry, ro);
  owned.push_back(caf::actor_cast<caf::actor>(router));
  owned.push_back(caf::actor_cast<caf::actor>(monitor));

  // Remote instances: the node set holds a link per node (those named
  // here, and those that join through the registry or by hand); each link
  // reports how its start went.
  node_set_options nso;
  nso.service_id = make_secret().substr(0, 16);
  nso.model_fingerprint = model->fingerprint();
  nso.router = router;
  nso.base = base;
  nso.pd = s.pd;
  nso.roles = roles;
  nso.mixed_start = s.role_switching && s.flip_via_mixed;
  nso.next_role = local;  // roles continue the local instances' order (the router's ids)
  nso.share = !s.pd && !s.dp_group && !moe;  // else instances set one service's state
  auto node_set = spawn_node_set(*env.sys, nso);
  owned.push_back(caf::actor_cast<caf::actor>(node_set));
  {
    caf::scoped_actor self{*env.sys};
    for (const auto& n : nodes) {
      instance_spec spec = base;
      spec.engine = n.apply(e);
      self->request(node_set, std::chrono::seconds(10), node_add_atom::value, n.address,
                    n.instances, std::vector<instance_spec>(size_t(n.instances), spec))
          .receive([](link_status&) {},
                   [&](caf::error& er) {
                     throw std::invalid_argument("cluster.nodes: " + env.sys->render(er));
                   });
    }
    for (const auto& n : nodes) {
      link_status ls;
      ls.address = n.address;
      ls.state = "down";
      ls.error = "no answer during start-up";
      self->request(node_set, std::chrono::minutes(11), settled_atom::value, n.address)
          .receive([&](link_status& x) { ls = std::move(x); }, [](caf::error&) {});
      if (ls.state == "up") {
        infos.push_back(ls.info);
        std::fprintf(stderr, "troupe serve: node %s: up, %zu instances, %d cores, %.1f GiB\n",
                     ls.address.c_str(), ls.instances.size(), ls.resources.cores,
                     static_cast<double>(ls.resources.mem_total) / (1u << 30));
      } else {
        std::fprintf(stderr, "troupe serve: node %s: %s: %s\n", ls.address.c_str(),
                     ls.state.c_str(), ls.error.c_str());
      }
    }
  }
  // The registry: nodes of this cluster join (and leave) while it serves.
  std::unique_ptr<registry_watch> watch;
  if (use_registry) {
    const auto prefix =
        registry_nodes_prefix(cluster_fingerprint(load_cluster_secret(cl)).substr(0, 16));
    watch = std::make_unique<registry_watch>(
        registry_endpoints(cl.registry), prefix, k_registry_poll,
        [node_set, warned = std::set<std::string>()](const std::vector<etcd_kv>& kvs) mutable {
          std::vector<std::string> addrs;
          std::vector<int32_t> counts;
          for (const auto& kv : kvs) {
            std::string why;
            auto r = parse_registry_value(kv.value, &why);
            if (!r) {
              if (warned.insert(kv.key + "=" + kv.value).second)
                spdlog::warn("registry: {} is not a node record ({}); skipped", kv.key, why);
              continue;
            }
            addrs.push_back(r->address);
            counts.push_back(r->instances);
          }
          caf::anon_send(node_set, registry_atom::value, std::move(addrs), std::move(counts));
        });
    std::fprintf(stderr, "troupe serve: nodes join through the registry %s\n", cl.registry.c_str());
    // No instance yet: the first node to join brings the model's geometry
    // (context, pages) the gateway needs.
    if (infos.empty()) {
      if (auto first = wait_for_first_node(*env.sys, router, sigs)) {
        infos.push_back(*first);
      } else {
        watch.reset();
        for (const auto& a : owned) caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
        std::fprintf(stderr, "troupe serve: stopped before any node joined\n");
        return 0;
      }
    }
  }
  if (infos.empty())
    throw std::runtime_error("no instance: every node failed to start (see above)");
  device_info info = infos.front();
  int32_t max_len = std::min(info.n_ctx, info.n_pages * info.page_size);
  for (const auto& i : infos)
    max_len = std::min(max_len, std::min(i.n_ctx, i.n_pages * i.page_size));

  auto ctx = std::make_shared<serve_context>();
  ctx->router = router;
  ctx->tok = tok;
  ctx->model_name = e.model;
  ctx->chat_template = model->vocab().chat_template;
  ctx->add_bos = model->vocab().add_bos;
  ctx->pd = s.pd;
  ctx->max_len = max_len;
  ctx->page_size = info.page_size;
  ctx->prefix_salt = fingerprint_salt(info.model_fingerprint);
  {
    uint64_t tag = std::stoull(make_secret().substr(0, 6), nullptr, 16);
    ctx->seq_id_tag = tag << 40;
  }
  ctx->default_max_tokens = s.default_max_tokens;
  ctx->max_queue = s.max_queue;
  ctx->monitor = monitor;
  ctx->online_ttft_ms = s.ttft_target_ms;
  ctx->online_tpot_ms = s.tpot_target_ms;
  ctx->kv_copy = s.kv_copy;
  ctx->kv_copy_pages = s.kv_copy_pages;
  ctx->offline_ttft_ms = s.offline_ttft_ms;
  ctx->offline_tpot_ms = s.offline_tpot_ms;
  auto metrics = std::make_shared<metrics_registry>();
  if (vision) {
    ctx->encode_books = std::make_shared<encode_ledger>(
        e.encoder_queue, static_cast<uint64_t>(e.encoder_cache_mb) << 20);
    if (epd) {
      // Hybrid EPD: each local instance's own encoder (the ledger's
      // queue bound and cache stay the service's).
      ctx->epd = epd;
      for (int i = 1; i <= local; ++i) {
        auto enc =
            spawn_encoder(*env.sys, vision, {e.platform, e.device, 0}, ctx->encode_books, metrics);
        ctx->encoders[static_cast<uint64_t>(i)] = enc;
        owned.push_back(caf::actor_cast<caf::actor>(enc));
      }
    } else {
      ctx->encoder =
          spawn_encoder(*env.sys, vision, {e.platform, e.device, 0}, ctx->encode_books, metrics);
      owned.push_back(caf::actor_cast<caf::actor>(ctx->encoder));
    }
    ctx->image_rows = vision->hp.n_patches();
    std::fprintf(stderr, "troupe serve: images through %s (%d rows each, %dx%d pixels)\n",
                 e.mmproj.c_str(), ctx->image_rows, vision->hp.image_size, vision->hp.image_size);
    if (epd)
      std::fprintf(stderr, "troupe serve: hybrid EPD %s: an encoder on each of %d instances\n",
                   std::string(to_string(*epd)).c_str(), local);
  }
  declare_request_metrics(*metrics);
  ctx->metrics = metrics;
  gateway_options go;
  go.endpoints = s.listen;
  go.max_frame_bytes = static_cast<size_t>(s.max_frame_bytes);
  // Images are megabytes: a server that takes them takes frames to match,
  // where the operator left the limit at its default.  (Not HTTP bodies:
  // the front holds each half-sent body whole, so their limit times the
  // connections is its memory; 8 MiB carries a 6 MB image.)
  const service_settings defaults{};
  constexpr size_t k_image_frame = size_t{32} << 20;
  if (vision && s.max_frame_bytes == defaults.max_frame_bytes) go.max_frame_bytes = k_image_frame;
  go.max_inflight = s.max_inflight;
  go.poll_ms = s.poll_ms;
  go.trace_history = static_cast<size_t>(s.trace_history);
  go.client_backlog = s.client_backlog;
  auto gw = spawn_gateway(*env.sys, ctx, go);  // a busy endpoint throws: stop_started

  // The admin and metrics endpoints; if one cannot open, the actors are
  // told to stop before the error leaves (the actor system waits for them).
  // The gateway learns the admin port before the ready line, so every Pong
  // a client can get names it.
  // Elastic pools: instances started and retired on the nodes by load.
  if (!s.autoscale.empty()) {
    autoscaler_options ao;
    parse_autoscale_bounds(s.autoscale, ao.policy);
    ao.policy.grow_load = s.autoscale_grow_load;
    ao.policy.shrink_load = s.autoscale_shrink_load;
    ao.policy.shrink_cooldown_s = s.autoscale_cooldown_s;
    ao.ttft_target_ms = s.ttft_target_ms;
    ao.max_seqs = e.max_seqs;
    ao.window = std::chrono::milliseconds(s.window_ms);
    ao.router = router;
    ao.nodes = node_set;
    ao.monitor = monitor;
    owned.push_back(caf::actor_cast<caf::actor>(spawn_autoscaler(*env.sys, ao)));
    std::fprintf(stderr,
                 "troupe serve: autoscaling %s instances (grow above %.2f of capacity, retire "
                 "below %.2f, cooldown %.0f s)\n",
                 s.autoscale.c_str(), s.autoscale_grow_load, s.autoscale_shrink_load,
                 s.autoscale_cooldown_s);
  }
  // Nodes join only a service that speaks the cluster's protocol (started
  // with --nodes, a registry or remote stages): the others answer `node add`
  // that they take no nodes, not a failed link.
  auto admin = spawn_admin(*env.sys, gw.actor, router, env.identity ? node_set : node_set_actor{},
                           monitor, groups);
  std::optional<admin_endpoint_handle> admin_ep;
  std::vector<std::string> secret_files;  // made here, removed at exit
  std::unique_ptr<metrics_server> metrics_http;
  std::unique_ptr<http_front> http;
  auto draining = std::make_shared<std::atomic<bool>>(false);
  try {
    if (s.admin_port >= 0) {
      admin_endpoint_options ao;
      ao.host = s.admin_host;
      ao.port = s.admin_port;
      // A given file, else a fresh secret; a bad file names its key.
      auto secret = [](const std::string& file, const char* key) {
        if (file.empty()) return make_secret();
        try {
          return read_secret_file(file);
        } catch (const std::exception& e) {
          throw std::runtime_error(std::string("service.") + key + ": " + e.what());
        }
      };
      // The effective config, for `admin config` (values, never secrets:
      // the secret keys name files).
      nlohmann::json effective = to_json(all);
      if (!config.empty()) effective["config_file"] = config;
      ao.config = effective;
      ao.control_secret = secret(s.admin_secret_file, "admin_secret_file");
      ao.read_secret = secret(s.admin_read_secret_file, "admin_read_secret_file");
      const std::string control = ao.control_secret, read = ao.read_secret;
      if (const int stale = remove_stale_run_secrets(); stale > 0)
        spdlog::info("removed {} secret files of admin endpoints that no longer listen", stale);
      admin_ep = spawn_admin_endpoint(*env.sys, admin, std::move(ao));
      // The same user's tools find the secrets by port (docs/security.md).
      for (const auto& [kind, secret] : {std::pair{"admin", control}, {"admin-read", read}}) {
        const auto path = run_secret_path(kind, admin_ep->port);
        write_secret_file(path, secret);
        secret_files.push_back(path);
      }
      caf::scoped_actor self{*env.sys};
      caf::error err;
      self->request(gw.actor, std::chrono::seconds(10), admin_port_atom::value,
                    static_cast<uint32_t>(admin_ep->port))
          .receive([](uint32_t) {}, [&](caf::error& e) { err = std::move(e); });
      if (err)
        throw std::runtime_error("service.admin_port: the gateway did not take the admin port: " +
                                 env.sys->render(err));
    }
    if (s.metrics_port > 0)
      metrics_http =
          std::make_unique<metrics_server>(*env.sys, admin, metrics, s.admin_host, s.metrics_port);
    if (s.http_port > 0) {
      http_front_options ho;
      ho.host = s.http_host;
      ho.port = s.http_port;
      ho.max_body_bytes = static_cast<size_t>(s.http_max_body_bytes);
      ho.limits.max_connections = static_cast<size_t>(s.http_max_connections);
      ho.limits.max_unfinished_bytes = static_cast<size_t>(s.http_max_unfinished_bytes);
      ho.limits.read_deadline = std::chrono::seconds(s.http_read_timeout_s);
      ho.max_frame_bytes = go.max_frame_bytes;
      ho.model = e.model;
      ho.endpoint = gw.endpoints.at(0);
      ho.token_text = [tok](int32_t id) { return tok->decode({id}); };
      ho.detokenize = [tok](const std::vector<int32_t>& ids) { return tok->decode(ids); };
      ho.tokenize = [tok, bos = ctx->add_bos](const std::string& text, bool add_special) {
        return tok->encode(text, add_special && bos, true);
      };
      ho.vocab_size = tok->n_vocab();
      ho.tools = tool_format_of(ctx->chat_template);
      ho.api_keys = s.api_key;
      if (!s.api_key_file.empty()) {
        std::string keys;
        try {
          keys = read_secret_file(s.api_key_file);
        } catch (const std::exception& e) {
          throw std::runtime_error(std::string("service.api_key_file: ") + e.what());
        }
        std::stringstream lines(keys);
        for (std::string k; std::getline(lines, k);)
          if (auto b = k.find_first_not_of(" \t\r"); b != std::string::npos)
            ho.api_keys.push_back(k.substr(b, k.find_last_not_of(" \t\r") - b + 1));
      }
      ho.cors_origins = s.cors_origins;
      ho.metrics = [sys = env.sys.get(), admin, metrics] {
        poll_metrics(*sys, admin, *metrics);
        return metrics->render();
      };
      ho.registry = metrics;
      ho.draining = [draining] { return draining->load(); };
      ho.serving = [sys = env.sys.get(), router] { return any_instance_serving(*sys, router); };
      http = std::make_unique<http_front>(std::move(ho));
    }
  } catch (...) {
    for (const auto& a :
         {caf::actor_cast<caf::actor>(admin), caf::actor_cast<caf::actor>(gw.actor)})
      caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
    if (admin_ep) caf::anon_send_exit(admin_ep->actor, caf::exit_reason::user_shutdown);
    for (const auto& f : secret_files) std::remove(f.c_str());
    throw;
  }

  std::string eps;
  for (const auto& ep : gw.endpoints) eps += (eps.empty() ? "" : " ") + ep;
  std::printf("troupe serve: listening on %s (model %s on %s, context %d tokens)\n", eps.c_str(),
              e.model.c_str(), info.device_name.c_str(), ctx->max_len);
  if (admin_ep) std::printf("troupe serve: admin on %s:%d\n", s.admin_host.c_str(), admin_ep->port);
  if (metrics_http)
    std::printf("troupe serve: metrics on http://%s:%d/metrics\n", s.admin_host.c_str(),
                s.metrics_port);
  if (http)
    std::printf("troupe serve: http on http://%s:%d/v1\n", s.http_host.c_str(), http->port());
  std::fflush(stdout);

  // With a registry, the service publishes itself (its endpoints and load,
  // at every renewal): clients find the cluster's services there.
  std::unique_ptr<registration> published;
  if (use_registry) {
    service_record base;
    base.id = nso.service_id;
    // A wildcard listener is published under the machine's name.
    const std::string host = local_resources().host;
    for (const auto& ep : gw.endpoints) base.endpoints.push_back(dialable_endpoint(ep, host));
    base.model = e.model;
    published = std::make_unique<registration>(
        registry_endpoints(cl.registry),
        registry_services_prefix(cluster_fingerprint(load_cluster_secret(cl)).substr(0, 16)) +
            base.id,
        std::function<std::string()>([sys = env.sys.get(), admin, base] {
          return to_registry_value(current_service_record(*sys, admin, base));
        }),
        cl.registry_ttl_s);
  }

  int sig = 0;
  sigwait(&sigs, &sig);
  // Clients stop finding it before it drains.
  if (published) published->stop(true);
  std::fprintf(stderr, "troupe serve: %s, draining (grace %.1f s)\n",
               sig == SIGINT ? "SIGINT" : "SIGTERM", s.grace_s);
  draining->store(true);

  // Stop taking requests, let those in flight finish, cancel the rest.
  caf::scoped_actor self{*env.sys};
  auto in_flight = [&](bool cancel) {
    int32_t n = 0;
    self->request(gw.actor, std::chrono::seconds(5), drain_atom::value, cancel)
        .receive([&](int32_t k) { n = k; }, [&](caf::error&) { n = 0; });
    return n;
  };
  const auto grace_end = std::chrono::steady_clock::now() +
                         std::chrono::milliseconds(static_cast<int64_t>(s.grace_s * 1000));
  int32_t left = in_flight(false);
  while (left > 0 && std::chrono::steady_clock::now() < grace_end) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    left = in_flight(false);
  }
  if (left > 0) {
    std::fprintf(stderr, "troupe serve: cancelling %d requests still in flight\n", left);
    left = in_flight(true);
    const auto cancel_end = std::chrono::steady_clock::now() + std::chrono::seconds(2);
    while (left > 0 && std::chrono::steady_clock::now() < cancel_end) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      left = in_flight(false);
    }
  }
  metrics_http.reset();
  http.reset();
  if (admin_ep) self->send_exit(admin_ep->actor, caf::exit_reason::user_shutdown);
  for (const auto& f : secret_files) std::remove(f.c_str());
  self->send_exit(admin, caf::exit_reason::user_shutdown);
  self->send_exit(gw.actor, caf::exit_reason::user_shutdown);
  for (const auto& a : owned) self->send_exit(a, caf::exit_reason::user_shutdown);
  env.exit_limit = std::chrono::seconds(5);
  std::fprintf(stderr, "troupe serve: stopped\n");
  return 0;
}

}  // namespace

void add_serve(CLI::App& app) {
  auto config = std::make_shared<std::string>();
  auto* cmd = app.add_subcommand("serve", "serve a model to clients over ZeroMQ (client.proto)");
  cmd->add_option("-c,--config", *config, "TOML config file ([engine], [service], [cluster])")
      ->check(CLI::ExistingFile);
  // Every key of the schema is a flag of serve.
  auto flags = std::make_shared<settings_flags>(
      *cmd, [](const setting_key&) { return true; }, /*takes_file=*/true);
  cmd->callback([flags, config] {
    int rc = run_serve(*flags, *config);
    if (rc != 0) throw CLI::RuntimeError(rc);
  });
}

}  // namespace troupe::cli
