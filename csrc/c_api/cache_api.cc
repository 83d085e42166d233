// dali_mesh: C entry points of the local range cache (csrc/storage/range_cache.h), in
// libdali_mesh_kernels.so, for the tests (tests/storage/test_range_cache_safety.py): they drive the
// cache's Put, Get and eviction directly, from several processes, without a remote store. The
// library's remote stores use the cache themselves (http_store.cc); nothing else calls these.
//
// Each (dir, max_bytes) names one cache of this process, made at its first use. The functions return
// 0 or more on success, or -1 with a message in err[0..err_len).
#include <cstdint>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "c_api/export.h"
#include "storage/range_cache.h"

using dali_mesh::c_api::Fail;

namespace {
const dali_mesh::RangeCache &CacheOf(const char *dir, int64_t max_bytes) {
  static std::mutex mutex;
  static std::map<std::pair<std::string, int64_t>, std::unique_ptr<dali_mesh::RangeCache>> caches;
  if (!dir || max_bytes <= 0) throw std::runtime_error("a cache needs a folder and a positive bound");
  std::lock_guard<std::mutex> lock(mutex);
  auto &c = caches[{dir, max_bytes}];
  if (!c) c = std::make_unique<dali_mesh::RangeCache>(dir, max_bytes);
  return *c;
}
}  // namespace

// Keeps data[0..n) as the entry `id` of the cache (dir, max_bytes); evicts when the cache says so.
DM_EXPORT int dali_mesh_cache_put(const char *dir, int64_t max_bytes, const char *id, const void *data, int64_t n,
                                  char *err, int64_t err_len) {
  try {
    if (!id || (n > 0 && !data) || n < 0) return Fail("dali_mesh_cache_put: no id, or no bytes", err, err_len);
    CacheOf(dir, max_bytes).Put(id, {{static_cast<char *>(const_cast<void *>(data)), n}});
    return 0;
  } catch (const std::exception &e) {
    return Fail(e.what(), err, err_len);
  }
}

// Fills dst[0..n) with the entry `id` of n bytes: 1 (a hit) or 0 (a miss).
DM_EXPORT int dali_mesh_cache_get(const char *dir, int64_t max_bytes, const char *id, void *dst, int64_t n, char *err,
                                  int64_t err_len) {
  try {
    if (!id || (n > 0 && !dst) || n < 0) return Fail("dali_mesh_cache_get: no id, or no buffer", err, err_len);
    return CacheOf(dir, max_bytes).Get(id, {{static_cast<char *>(dst), n}}) ? 1 : 0;
  } catch (const std::exception &e) {
    return Fail(e.what(), err, err_len);
  }
}

// Brings the cache (dir, max_bytes) within its bound now.
DM_EXPORT int dali_mesh_cache_evict(const char *dir, int64_t max_bytes, char *err, int64_t err_len) {
  try {
    CacheOf(dir, max_bytes).Evict();
    return 0;
  } catch (const std::exception &e) {
    return Fail(e.what(), err, err_len);
  }
}
