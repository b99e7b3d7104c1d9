// troupe shell: an operator's interactive shell over a live service's admin
// endpoint (issue 12).  On libedit: line editing, history kept in a file,
// tab completion of commands, request ids, instance ids and node addresses.
// Every read command prints a table for people or JSON (--json) for
// scripts; --exec "CMD; CMD" and a pipe on stdin run commands without a
// prompt.  A call never hangs: each has the admin timeout, and a server
// that stopped answering is reported with the way back (`reconnect`).
#include <editline/readline.h>
#include <poll.h>
#include <termios.h>
#include <unistd.h>

#include <sys/stat.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "runtime/common/user_text.hpp"
#include "tools/troupe/admin_link.hpp"
#include "tools/troupe/common.hpp"
#include "tools/troupe/shell_view.hpp"

namespace troupe::cli {

namespace {

using json = nlohmann::json;

struct shell_flags {
  admin_target target;
  std::string exec;
  bool json = false;
  std::string history_file;
};

// One command as typed: its name, positional words, --key value options
// and the --json switch.
struct command_line {
  std::string name;
  std::vector<std::string> args;
  std::map<std::string, std::string> opts;
  bool json = false;
};

command_line parse_words(const std::string& text) {
  std::istringstream in(text);
  std::vector<std::string> words;
  for (std::string w; in >> w;) words.push_back(w);
  command_line c;
  for (size_t i = 0; i < words.size(); ++i) {
    const auto& w = words[i];
    if (i == 0) {
      c.name = w;
    } else if (w == "--json") {
      c.json = true;
    } else if (w.rfind("--", 0) == 0 && w.size() > 2) {
      c.opts[w.substr(2)] = i + 1 < words.size() ? words[++i] : "";
    } else {
      c.args.push_back(w);
    }
  }
  return c;
}

// A failed command: what to tell the person, already worded.
struct failure {
  std::string message;
};

bool parse_id(const std::string& s, uint64_t& out) {
  if (s.empty() || s.find_first_not_of("0123456789") != std::string::npos) return false;
  try {
    out = std::stoull(s);
  } catch (const std::exception&) {
    return false;
  }
  return true;
}

class shell {
 public:
  explicit shell(shell_flags f) : flags_(std::move(f)), link_(flags_.target) {
    commands_ = make_commands();
  }
  shell(const shell&) = delete;  // the commands point at this shell
  shell& operator=(const shell&) = delete;

  // Runs `text` (commands separated by ';'); false when one failed.
  bool run_line(const std::string& text) {
    bool ok = true;
    std::stringstream parts(text);
    for (std::string part; std::getline(parts, part, ';');) {
      auto c = parse_words(part);
      if (c.name.empty()) continue;
      c.json = c.json || flags_.json;
      ok = run(c) && ok;
    }
    std::fflush(stdout);
    return ok;
  }

  bool quit() const { return quit_; }

  // Connects at start; false (said why) when the server does not answer.
  bool start() {
    if (link_.connect()) return true;
    std::fprintf(stderr, "error: %s\n", link_.why().c_str());
    return false;
  }

  std::vector<std::string> command_names() const {
    std::vector<std::string> out;
    for (const auto& c : commands()) out.push_back(c.name);
    return out;
  }

