#pragma once
// Every atom of troupe's actor protocols, in one place: a message's first
// element names what it asks for.  Grouped by the protocol that uses them;
// the typed interfaces (messages/*.hpp) say what each message carries and
// answers.  An atom's text is at most 10 characters (CAF 0.17) and is
// unique across troupe: the same text is the same type everywhere.
#include <caf/atom.hpp>

namespace troupe {

// The instance protocol (messages/instance.hpp) and its token sinks.
using tokens_atom = caf::atom_constant<caf::atom("tokens")>;
using preempted_atom = caf::atom_constant<caf::atom("preempted")>;
using relocate_atom = caf::atom_constant<caf::atom("relocate")>;
using evacuate_atom = caf::atom_constant<caf::atom("evacuate")>;
using enqueue_atom = caf::atom_constant<caf::atom("enqueue")>;
using abort_atom = caf::atom_constant<caf::atom("abort")>;
using export_atom = caf::atom_constant<caf::atom("export")>;
using import_atom = caf::atom_constant<caf::atom("import")>;
using preempt_atom = caf::atom_constant<caf::atom("preempt")>;
using set_atom = caf::atom_constant<caf::atom("set")>;
using set_role_atom = caf::atom_constant<caf::atom("setrole")>;
using sequences_atom = caf::atom_constant<caf::atom("sequences")>;
using dp_join_atom = caf::atom_constant<caf::atom("dpjoin")>;
using dp_go_atom = caf::atom_constant<caf::atom("dpgo")>;

// The device protocol (messages/device.hpp).
using forward_atom = caf::atom_constant<caf::atom("forward")>;
// stepdone: the device actor's note to itself that its pipelined steps up to
// the given one (its own count) have ended on the device.
using step_done_atom = caf::atom_constant<caf::atom("stepdone")>;
using expert_stats_atom = caf::atom_constant<caf::atom("expstats")>;
using expert_prepare_atom = caf::atom_constant<caf::atom("expprepare")>;
using expert_commit_atom = caf::atom_constant<caf::atom("expcommit")>;
using expert_abort_atom = caf::atom_constant<caf::atom("expabort")>;
// A pipelined device moves layers between two neighbouring stages (admin).
using move_layers_atom = caf::atom_constant<caf::atom("movelayers")>;
// KV-head migration (runtime/device/head_group.hpp): a pipelined device
// moves a group of KV heads' attention to another stage (admin); a stage
// serves a donor's group (headguest) or sends its own group's to a helper
// (headroute).
using move_heads_atom = caf::atom_constant<caf::atom("moveheads")>;
using head_guest_atom = caf::atom_constant<caf::atom("headguest")>;
using head_route_atom = caf::atom_constant<caf::atom("headroute")>;
using info_atom = caf::atom_constant<caf::atom("info")>;
using read_pages_atom = caf::atom_constant<caf::atom("readpages")>;
using write_pages_atom = caf::atom_constant<caf::atom("writepages")>;
using copy_pages_atom = caf::atom_constant<caf::atom("copypages")>;

// The KV store protocols (messages/kv_pool.hpp), and stats and invariant
// checks everywhere.
using kv_put_atom = caf::atom_constant<caf::atom("kvput")>;
using kv_fetch_atom = caf::atom_constant<caf::atom("kvfetch")>;
using stats_atom = caf::atom_constant<caf::atom("stats")>;
using export_to_atom = caf::atom_constant<caf::atom("exportto")>;
using kv_stage_atom = caf::atom_constant<caf::atom("kvstage")>;
using peers_atom = caf::atom_constant<caf::atom("peers")>;
using kv_swap_put_atom = caf::atom_constant<caf::atom("kvswapput")>;
using kv_swap_take_atom = caf::atom_constant<caf::atom("kvswaptake")>;
using kv_swap_drop_atom = caf::atom_constant<caf::atom("kvswapdrop")>;

// The router protocol (messages/router.hpp).
using place_atom = caf::atom_constant<caf::atom("place")>;
using lookup_atom = caf::atom_constant<caf::atom("lookup")>;
using registry_atom = caf::atom_constant<caf::atom("registry")>;
using drain_instance_atom = caf::atom_constant<caf::atom("draininst")>;
using tick_atom = caf::atom_constant<caf::atom("tick")>;
using kill_instance_atom = caf::atom_constant<caf::atom("killinst")>;
using add_instances_atom = caf::atom_constant<caf::atom("addinst")>;
using nodes_atom = caf::atom_constant<caf::atom("nodes")>;
using place_decode_atom = caf::atom_constant<caf::atom("placedec")>;
using place_encode_atom = caf::atom_constant<caf::atom("placeenc")>;
using encoded_atom = caf::atom_constant<caf::atom("encoded")>;
using window_atom = caf::atom_constant<caf::atom("window")>;

// The gateway and request protocols (messages/gateway.hpp).
using requests_atom = caf::atom_constant<caf::atom("requests")>;
using reply_atom = caf::atom_constant<caf::atom("reply")>;
using trace_atom = caf::atom_constant<caf::atom("trace")>;
using traces_atom = caf::atom_constant<caf::atom("traces")>;
using drain_atom = caf::atom_constant<caf::atom("drain")>;
using poll_atom = caf::atom_constant<caf::atom("poll")>;
using cancel_atom = caf::atom_constant<caf::atom("cancel")>;
using deadline_atom = caf::atom_constant<caf::atom("deadline")>;
using admin_port_atom = caf::atom_constant<caf::atom("adminport")>;
using migrate_atom = caf::atom_constant<caf::atom("migrate")>;
using retry_atom = caf::atom_constant<caf::atom("retry")>;

// The service monitor protocol (messages/monitor.hpp).
using ttft_atom = caf::atom_constant<caf::atom("ttft")>;
using tpot_atom = caf::atom_constant<caf::atom("tpot")>;
using steps_atom = caf::atom_constant<caf::atom("steps")>;
using placed_atom = caf::atom_constant<caf::atom("placed")>;
using report_atom = caf::atom_constant<caf::atom("report")>;
using peek_atom = caf::atom_constant<caf::atom("peek")>;

// The node protocol (messages/node.hpp).
using host_atom = caf::atom_constant<caf::atom("host")>;
using resources_atom = caf::atom_constant<caf::atom("resources")>;
using leaving_atom = caf::atom_constant<caf::atom("leaving")>;
using grow_atom = caf::atom_constant<caf::atom("grow")>;
using spawn_instance_atom = caf::atom_constant<caf::atom("spawninst")>;
using spawn_stage_atom = caf::atom_constant<caf::atom("spawnstage")>;
// The service's node set (actors/node_set, issue 37).
using node_add_atom = caf::atom_constant<caf::atom("nodeadd")>;
using node_remove_atom = caf::atom_constant<caf::atom("noderemove")>;
using forget_node_atom = caf::atom_constant<caf::atom("nodeforget")>;
using detach_atom = caf::atom_constant<caf::atom("detach")>;
using shrink_atom = caf::atom_constant<caf::atom("shrink")>;
using forget_instance_atom = caf::atom_constant<caf::atom("instforget")>;

// The data-parallel group protocol (messages/dp_group.hpp).
using dp_admit_atom = caf::atom_constant<caf::atom("dpadmit")>;
using dp_status_atom = caf::atom_constant<caf::atom("dpstatus")>;
using dp_ready_atom = caf::atom_constant<caf::atom("dpready")>;
using dp_done_atom = caf::atom_constant<caf::atom("dpdone")>;
using dp_add_atom = caf::atom_constant<caf::atom("dpadd")>;

// The expert controller protocol (messages/expert_controller.hpp).
using expert_status_atom = caf::atom_constant<caf::atom("expstatus")>;
using expert_add_atom = caf::atom_constant<caf::atom("expadd")>;

// The admin protocol (messages/admin.hpp).
using instances_atom = caf::atom_constant<caf::atom("instances")>;
using kv_atom = caf::atom_constant<caf::atom("kv")>;

// The node link's own messages (actors/node_link).
using status_atom = caf::atom_constant<caf::atom("status")>;
using settled_atom = caf::atom_constant<caf::atom("settled")>;
using connect_now_atom = caf::atom_constant<caf::atom("connectnow")>;

// The node actor's own messages (actors/node).
using stop_atom = caf::atom_constant<caf::atom("stop")>;

// The encoder protocol (messages/encoder.hpp).
using encode_atom = caf::atom_constant<caf::atom("encode")>;

// The node actor's own messages (actors/node).
using reap_atom = caf::atom_constant<caf::atom("reap")>;
using node_load_atom = caf::atom_constant<caf::atom("nodeload")>;

}  // namespace troupe
