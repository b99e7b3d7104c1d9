#pragma once
// The cluster's TLS identity, derived from its shared secret (issue 10,
// docs/security.md "Cluster").  Every process that holds the secret derives
// the same Ed25519 key and the same self-signed certificate (Ed25519
// signatures are deterministic, and every field is fixed), and uses that
// certificate both as its own and as the only authority it trusts.  CAF's
// OpenSSL transport then requires a certificate on both sides of every
// middleman connection, so a peer without the secret fails the TLS
// handshake before a byte of CAF's protocol (BASP) is read or written.
#include <string>

namespace troupe {

struct cluster_identity {
  std::string dir;   // a fresh folder only this user may enter
  std::string cert;  // dir/cert.pem: the certificate (also the trusted CA)
  std::string key;   // dir/key.pem: the private key (mode 600)
};

// Derives the identity from `secret` and writes it to a fresh private
// folder under $TMPDIR, named troupe-cluster-<pid>-XXXXXX; first removes
// this user's such folders whose process is gone (killed before its exit
// cleanup).  Throws std::runtime_error when OpenSSL or the
// file system fails.
cluster_identity write_cluster_identity(const std::string& secret);

// Removes the folder (at exit).
void remove_cluster_identity(const cluster_identity& id);

// The SHA-256 fingerprint of the certificate `secret` derives, in hex: two
// processes share a cluster exactly when these match (logged at start,
// never the secret itself).
std::string cluster_fingerprint(const std::string& secret);

}  // namespace troupe
