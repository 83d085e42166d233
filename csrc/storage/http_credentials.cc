// dali_mesh: a remote store's credentials (see http_store.h), held by the store itself: given to it
// (HttpStore::SetCredentials, from Python's storage_options or the environment), kept in its memory
// only, read by each request it sends; never in a spec, a message or a plan.
#include <mutex>
#include <utility>

#include "storage/http_store.h"

namespace dali_mesh {

void HeldCredentials::Set(Credentials credentials) {
  std::lock_guard<std::mutex> lock(mutex_);
  credentials_ = std::move(credentials);
}

Credentials HeldCredentials::Get() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return credentials_;
}

}  // namespace dali_mesh
