#include "net/cluster_tls.hpp"

#include <arpa/inet.h>
#include <dlfcn.h>
#include <netinet/in.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <stdexcept>
#include <thread>
#include <unordered_map>

namespace troupe {

namespace {

template <class T, void (*Free)(T*)>
struct deleter {
  void operator()(T* p) const { Free(p); }
};
using pkey_ptr = std::unique_ptr<EVP_PKEY, deleter<EVP_PKEY, EVP_PKEY_free>>;
using x509_ptr = std::unique_ptr<X509, deleter<X509, X509_free>>;

[[noreturn]] void fail(const std::string& what) {
  char buf[256] = "";
  if (auto e = ERR_get_error()) ERR_error_string_n(e, buf, sizeof buf);
  throw std::runtime_error("cluster identity: " + what + (buf[0] ? std::string(": ") + buf : ""));
}

// The key: 32 bytes of SHA-256 over a label and the secret.  The label
// keeps this key apart from any other use of the same secret.
pkey_ptr derive_key(const std::string& secret) {
  const std::string input = "troupe cluster identity v1\n" + secret;
  unsigned char seed[32];
  unsigned int n = 0;
  if (EVP_Digest(input.data(), input.size(), seed, &n, EVP_sha256(), nullptr) != 1 || n != 32)
    fail("SHA-256");
  pkey_ptr key(EVP_PKEY_new_raw_private_key(EVP_PKEY_ED25519, nullptr, seed, sizeof seed));
  OPENSSL_cleanse(seed, sizeof seed);
  if (!key) fail("Ed25519 key");
  return key;
}

// A self-signed certificate with fixed fields: the same secret gives the
// same bytes in every process.
x509_ptr make_certificate(EVP_PKEY* key) {
  x509_ptr x(X509_new());
  if (!x) fail("X509_new");
  X509_set_version(x.get(), 2);
  ASN1_INTEGER_set(X509_get_serialNumber(x.get()), 1);
  if (ASN1_TIME_set_string_X509(X509_getm_notBefore(x.get()), "20200101000000Z") != 1 ||
      ASN1_TIME_set_string_X509(X509_getm_notAfter(x.get()), "20991231235959Z") != 1)
    fail("validity");
  X509_NAME* name = X509_get_subject_name(x.get());
  X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC,
                             reinterpret_cast<const unsigned char*>("troupe cluster"), -1, -1, 0);
  X509_set_issuer_name(x.get(), name);
  if (X509_set_pubkey(x.get(), key) != 1) fail("public key");
  X509V3_CTX ctx;
  X509V3_set_ctx(&ctx, x.get(), x.get(), nullptr, nullptr, 0);
  X509_EXTENSION* ext =
      X509V3_EXT_conf_nid(nullptr, &ctx, NID_basic_constraints, "critical,CA:TRUE");
  if (!ext) fail("basicConstraints");
  X509_add_ext(x.get(), ext, -1);
  X509_EXTENSION_free(ext);
  if (X509_sign(x.get(), key, nullptr) <= 0) fail("signing");
  return x;
}

void write_pem(const std::string& path, const std::function<int(FILE*)>& write) {
  const mode_t old = ::umask(077);
  FILE* f = std::fopen(path.c_str(), "wb");
  ::umask(old);
  if (!f) throw std::runtime_error("cluster identity: cannot write " + path);
  const int ok = write(f);
  if (std::fclose(f) != 0 || ok != 1)
    throw std::runtime_error("cluster identity: cannot write " + path);
}

// "127.0.0.1:41234" for the socket's peer, or "?" when it has none.
std::string peer_of(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  if (fd < 0 || ::getpeername(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return "?";
  char host[INET6_ADDRSTRLEN] = "?";
  int port = 0;
  if (ss.ss_family == AF_INET) {
    auto* a = reinterpret_cast<sockaddr_in*>(&ss);
    ::inet_ntop(AF_INET, &a->sin_addr, host, sizeof host);
    port = ntohs(a->sin_port);
  } else if (ss.ss_family == AF_INET6) {
    auto* a = reinterpret_cast<sockaddr_in6*>(&ss);
    ::inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof host);
    port = ntohs(a->sin6_port);
  }
  return std::string(host) + ":" + std::to_string(port);
}

// Why a handshake step failed, without taking the error off OpenSSL's
// queue (CAF reads it after us).
std::string handshake_failure(SSL* ssl, int ret) {
  const int err = SSL_get_error(ssl, ret);
  if (err == SSL_ERROR_WANT_READ || err == SSL_ERROR_WANT_WRITE) return {};
  if (auto e = ERR_peek_last_error()) {
    char buf[256];
    ERR_error_string_n(e, buf, sizeof buf);
    return buf;
  }
  return err == SSL_ERROR_SYSCALL || err == SSL_ERROR_ZERO_RETURN
             ? "the peer closed the connection during the TLS handshake"
             : "TLS error " + std::to_string(err);
}

}  // namespace

// The identity folders' names: this prefix, the writer's pid, a dash, and
// mkdtemp's six characters.
constexpr const char* k_identity_prefix = "troupe-cluster-";

// Folders of processes that are gone: one killed (SIGKILL, a crash) never
// ran its exit cleanup, and its folder, named after its pid, stayed.
static void remove_stale_identities(const std::filesystem::path& tmp) {
  namespace fs = std::filesystem;
  std::error_code ec;
  // error_code forms throughout: a folder that cannot be read is skipped,
  // never an error of the node starting.
  for (fs::directory_iterator it(tmp, ec); !ec && it != fs::directory_iterator();
       it.increment(ec)) {
    const fs::directory_entry& e = *it;
    const std::string name = e.path().filename().string();
    const std::string prefix = k_identity_prefix;
    if (name.rfind(prefix, 0) != 0) continue;
    const auto dash = name.find('-', prefix.size());
    if (dash == std::string::npos) continue;  // an older unnamed folder: leave it
    const std::string pid_text = name.substr(prefix.size(), dash - prefix.size());
    // A pid has at most 7 digits on Linux (pid_max <= 2^22); 9 keeps
    // std::stol in range, and longer names are not ours.
    if (pid_text.empty() || pid_text.size() > 9 ||
        pid_text.find_first_not_of("0123456789") != std::string::npos)
      continue;
    struct stat st {};
    // Only this user's folders, and only where the pid no longer runs.
    if (::stat(e.path().c_str(), &st) != 0 || st.st_uid != ::getuid()) continue;
    const pid_t pid = static_cast<pid_t>(std::stol(pid_text));
    if (::kill(pid, 0) == 0 || errno != ESRCH) continue;
    std::error_code rm;
    fs::remove_all(e.path(), rm);
  }
}

cluster_identity write_cluster_identity(const std::string& secret) {
  if (secret.empty()) throw std::runtime_error("cluster identity: the secret is empty");
  auto key = derive_key(secret);
  auto cert = make_certificate(key.get());
  const char* tmp = std::getenv("TMPDIR");
  const std::string dir = tmp && *tmp ? tmp : "/tmp";
  remove_stale_identities(dir);
  std::string templ = dir + "/" + k_identity_prefix + std::to_string(::getpid()) + "-XXXXXX";
  if (!::mkdtemp(templ.data()))
    throw std::runtime_error("cluster identity: cannot make a folder like " + templ);
  cluster_identity id{templ, templ + "/cert.pem", templ + "/key.pem"};
  write_pem(id.key, [&](FILE* f) {
    return PEM_write_PrivateKey(f, key.get(), nullptr, nullptr, 0, nullptr, nullptr);
  });
  write_pem(id.cert, [&](FILE* f) { return PEM_write_X509(f, cert.get()); });
  return id;
}

void remove_cluster_identity(const cluster_identity& id) {
  std::error_code ec;
  if (!id.dir.empty()) std::filesystem::remove_all(id.dir, ec);
}

std::string cluster_fingerprint(const std::string& secret) {
  auto key = derive_key(secret);
  auto cert = make_certificate(key.get());
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  if (X509_digest(cert.get(), EVP_sha256(), md, &n) != 1) fail("fingerprint");
  static const char* hex = "0123456789abcdef";
  std::string out;
  for (unsigned int i = 0; i < n; ++i) {
    out += hex[md[i] >> 4];
    out += hex[md[i] & 15];
  }
  return out;
}

}  // namespace troupe

