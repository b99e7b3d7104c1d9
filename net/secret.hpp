#pragma once
// Shared secrets for the control endpoints (admin now, the cluster later):
// read from a file the owner alone may read, or made fresh and written to
// such a file so that the same user's tools find it, and compared in
// constant time.  A secret is a string of printable characters; the file's
// surrounding whitespace is not part of it.
#include <string>

namespace troupe {

// 32 random bytes from the OS, as 64 hex digits.
std::string make_secret();

// The secret in `path`.  Throws std::runtime_error naming the file when it
// cannot be read, is empty, or is readable by group or others (like ssh
// with a private key: a secret others can read protects nothing).
std::string read_secret_file(const std::string& path);

// Writes `secret` to `path` (mode 0600; its folder made 0700 if missing).
// Throws std::runtime_error naming the file when it cannot.
void write_secret_file(const std::string& path, const std::string& secret);

// The folder for one user's secrets: $TROUPE_RUN_DIR, else
// $XDG_RUNTIME_DIR/troupe, else ~/.cache/troupe/run.
std::string run_dir();

// Where `troupe serve` leaves the secrets it made for an endpoint on
// `port`, for the same user's `troupe client` / `troupe shell`, in
// run_dir().  `kind` is "admin" (control) or "admin-read" (read-only).
std::string run_secret_path(const std::string& kind, int port);

// Removes the endpoint secrets in run_dir() whose port no socket on this
// machine listens on: a server that crashed (or was killed -9) could not
// remove its own.  Returns how many went.  `troupe serve` calls it at start.
int remove_stale_run_secrets();

// The secret in `path`, made there first if the file does not exist (so a
// user's nodes and services on one machine share it with no set-up).
std::string read_or_make_secret_file(const std::string& path);

// a == b, in time that depends on the lengths only.
bool secrets_equal(const std::string& a, const std::string& b);

}  // namespace troupe
