// dali_mesh: a plan file's object, opened in its byte store and checked against the plan (still
// the object planned for), and the versions a batch found of its files. DALI-free, host only.
#ifndef DALI_MESH_READER_OPEN_FILE_H_
#define DALI_MESH_READER_OPEN_FILE_H_

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "plan/plan.h"
#include "storage/byte_store.h"

namespace dali_mesh {

// A plan file's object opened in its store and checked against the plan (its size, modification
// time, tag, check bytes and the plan's header or metadata check). Closes on destruction.
class OpenFile {
 public:
  void Open(const PlanFile &file, const ReadPlan &plan, const std::string &first_path);
  // Fails naming the file when it is not as it was opened (device, inode, size, modification or
  // change time; an object's tag): it was rewritten in place while it was read, and what was read
  // may mix two versions (Linux 6.13+ gives a write right after a stat a fine-grained time, so it is
  // seen).
  void CheckUnchanged() const { object_->CheckUnchanged(); }
  void Close() { object_.reset(); }
  const StoredObject &object() const { return *object_; }
  const ObjectVersion &version() const { return object_->version(); }
  int64_t size() const { return object_->size(); }  // the object's size when it was opened
  const std::string &path() const { return object_->name(); }  // as messages show it

 private:
  std::unique_ptr<StoredObject> object_;
};

// The version of each file a batch reads, as the first of its reads found it (OpenFile::version):
// a window read in several tasks (each opening the file) must come from one version of the file,
// so every later open of it in the batch must find the same. Thread-safe.
class FileVersions {
 public:
  void Reset(size_t n_files);
  // Fails naming the file when `file` (plan file `index`) is not the version the batch's first open
  // of it found.
  void Agree(int64_t index, const OpenFile &file);

 private:
  std::mutex mutex_;
  std::vector<ObjectVersion> seen_;
  std::vector<uint8_t> set_;
};

}  // namespace dali_mesh

#endif  // DALI_MESH_READER_OPEN_FILE_H_