  // Completion candidates for the word being typed after `before`.
  std::vector<std::string> candidates(const std::string& before) {
    auto words = parse_words(before);
    const size_t index = before.empty() || before.back() == ' '
                             ? (words.name.empty() ? 0 : 1 + words.args.size())
                             : words.args.size();
    if (index == 0) return command_names();
    const std::string& cmd = words.name;
    auto ids = [&](const char* command, const char* key) {
      std::vector<std::string> out;
      auto r = link_.call(command);
      if (r.ok)
        for (const auto& x : r.result)
          if (x.contains(key)) out.push_back(x[key].dump());
      return out;
    };
    auto strings = [&](const char* command, const char* key) {
      std::vector<std::string> out;
      auto r = link_.call(command);
      if (r.ok)
        for (const auto& x : r.result) out.push_back(x.value(key, ""));
      return out;
    };
    if (cmd == "help") return command_names();
    if (cmd == "watch" && index == 1) return {"instances", "requests", "kv"};
    if ((cmd == "trace" || cmd == "cancel" || cmd == "preempt" || cmd == "migrate") && index == 1)
      return ids("requests", "id");
    if ((cmd == "migrate" && index == 2) || ((cmd == "drain" || cmd == "kill" || cmd == "kv" ||
                                              cmd == "role" || cmd == "layers" || cmd == "heads") &&
                                             index == 1))
      return ids("instances", "id");
    if (cmd == "role" && index == 2) return {"prefill", "decode", "mixed"};
    if (cmd == "set" && index == 1) {
      std::vector<std::string> live;  // the schema's live keys
      for (const auto& k : setting_keys())
        if (k.has(trait::live) && !k.alias()) live.push_back(k.key);
      return live;
    }
    if (cmd == "set" && index == 2 && words.args.size() >= 1)
      if (const auto* k = find_setting(words.args[0])) return k->rule.allowed;
    if (cmd == "spawn" && index == 1) return strings("nodes", "address");
    if (cmd == "node" && index == 1) return {"add", "remove"};
    if (cmd == "node" && index == 2 && !words.args.empty() && words.args[0] == "remove")
      return strings("nodes", "address");
    return {};
  }

 private:
  struct command {
    std::string name, usage, help;
    std::function<void(const command_line&)> run;
  };

  const std::vector<command>& commands() const { return commands_; }

