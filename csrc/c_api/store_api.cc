// dali_mesh: the C entry points of the byte stores (csrc/storage/byte_store.h), each store named by its
// spec, in libdali_mesh_kernels.so (the one copy of the stores in a process, of their objects and of
// the credentials Python gave each store: the DALI plugin links this library), bound in
// dali_mesh/storage/remote.py: Python's stores (RemoteStore, MemoryStore) plan and read through the same
// stores as the native reader (for remote objects: the same libcurl client, retries and checks).
//
// Functions that take `err` return a count (>= 0) on success, or -1 with a message in err[0..err_len).
#include <cstdint>
#include <exception>
#include <stdexcept>
#include <string>

#include "c_api/export.h"
#include "storage/byte_store.h"
#include "storage/callback_store.h"

using dali_mesh::c_api::Fail;

namespace {
const char *Text(const char *s) { return s ? s : ""; }

const dali_mesh::ByteStore *StoreNamed(const char *spec) {
  const auto *store = dali_mesh::StoreOf(Text(spec));
  if (!store) throw std::runtime_error(dali_mesh::WhyNoStore(Text(spec)));
  return store;
}

}  // namespace

// What this library's network stores fetched in this process: requests sent (every attempt) and body
// bytes received.
DM_EXPORT void dali_mesh_store_counters(int64_t *requests, int64_t *bytes) { dali_mesh::FetchCounters(requests, bytes); }

// What a request to the store `spec` costs as measured from its requests so far (byte_store.h
// RoundTripMeter: moving medians): `latency_s` to the first byte, `bytes_per_s` of long bodies (0:
// not measured). 0, or -1 with a message.
DM_EXPORT int dali_mesh_store_round_trip(const char *spec, double *latency_s, double *bytes_per_s, char *err,
                                         int64_t err_len) {
  try {
    if (!latency_s || !bytes_per_s)
      return Fail("dali_mesh_store_round_trip: latency_s and bytes_per_s must be given", err, err_len);
    const dali_mesh::RoundTrip cost = StoreNamed(spec)->Cost();
    *latency_s = cost.latency_s;
    *bytes_per_s = cost.bytes_per_s;
    return 0;
  } catch (const std::exception &e) {
    return Fail(e.what(), err, err_len);
  }
}

// 1 when this library reads remote stores (it has the store "http": it was linked with libcurl), else 0.
DM_EXPORT int dali_mesh_store_have_http() { return dali_mesh::StoreOf("http") ? 1 : 0; }

// The settings of the store `spec` as its kind parsed them (byte_store.h StoreSettings): one JSON object
// (an "s3" or "http" spec: the fields of HttpStoreConfig), also in a build that cannot make the store
// (without libcurl). Its length n, written with a NUL to
// out[0..out_size) only when out_size > n; -1 with a message for a spec its kind refuses.
DM_EXPORT int64_t dali_mesh_store_settings(const char *spec, char *out, int64_t out_size, char *err, int64_t err_len) {
  try {
    return dali_mesh::c_api::CopyText(dali_mesh::StoreSettings(Text(spec)), out, out_size);
  } catch (const std::exception &e) {
    return Fail(e.what(), err, err_len);
  }
}

// Gives the store `spec` the credentials key_id / secret / token, which it keeps: an s3
// store signs with key_id and secret (token: a session token, may be empty); an http store's token is
// its URL query (without '?'), appended to every request and shown in no message. All three empty
// removes them (unsigned requests). 0, or -1 for a spec that is no store of this build or one that
// takes no credentials.
DM_EXPORT int dali_mesh_store_credentials(const char *spec, const char *key_id, const char *secret, const char *token,
                                          char *err, int64_t err_len) {
  try {
    StoreNamed(spec)->SetCredentials(Text(key_id), Text(secret), Text(token));
    return 0;
  } catch (const std::exception &e) {
    return Fail(e.what(), err, err_len);
  }
}

// The version of `key` (an object store: its HEAD): 1 with its size and tag (an ETag; the text and a
// NUL in tag[0..tag_size)), 0 when it does not exist, -1 with a message.
DM_EXPORT int64_t dali_mesh_store_head(const char *spec, const char *key, int64_t *size, char *tag, int64_t tag_size,
                                       char *err, int64_t err_len) {
  try {
    if (!size || !tag || tag_size < 1) return Fail("dali_mesh_store_head: size and tag must be buffers", err, err_len);
    dali_mesh::ObjectVersion v;
    if (!StoreNamed(spec)->Head(Text(key), &v)) return 0;
    if (static_cast<int64_t>(v.tag.size()) >= tag_size)
      return Fail("the object's version tag (ETag) is too long", err, err_len);
    dali_mesh::c_api::CopyText(v.tag, tag, tag_size);
    *size = v.size;
    return 1;
  } catch (const std::exception &e) {
    return Fail(e.what(), err, err_len);
  }
}

// One read of `n` bytes of `key` at `offset` into dst (an object store: one ranged GET; fewer only at the
// end of the object), of the version tagged `if_match` when not empty (If-Match) and the object's size
// `size` when known (-1): the bytes read, or -1 with a message naming the object, the range (and for a
// remote store the status and the attempts).
DM_EXPORT int64_t dali_mesh_store_get(const char *spec, const char *key, int64_t offset, int64_t n, const char *if_match,
                                      int64_t size, void *dst, char *err, int64_t err_len) {
  try {
    if (n > 0 && !dst)
      return Fail("dali_mesh_store_get: dst is NULL but n=" + std::to_string(n) + " bytes are asked for: give a "
                  "buffer of n bytes", err, err_len);
    return StoreNamed(spec)->Get(Text(key), offset, n, static_cast<char *>(dst), Text(if_match), size);
  } catch (const std::exception &e) {
    return Fail(e.what(), err, err_len);
  }
}

