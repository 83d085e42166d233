// dali_mesh: the credentials of the remote stores (see http_store.h): given to the process
// (SetStoreCredentials, from Python's storage_options or the environment), kept in its memory only,
// one set per store spec; never in a spec, a message or a plan.
#include <map>
#include <mutex>
#include <string>

#include "storage/http_store.h"

namespace dali_mesh {

namespace {

// never destroyed: a kept thread may still send a request while the process exits
std::mutex &CredentialsMutex() {
  static auto *m = new std::mutex;
  return *m;
}
std::map<std::string, Credentials> &CredentialsTable() {
  static auto *table = new std::map<std::string, Credentials>;
  return *table;
}

}  // namespace

Credentials CredentialsOf(const std::string &spec) {
  std::lock_guard<std::mutex> lock(CredentialsMutex());
  auto it = CredentialsTable().find(spec);
  return it == CredentialsTable().end() ? Credentials{} : it->second;
}

void SetStoreCredentials(const std::string &spec, const std::string &key_id, const std::string &secret,
                         const std::string &token) {
  std::lock_guard<std::mutex> lock(CredentialsMutex());
  // an http store's credentials are its URL query alone (token, without a key)
  if (key_id.empty() && secret.empty() && token.empty())
    CredentialsTable().erase(spec);
  else
    CredentialsTable()[spec] = Credentials{key_id, secret, token};
}

}  // namespace dali_mesh
