// troupe: an LLM serving runtime.  This is the command-line entry point;
// each subcommand lives in its own file.
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <cstdio>
#include <exception>
#include <string>

#include "tools/troupe/common.hpp"

namespace troupe::cli {
void add_serve(CLI::App& app);   // cmd_serve.cpp
void add_client(CLI::App& app);  // cmd_client.cpp
}  // namespace troupe::cli

int main(int argc, char** argv) {
  // Logs go to stderr: stdout carries results (--json, ready lines).
  spdlog::set_default_logger(spdlog::stderr_color_mt("troupe"));
  CLI::App app{"troupe: serve and run large language models with OpenCL kernels on CAF actors"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "troupe 0.1.0");
  troupe::cli::add_generate(app);
  troupe::cli::add_perplexity(app);
  troupe::cli::add_bench(app);
  troupe::cli::add_serve(app);
  troupe::cli::add_node(app);
  troupe::cli::add_cluster(app);
  troupe::cli::add_shell(app);
  troupe::cli::add_client(app);
  troupe::cli::add_settings(app);
  // A word that names no command: said so (CLI11 would say only that a
  // subcommand is required).
  if (argc > 1 && argv[1][0] != '-') {
    std::string known;
    bool found = false;
    for (const auto* sc : app.get_subcommands([](CLI::App*) { return true; })) {
      found = found || sc->check_name(argv[1]);
      known += (known.empty() ? "" : ", ") + sc->get_name();
    }
    if (!found) {
      std::fprintf(stderr,
                   "error: unknown command '%s' (commands: %s; `troupe --help` says more)\n",
                   argv[1], known.c_str());
      return 2;
    }
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