  std::vector<command> make_commands() {
    shell* self = this;
    std::vector<command> c;
    auto add = [&](std::string name, std::string usage, std::string help,
                   std::function<void(const command_line&)> run) {
      c.push_back({std::move(name), std::move(usage), std::move(help), std::move(run)});
    };
    add("help", "help [COMMAND]", "list the commands, or say what one does",
        [self](const command_line& l) { self->help(l); });
    add("nodes", "nodes [--json]", "the cluster's nodes: address, state, instances, resources",
        [self](const command_line& l) { self->show("nodes", l, render_nodes); });
    add("instances", "instances [--json]",
        "the instances: role, state, queues, tokens in process, KV used/free, step time",
        [self](const command_line& l) { self->show("instances", l, render_instances); });
    add("requests", "requests [--instance ID] [--state S] [--json]",
        "the requests in flight: state, class, instance, tokens, TTFT, age",
        [self](const command_line& l) { self->requests(l); });
    add("trace", "trace ID [--json]",
        "one request's whole trace (placement, instances, migrations, recoveries)",
        [self](const command_line& l) { self->trace(l); });
    add("kv", "kv [INSTANCE] [--json]", "KV pages by state, prefix hit rate, utilization",
        [self](const command_line& l) { self->kv(l); });
    add("dp", "dp [--json]",
        "the data-parallel group: KV tokens per replica, gap, moves, lockstep waits",
        [self](const command_line& l) { self->show("dp", l, render_dp); });
    add("experts", "experts [--json]",
        "the expert controller: imbalance and placement per layer, swaps, busy time",
        [self](const command_line& l) { self->show("experts", l, render_experts); });
    add("metrics", "metrics [--json]", "the service's headline figures",
        [self](const command_line& l) { self->metrics(l); });
    add("config", "config [--json]", "the service's effective configuration",
        [self](const command_line& l) {
          auto r = self->must("config", json::object());
          self->print(l, r, [](const json& j) { return render_fields(j); });
        });
    add("watch", "watch [instances|requests|kv] [--interval S] [--count N]",
        "a view refreshed in place until a key is pressed (or N times)",
        [self](const command_line& l) { self->watch(l); });
    add("cancel", "cancel ID", "cancel a request in flight",
        [self](const command_line& l) { self->cancel(l); });
    add("migrate", "migrate ID INSTANCE",
        "move a request in flight to another instance, KV and all", [self](const command_line& l) {
          self->control(l, "migrate",
                        {{"id", self->id_arg(l, 0, "a request id")},
                         {"instance", self->id_arg(l, 1, "an instance id")}});
        });
    add("drain", "drain INSTANCE",
        "stop placing on an instance and move its requests off; returns once it is empty",
        [self](const command_line& l) {
          self->control(l, "drain", {{"instance", self->id_arg(l, 0, "an instance id")}});
        });
    add("kill", "kill INSTANCE",
        "fault injection: kill an instance as a crash would (its requests recover elsewhere)",
        [self](const command_line& l) {
          self->control(l, "kill", {{"instance", self->id_arg(l, 0, "an instance id")}});
        });
    add("preempt", "preempt ID",
        "preempt a running request as the scheduler does when KV runs short (swap or "
        "recompute); it runs again when its turn comes",
        [self](const command_line& l) {
          self->control(l, "preempt", {{"id", self->id_arg(l, 0, "a request id")}});
        });
    add("role", "role INSTANCE prefill|decode|mixed|encode",
        "give an instance a new role: it takes new work of that role at once and finishes its "
        "old work (pool X->Y, then Y)",
        [self](const command_line& l) {
          const uint64_t id = self->id_arg(l, 0, "an instance id");
          if (l.args.size() < 2 || !parse_role(l.args[1]))
            throw failure{"role: give prefill, decode, mixed or encode (" + self->usage_of("role") +
                          ")"};
          self->control(l, "role", {{"instance", id}, {"role", l.args[1]}});
        });
    add("layers", "layers INSTANCE FROM TO N",
        "move N layers, weights and KV, from stage FROM of an instance's pipelined device to its "
        "neighbour TO, between two steps (engine.pipeline_parallel); returns once moved",
        [self](const command_line& l) {
          const uint64_t id = self->id_arg(l, 0, "an instance id");
          uint64_t from = 0, to = 0, n = 0;
          if (l.args.size() < 4 || !parse_id(l.args[1], from) || !parse_id(l.args[2], to) ||
              !parse_id(l.args[3], n))
            throw failure{"layers: give the instance, two neighbouring stages and a count (" +
                          self->usage_of("layers") + ")"};
          self->control(l, "layers", {{"instance", id}, {"from", from}, {"to", to}, {"layers", n}});
        });
    add("heads", "heads INSTANCE FROM TO N",
        "move the attention of N KV heads of stage FROM's layers, with their KV pages, to stage TO "
        "of an instance's pipelined device, between two steps; N 0 brings them home",
        [self](const command_line& l) {
          const uint64_t id = self->id_arg(l, 0, "an instance id");
          uint64_t from = 0, to = 0, n = 0;
          if (l.args.size() < 4 || !parse_id(l.args[1], from) || !parse_id(l.args[2], to) ||
              !parse_id(l.args[3], n))
            throw failure{"heads: give the instance, two stages and a count (" +
                          self->usage_of("heads") + ")"};
          self->control(l, "heads", {{"instance", id}, {"from", from}, {"to", to}, {"heads", n}});
        });
    add("spawn", "spawn NODE [N]",
        "start N more instances (default 1) on a node, like the ones the service has there",
        [self](const command_line& l) {
          if (l.args.empty())
            throw failure{"spawn: give a node address (" + self->usage_of("spawn") + ")"};
          uint64_t n = 1;
          if (l.args.size() > 1 && !parse_id(l.args[1], n))
            throw failure{"spawn: N must be a count, not '" + l.args[1] + "'"};
          self->control(l, "spawn", {{"node", l.args[0]}, {"count", n}});
        });
    add("node", "node add HOST:PORT [N] | node remove HOST:PORT",
        "a troupe node joins the service with N instances (default 1), or leaves it: its "
        "instances drain (their requests move elsewhere) and are released on the node",
        [self](const command_line& l) {
          const bool adding = !l.args.empty() && l.args[0] == "add";
          if (l.args.size() < 2 || (!adding && l.args[0] != "remove") ||
              (!adding && l.args.size() != 2) || l.args.size() > 3)
            throw failure{"node: give add or remove and an address (" + self->usage_of("node") +
                          ")"};
          if (!adding) return self->control(l, "node_remove", {{"node", l.args[1]}});
          uint64_t n = 1;
          if (l.args.size() > 2 && !parse_id(l.args[2], n))
            throw failure{"node add: N must be a count, not '" + l.args[2] + "'"};
          self->control(l, "node_add", {{"node", l.args[1]}, {"count", n}});
        });
    add("set", "set KEY VALUE",
        "change a setting live: " + keys_with(trait::live) +
            " (troupe settings lists them; engine keys change on every instance)",
        [self](const command_line& l) {
          if (l.args.size() != 2)
            throw failure{"set: give a key and a value (" + self->usage_of("set") + ")"};
          self->control(l, "set", {{"key", l.args[0]}, {"value", l.args[1]}});
        });
    add("reconnect", "reconnect", "find the server's admin endpoint again",
        [self](const command_line&) {
          if (!self->link_.connect()) throw failure{self->link_.why()};
          std::printf("connected to %s\n", self->link_.where().c_str());
        });
    add("quit", "quit", "leave the shell (also exit, Ctrl-D)",
        [self](const command_line&) { self->quit_ = true; });
    add("exit", "exit", "leave the shell", [self](const command_line&) { self->quit_ = true; });
    return c;
  }