// CAF's OpenSSL transport (libcaf_openssl 0.17) makes its own SSL objects
// and offers no hook, so these wrap OpenSSL's handshake and I/O calls for
// the whole process (the executable's definitions come first in symbol
// lookup, so libcaf_openssl calls them; each calls OpenSSL's own).  They do
// two things:
// - Clear the thread's OpenSSL error queue before each call, as OpenSSL
//   requires for SSL_get_error to be right.  CAF does not, so an error left
//   by one connection (a node killed: "unexpected eof") made CAF's next
//   read on another, healthy connection fail too, and every node was lost
//   with the one that died.
// - Log a failed handshake with the peer's address (issue 10: a refused
//   peer is logged).
namespace {

template <class Fn>
Fn real_fn(const char* name) {
  return reinterpret_cast<Fn>(::dlsym(RTLD_NEXT, name));
}

// The peer of a handshake in progress, taken on its first step: by the
// time a handshake fails the peer may have closed, and getpeername with it.
// CAF drives each connection's handshake on one thread (the multiplexer's).
std::unordered_map<SSL*, std::string>& handshake_peers() {
  thread_local std::unordered_map<SSL*, std::string> peers;
  return peers;
}

void handshake_peer_forget(SSL* ssl) {
  handshake_peers().erase(ssl);
}

std::string& handshake_peer(SSL* ssl) {
  auto [it, fresh] = handshake_peers().try_emplace(ssl);
  if (fresh) it->second = troupe::peer_of(SSL_get_fd(ssl));
  return it->second;
}

void handshake_done(SSL* ssl, int ret, const char* format) {
  const std::string peer = handshake_peer(ssl);
  if (ret == 1) {
    handshake_peer_forget(ssl);
    return;
  }
  auto why = troupe::handshake_failure(ssl, ret);
  if (why.empty()) return;  // wants more I/O
  handshake_peer_forget(ssl);
  // A flood of connections would flood the log: the first few failures of
  // each 10 s are logged, the rest counted in one line when the next
  // failure comes after that.
  struct log_window {
    std::chrono::steady_clock::time_point start;
    int logged = 0, dropped = 0;
  };
  static std::mutex mutex;  // the multiplexer's thread and the middleman's
  static log_window w;
  const std::lock_guard<std::mutex> lock(mutex);
  const auto now = std::chrono::steady_clock::now();
  if (now - w.start > std::chrono::seconds(10)) {
    if (w.dropped > 0)
      spdlog::warn("cluster: {} more failed TLS handshakes were not logged (five are, each 10 s)",
                   w.dropped);
    w = {now, 0, 0};
  }
  if (w.logged >= 5) {
    ++w.dropped;
    return;
  }
  ++w.logged;
  spdlog::warn(fmt::runtime(format), peer, why);
}

// CAF 0.17's OpenSSL transport spins in its poll loop while a handshake
// waits to read before it can write (actor-framework issue #1060, fixed in
// 0.18): one idle TCP connection to a node's port kept a core at 100% for
// as long as it stayed open, and thousands slowed the node's accepts to
// 40 a second.  So:
// - a handshake waiting on its peer pauses the loop k_handshake_pause at
//   each turn (a peer that is talking is not slowed: its bytes end the
//   wait);
// - at most k_accepts_waiting handshakes a peer opened wait at once: one
//   more fails the oldest waiting (a peer that talks finishes in
//   milliseconds, so the oldest is the likeliest idle), which bounds what
//   the pauses add to every turn of the loop, established links' too, to
//   k_accepts_waiting pauses; the service's own dials are not counted
//   (they are few, and bounded by CAF's connection timeout);
// - a handshake not done within k_handshake_deadline fails.  (CAF has no
//   handshake timeout of its own; without the spin none would be needed.)
// A failed handshake closes its connection.  Clocks start in the handshake
// calls only; reads and writes only end them.
constexpr auto k_handshake_deadline = std::chrono::seconds(10);
constexpr auto k_handshake_pause = std::chrono::microseconds(200);
constexpr size_t k_accepts_waiting = 8;

struct handshake_clock {
  std::chrono::steady_clock::time_point start;
  uint64_t serial = 0;  // accepted handshakes' order; 0: a dial
};

// The accepted handshakes waiting, by serial; those below `evicted` fail
// at their next call.  CAF's multiplexer thread makes most calls, the
// middleman's some (a dial's first step): a mutex.
std::mutex accepts_mutex;
std::set<uint64_t> accepts_waiting;
uint64_t accepts_serial = 0, accepts_evicted = 0;

void forget_clock(handshake_clock* c) {
  if (c->serial != 0) {
    const std::lock_guard<std::mutex> lock(accepts_mutex);
    accepts_waiting.erase(c->serial);
  }
  delete c;
}

int handshake_clock_index() {
  static const int index = SSL_get_ex_new_index(
      0, nullptr, nullptr, nullptr, [](void*, void* p, CRYPTO_EX_DATA*, int, long, void*) {
        if (p) forget_clock(static_cast<handshake_clock*>(p));
      });
  return index;
}

void end_clock(SSL* ssl, handshake_clock* clock) {
  SSL_set_ex_data(ssl, handshake_clock_index(), nullptr);  // the free callback then sees none
  forget_clock(clock);
}

// Fails the call: SSL_get_error then says SSL_ERROR_SSL and CAF closes the
// connection; handshake_done reports it.
int fail_handshake(SSL* ssl, handshake_clock* clock) {
  end_clock(ssl, clock);
  ERR_raise(ERR_LIB_SSL, SSL_R_READ_TIMEOUT_EXPIRED);
  return -1;
}

// After a call that returned `ret` (`handshake`: SSL_accept or
// SSL_connect): while the handshake is unfinished and waits for I/O,
// pause, or fail the call where the rules above say.  Returns the value to
// return.
int handshake_waiting(SSL* ssl, int ret, bool handshake) {
  auto* clock = static_cast<handshake_clock*>(SSL_get_ex_data(ssl, handshake_clock_index()));
  if (ret > 0 || SSL_is_init_finished(ssl)) {
    if (clock) end_clock(ssl, clock);  // done: a later call never meets this clock
    return ret;
  }
  const int err = SSL_get_error(ssl, ret);
  if (err != SSL_ERROR_WANT_READ && err != SSL_ERROR_WANT_WRITE) {
    if (clock) end_clock(ssl, clock);  // failed: its connection closes
    return ret;
  }
  if (!clock && !handshake) return ret;
  const auto now = std::chrono::steady_clock::now();
  if (!clock) {
    clock = new handshake_clock{now, 0};
    if (SSL_is_server(ssl) == 1) {
      const std::lock_guard<std::mutex> lock(accepts_mutex);
      clock->serial = ++accepts_serial;
      accepts_waiting.insert(clock->serial);
      if (accepts_waiting.size() > k_accepts_waiting) {  // serials below are gone already
        accepts_evicted = *accepts_waiting.begin() + 1;
        accepts_waiting.erase(accepts_waiting.begin());
      }
    }
    SSL_set_ex_data(ssl, handshake_clock_index(), clock);
  }
  bool evicted = false;
  if (clock->serial != 0) {
    const std::lock_guard<std::mutex> lock(accepts_mutex);
    evicted = clock->serial < accepts_evicted;
  }
  if (evicted || now - clock->start > k_handshake_deadline) return fail_handshake(ssl, clock);
  if (err == SSL_ERROR_WANT_READ) std::this_thread::sleep_for(k_handshake_pause);
  return ret;
}

}  // namespace

