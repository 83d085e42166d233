// dali_mesh: an object of a remote store (http_store.h) opened at a version: reads are ranged GETs
// with If-Match (an ETag), their answers checked; reads inside the first bytes the open fetched cost
// no request. Host only, DALI-free.
#ifndef DALI_MESH_STORAGE_HTTP_OBJECT_H_
#define DALI_MESH_STORAGE_HTTP_OBJECT_H_

#include <memory>
#include <string>

#include "storage/byte_store.h"
#include "storage/http_store.h"

namespace dali_mesh {

// `key` of `store` at `version`; `first`: the object's first bytes from the answer that named the
// version (an open), or "" (a version a plan recorded).
std::unique_ptr<StoredObject> MakeHttpObject(const HttpStore *store, std::string key, const ObjectVersion &version,
                                             std::string first = std::string());

}  // namespace dali_mesh

#endif  // DALI_MESH_STORAGE_HTTP_OBJECT_H_