  bool run(const command_line& l) {
    for (const auto& c : commands())
      if (c.name == l.name) {
        try {
          c.run(l);
          return true;
        } catch (const failure& f) {
          std::fprintf(stderr, "error: %s\n", f.message.c_str());
          return false;
        }
      }
    const auto near = nearest(l.name, command_names());
    std::fprintf(stderr, "error: unknown command '%s'%s (help lists the commands)\n",
                 l.name.c_str(), near.empty() ? "" : ("; did you mean '" + near + "'?").c_str());
    return false;
  }

  // One admin call; a failure becomes what to tell the person.
  json must(const std::string& cmd, json args = json::object()) {
    // A layer move answers once done: loading two stages, copying their KV.
    auto r = link_.call(cmd, std::move(args),
                        cmd == "layers" || cmd == "heads" ? k_layer_move_wait_ms : 0);
    if (r.ok) return r.result;
    if (r.code == "timeout" || r.code == "unreachable")
      throw failure{r.message + "; the server may be gone: 'reconnect' tries again"};
    throw failure{cmd + ": " + r.code + ": " + r.message};
  }

  void print(const command_line& l, const json& j,
             const std::function<std::string(const json&)>& render) {
    if (l.json)
      std::printf("%s\n", j.dump().c_str());
    else
      std::fputs(render(j).c_str(), stdout);
  }

  void show(const std::string& cmd, const command_line& l, std::string (*render)(const json&)) {
    print(l, must(cmd), render);
  }

  uint64_t id_arg(const command_line& l, size_t i, const char* what) {
    uint64_t id = 0;
    if (i >= l.args.size() || !parse_id(l.args[i], id))
      throw failure{l.name + ": give " + what +
                    (i < l.args.size() ? ", not '" + l.args[i] + "'" : std::string()) + " (" +
                    usage_of(l.name) + ")"};
    return id;
  }

  std::string usage_of(const std::string& name) const {
    for (const auto& c : commands())
      if (c.name == name) return "usage: " + c.usage;
    return {};
  }

  void help(const command_line& l) {
    if (!l.args.empty()) {
      for (const auto& c : commands())
        if (c.name == l.args[0]) {
          std::printf("%s\n  %s\n", c.usage.c_str(), c.help.c_str());
          return;
        }
      const auto near = nearest(l.args[0], command_names());
      throw failure{"help: no command '" + l.args[0] + "'" +
                    (near.empty() ? "" : "; did you mean '" + near + "'?")};
    }
    for (const auto& c : commands()) std::printf("  %-58s %s\n", c.usage.c_str(), c.help.c_str());
  }

  json filtered_requests(const command_line& l) {
    json all = must("requests");
    json out = json::array();
    uint64_t inst = 0;
    const bool by_inst = l.opts.count("instance");
    if (by_inst && !parse_id(l.opts.at("instance"), inst))
      throw failure{"requests: --instance needs an instance id"};
    for (const auto& r : all) {
      if (by_inst && r.value("instance", uint64_t(0)) != inst) continue;
      if (l.opts.count("state") && r.value("state", "") != l.opts.at("state")) continue;
      out.push_back(r);
    }
    return out;
  }

  void requests(const command_line& l) { print(l, filtered_requests(l), render_requests); }