extern "C" int SSL_accept(SSL* ssl) {
  static const auto real = real_fn<int (*)(SSL*)>("SSL_accept");
  ERR_clear_error();
  handshake_peer(ssl);
  const int ret = handshake_waiting(ssl, real(ssl), true);
  handshake_done(ssl, ret,
                 "cluster: refused a peer at {}: TLS handshake failed ({}); a peer must hold the "
                 "cluster secret");
  return ret;
}

extern "C" int SSL_connect(SSL* ssl) {
  static const auto real = real_fn<int (*)(SSL*)>("SSL_connect");
  ERR_clear_error();
  handshake_peer(ssl);
  const int ret = handshake_waiting(ssl, real(ssl), true);
  handshake_done(ssl, ret,
                 "cluster: TLS handshake with {} failed ({}); does it hold the same cluster "
                 "secret?");
  return ret;
}

extern "C" int SSL_read(SSL* ssl, void* buf, int num) {
  static const auto real = real_fn<int (*)(SSL*, void*, int)>("SSL_read");
  ERR_clear_error();
  return handshake_waiting(ssl, real(ssl, buf, num), false);
}

extern "C" int SSL_write(SSL* ssl, const void* buf, int num) {
  static const auto real = real_fn<int (*)(SSL*, const void*, int)>("SSL_write");
  ERR_clear_error();
  return handshake_waiting(ssl, real(ssl, buf, num), false);
}