// An open in one request (an object store: no HEAD, which S3 refuses on a URL presigned for GET; one
// GET of bytes [0, n) of `key` (n >= 1), no If-Match). Copies at most n bytes into dst and returns how
// many (fewer when the object is smaller); *size is the object's size and tag[0..tag_cap) its version
// tag (and a NUL) as dali_mesh_store_head names it. -2 when the object does not exist, -1 with a message.
DM_EXPORT int64_t dali_mesh_store_open(const char *spec, const char *key, int64_t n, void *dst, int64_t *size, char *tag,
                                       int64_t tag_cap, char *err, int64_t err_cap) {
  try {
    if (n < 1 || !dst || !size || !tag || tag_cap < 1)
      return Fail("dali_mesh_store_open: give n >= 1 (got " + std::to_string(n) + "), a buffer dst of n bytes, size "
                  "and a tag buffer", err, err_cap);
    dali_mesh::ObjectVersion v;
    int64_t got = 0;
    if (!StoreNamed(spec)->OpenRange(Text(key), n, static_cast<char *>(dst), &got, &v)) return -2;
    if (static_cast<int64_t>(v.tag.size()) >= tag_cap)
      return Fail("the object's version tag (ETag) is too long", err, err_cap);
    dali_mesh::c_api::CopyText(v.tag, tag, tag_cap);
    *size = v.size;
    return got;
  } catch (const std::exception &e) {
    return Fail(e.what(), err, err_cap);
  }
}

// One page of the listing of the keys under `prefix` (an object store's: "bucket/path"), grouped at '/'
// when delimiter != 0, after `continuation` (empty: the first; else the page before's next), as
// ByteStore::ListPage reads it, encoded by EncodeListing (storage/byte_store.h): its length n; the page and a NUL are
// written to out[0..out_size) only when out_size > n (ask again with n + 1 bytes: the page is fetched
// again).
DM_EXPORT int64_t dali_mesh_store_list(const char *spec, const char *prefix, int delimiter, const char *continuation,
                                       char *out, int64_t out_size, char *err, int64_t err_len) {
  try {
    const dali_mesh::Listing page = StoreNamed(spec)->ListPage(Text(prefix), delimiter != 0, Text(continuation));
    return dali_mesh::c_api::CopyText(dali_mesh::EncodeListing(page), out, out_size);
  } catch (const std::exception &e) {
    return Fail(e.what(), err, err_len);
  }
}

// Writes the n bytes at `data` as the object `key` of the store `spec` (a store that holds its objects:
// "memory;name=..."), a new version; `tag` NULL or empty, or the version to take (a copy of an object
// of another library's store at its version). 0, or -1 with a message.
DM_EXPORT int dali_mesh_store_put(const char *spec, const char *key, const void *data, int64_t n, const char *tag,
                                  char *err, int64_t err_len) {
  try {
    if (n < 0 || (n > 0 && !data))
      return Fail("dali_mesh_store_put: give n >= 0 (got " + std::to_string(n) + ") and a buffer of n bytes", err,
                  err_len);
    StoreNamed(spec)->Put(Text(key), static_cast<const char *>(data), n, Text(tag));
    return 0;
  } catch (const std::exception &e) {
    return Fail(e.what(), err, err_len);
  }
}

// Removes the object `key` of the store `spec`: 1, 0 when there was none, -1 with a message.
DM_EXPORT int dali_mesh_store_delete(const char *spec, const char *key, char *err, int64_t err_len) {
  try {
    return StoreNamed(spec)->Delete(Text(key)) ? 1 : 0;
  } catch (const std::exception &e) {
    return Fail(e.what(), err, err_len);
  }
}

// Binds the store `spec` (a kind whose reads Python answers: "icechunk;...") in this library to `head`
// and `read` (storage/callback_store.h: the version of a key; several ranges of a key read at once),
// its objects named `name` + "/" + key in messages; both NULL unbinds it. The functions are called
// from the reader's threads, with no lock of the reader held, until unbound: they must stay valid
// (Python keeps its ctypes callbacks for the life of the process). 0, or -1 with a message.
DM_EXPORT int dali_mesh_store_bind_reader(const char *spec, const char *name, dali_mesh::CallbackHead head,
                                          dali_mesh::CallbackRead read, char *err, int64_t err_len) {
  try {
    dali_mesh::BindCallbackStore(Text(spec), Text(name), head, read);
    return 0;
  } catch (const std::exception &e) {
    return Fail(e.what(), err, err_len);
  }
}

// Unbinds every store bound by dali_mesh_store_bind_reader in this library, for good (the process
// exits: their later reads fail at once, naming the store), and waits at most `wait_s` seconds for
// the calls in flight to return (call it without holding the GIL, which they need). Returns the calls
// still in flight.
DM_EXPORT int64_t dali_mesh_store_unbind_readers(double wait_s) { return dali_mesh::UnbindCallbackStores(wait_s); }