  void trace(const command_line& l) {
    const uint64_t id = id_arg(l, 0, "a request id");
    print(l, must("trace", {{"id", id}}), [](const json& j) { return render_fields(j); });
  }

  void kv(const command_line& l) {
    if (l.args.empty()) return print(l, must("kv"), render_kv);
    const uint64_t id = id_arg(l, 0, "an instance id");
    for (const auto& i : must("instances"))
      if (i.value("id", uint64_t(0)) == id)
        return print(l, i.value("kv", json::object()), render_kv);
    throw failure{"kv: no instance " + std::to_string(id) + " (instances lists them)"};
  }

  void metrics(const command_line& l) {
    print(l, headline_metrics(must("instances"), must("requests")),
          [](const json& j) { return render_fields(j); });
  }

  void cancel(const command_line& l) {
    const uint64_t id = id_arg(l, 0, "a request id");
    auto r = must("cancel", {{"id", id}});
    if (r.value("cancelled", 0) == 0)
      throw failure{"cancel: no request with id " + std::to_string(id) + " in flight"};
    print(l, r, [](const json& j) { return render_fields(j); });
  }

  void control(const command_line& l, const std::string& cmd, json args) {
    print(l, must(cmd, std::move(args)),
          [&](const json& j) { return cmd + ": done\n" + render_fields(j, "  "); });
  }

  // Refreshes a view every --interval seconds until a key is pressed (on
  // a terminal) or --count refreshes are done (1 when not on a terminal).
  void watch(const command_line& l) {
    const std::string view = l.args.empty() ? "instances" : l.args[0];
    if (view != "instances" && view != "requests" && view != "kv")
      throw failure{"watch: no view '" + view + "' (instances, requests, kv)"};
    double interval = 1.0;
    if (l.opts.count("interval")) {
      try {
        interval = std::stod(l.opts.at("interval"));
      } catch (const std::exception&) {
        interval = -1;
      }
      if (!(interval >= 0.05 && interval <= 3600))
        throw failure{"watch: --interval must be seconds in [0.05, 3600]"};
    }
    const bool tty = ::isatty(STDIN_FILENO) && ::isatty(STDOUT_FILENO);
    long count = tty ? 0 : 1;
    if (l.opts.count("count")) {
      const std::string& c = l.opts.at("count");
      if (!whole_text_as(c, count) || count < 0 || count > 1000000)
        throw failure{"watch: --count must be refreshes in [0, 1000000] (0: until a key)"};
      // Off a terminal no key can end it.
      if (count == 0 && !tty)
        throw failure{"watch: --count 0 runs until a key, which needs a terminal; give 1 or more"};
    }
    termios saved{};
    if (tty) {
      ::tcgetattr(STDIN_FILENO, &saved);
      termios raw = saved;
      raw.c_lflag &= ~(ICANON | ECHO);
      raw.c_cc[VMIN] = 0;
      raw.c_cc[VTIME] = 0;
      ::tcsetattr(STDIN_FILENO, TCSANOW, &raw);
    }
    auto restore = [&] {
      if (tty) ::tcsetattr(STDIN_FILENO, TCSANOW, &saved);
    };
    try {
      for (long n = 1;; ++n) {
        std::string body;
        if (view == "instances")
          body = render_instances(must("instances"));
        else if (view == "requests")
          body = render_requests(filtered_requests(l));
        else
          body = render_kv(must("kv"));
        if (tty) std::fputs("\033[H\033[2J", stdout);
        std::printf("watch %s every %.2g s (refresh %ld%s)\n%s", view.c_str(), interval, n,
                    tty ? "; any key leaves" : "", body.c_str());
        std::fflush(stdout);
        if (count > 0 && n >= count) break;
        const auto wait_ms = static_cast<int>(interval * 1000);
        if (tty) {
          pollfd p{STDIN_FILENO, POLLIN, 0};
          if (::poll(&p, 1, wait_ms) > 0) {
            char ch;
            (void)!::read(STDIN_FILENO, &ch, 1);
            break;
          }
        } else {
          std::this_thread::sleep_for(std::chrono::milliseconds(wait_ms));
        }
      }
    } catch (...) {
      restore();
      throw;
    }
    restore();
  }

  shell_flags flags_;
  admin_link link_;
  std::vector<command> commands_;
  bool quit_ = false;
};

// libedit calls back with no context: the shell being completed for.
shell* completing = nullptr;
std::vector<std::string> matches;

char* next_match(const char* text, int state) {
  static size_t at = 0;
  if (state == 0) at = 0;
  const std::string prefix(text);
  while (at < matches.size()) {
    const auto& m = matches[at++];
    if (m.rfind(prefix, 0) == 0) return ::strdup(m.c_str());
  }
  return nullptr;
}

char** complete(const char* text, int start, int) {
  rl_attempted_completion_over = 1;
  matches = completing ? completing->candidates(std::string(rl_line_buffer, start))
                       : std::vector<std::string>{};
  return rl_completion_matches(text, next_match);
}

std::string default_history() {
  const char* home = std::getenv("HOME");
  return std::string(home && *home ? home : ".") + "/.troupe_shell_history";
}

// Why the history file must not be used, or "" when it may: libedit reads
// only its own format (first line _HiStOrY_V2_) and rewrites the file after
// each command, so another file (a bash history, notes) would be lost, and
// a device such as /dev/zero would be read without end.
std::string history_refusal(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return {};  // made on the first command
  if (!S_ISREG(st.st_mode)) return "not a regular file";
  if (st.st_size == 0) return {};
  std::ifstream in(path, std::ios::binary);
  std::string first;
  std::getline(in, first);
  if (first != "_HiStOrY_V2_") return "not a troupe shell (libedit) history, left as it is";
  return {};
}

int run_shell(shell_flags& f) {
  shell sh(f);
  if (!f.exec.empty()) {
    if (!sh.start()) return 1;
    return sh.run_line(f.exec) ? 0 : 1;
  }
  const bool tty = ::isatty(STDIN_FILENO);
  if (!tty) {
    // Commands from a pipe: each line in turn, no prompt.
    if (!sh.start()) return 1;
    bool ok = true;
    for (std::string line; !sh.quit() && std::getline(std::cin, line);)
      ok = sh.run_line(line) && ok;
    return ok ? 0 : 1;
  }
  if (sh.start())
    std::printf("troupe shell: connected; 'help' lists the commands, Tab completes\n");
  else
    std::printf("troupe shell: not connected; 'reconnect' tries again\n");
  std::string history = f.history_file.empty() ? default_history() : f.history_file;
  if (const auto why = history_refusal(history); !why.empty()) {
    std::fprintf(stderr, "troupe shell: no history kept in %s: %s\n", history.c_str(), why.c_str());
    history.clear();
  }
  using_history();
  if (!history.empty()) read_history(history.c_str());
  completing = &sh;
  rl_attempted_completion_function = complete;
  while (!sh.quit()) {
    char* raw = readline("troupe> ");
    if (!raw) {
      std::printf("\n");
      break;
    }
    std::string line(raw);
    std::free(raw);
    if (line.find_first_not_of(" \t") == std::string::npos) continue;
    add_history(line.c_str());
    if (!history.empty()) write_history(history.c_str());
    sh.run_line(line);
  }
  completing = nullptr;
  return 0;
}

}  // namespace

void add_shell(CLI::App& app) {
  auto f = std::make_shared<shell_flags>();
  auto* cmd = app.add_subcommand(
      "shell", "an interactive shell to inspect and steer a running troupe serve (admin)");
  cmd->add_option("-s,--server", f->target.server,
                  "the server's client endpoint; its Pong names the admin port")
      ->default_val("tcp://127.0.0.1:5555");
  add_admin_target_flags(*cmd, f->target, 5000);
  cmd->add_option("-e,--exec", f->exec,
                  "run these commands (separated by ';') and exit: non-zero when one fails");
  cmd->add_flag("--json", f->json, "JSON output for every command (one document a line)");
  cmd->add_option("--history-file", f->history_file,
                  "where the command history is kept (default ~/.troupe_shell_history)");
  cmd->callback([f] {
    int rc = run_shell(*f);
    if (rc != 0) throw CLI::RuntimeError(rc);
  });
}

}  // namespace troupe::cli
