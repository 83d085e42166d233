// dali_mesh: opening a plan file's object and checking it against the plan (see open_file.h).
#include "reader/open_file.h"

#include <cstring>
#include <mutex>
#include <string>

#include "plan/canonical_json.h"
#include "storage/reads_in_flight.h"

namespace dali_mesh {

using detail::Fail;

void FileVersions::Reset(size_t n_files) {
  std::lock_guard<std::mutex> lock(mutex_);
  seen_.resize(n_files);
  set_.assign(n_files, 0);
}

void FileVersions::Agree(int64_t index, const OpenFile &file) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (index < 0 || static_cast<size_t>(index) >= set_.size()) return;
  if (!set_[index]) {
    seen_[index] = file.version();
    set_[index] = 1;
  } else if (seen_[index] != file.version()) {
    Fail(file.path() + ": the file changed while this batch read it (its size, modification or change time "
         "differ between two reads of it): it was rewritten in place, and a window could mix two versions; "
         "write files to a new name and rename them over the old ones");
  }
}

void OpenFile::Open(const PlanFile &file, const ReadPlan &plan, const std::string &first_file) {
  Close();
  ObjectVersion planned;
  planned.size = file.size;
  planned.mtime_ns = file.mtime_ns;
  planned.tag = file.tag;
  // fails naming a missing file, a FIFO, a folder; an object store takes the planned version (ETag)
  // and checks it at every read
  object_ = file.byte_store->OpenVersion(file.key, planned);
  const std::string &path_ = object_->name();
  const std::string first_path = ShownName(first_file);
  const int64_t size = object_->size();
  if (file.size >= 0 && size != file.size) {
    if (size < file.size)
      Fail(path_ + ": the file is truncated: " + std::to_string(size) + " bytes, but its " +
           "layout (planned from " + first_path + ") needs " + std::to_string(file.size) +
           "; rewrite it");
    Fail(path_ + ": the file is " + std::to_string(size) + " bytes, but the plan (made from " +
         first_path + ") expects " + std::to_string(file.size) + ": it changed since " +
         "the plan was made, or its shape or dtype differs; define the pipeline again, or use " +
         "per-sample shapes");
  }

  if (plan.check_offset == kCheckJson && !file.tag.empty()) {
    // a metadata object of an object store, named by its ETag when planned: not read again (a request
    // per sample); every chunk object the plan reads is pinned by its own ETag (If-Match), and a
    // chunk planned as missing must still be missing, so no chunk of another array is read
  } else if (plan.check_offset == kCheckJson) {
    // the whole metadata file, compared in canonical form (attributes may change, nothing else)
    constexpr int64_t kMaxJson = int64_t(1) << 30;
    if (size > kMaxJson)
      Fail(path_ + ": the metadata file is " + std::to_string(size) + " bytes (at most " +
           std::to_string(kMaxJson) + " are read); define the pipeline again");
    std::string text(size, '\0');
    int64_t got = object_->ReadAt(text.data(), size, 0);
    if (got < 0) Fail(path_ + ": read of the metadata failed (" + std::strerror(-got) + ")");
    text.resize(got);
    std::string canon;
    if (!CanonicalJson(text, &canon) || canon != plan.check)
      Fail(path_ + ": its metadata (shape, dtype, chunking, order, codecs or fill value) differs from "
           "the one planned for (" + first_path + "): the array changed since the plan was made, "
           "or differs from that one; define the pipeline again, or make every array the same");
  } else if (!plan.check.empty()) {
    std::string head(plan.check.size(), '\0');
    FlightGuard flight(path_, plan.check_offset, static_cast<int64_t>(head.size()));
    int64_t got = object_->ReadAt(head.data(), head.size(), plan.check_offset);
    if (got < 0) Fail(path_ + ": read of the header failed (" + std::strerror(-got) + ")");
    if (got != static_cast<int64_t>(head.size()) || head != plan.check)
      Fail(path_ + ": its header differs from the one planned for (" + first_path + ", " +
           std::to_string(plan.check.size()) + " bytes at byte " + std::to_string(plan.check_offset) +
           "): its shape, dtype, order or storage changed since the plan was made, or differs " +
           "from that file's; define the pipeline again, make every file the same, or use " +
           "per-sample shapes");
  }
  // last, so that a changed size or header is named as such: a file whose layout looks the same
  // but that was modified since the plan (an HDF5 file rewritten in place may hold, at the planned
  // address, another dataset with a byte-identical header)
  if ((file.mtime_ns >= 0 && object_->version().mtime_ns != file.mtime_ns) ||
      (!file.tag.empty() && object_->version().tag != file.tag)) {
      Fail(path_ + ": the file was modified since the plan was made (the plan holds where its data "
           "lay then: an HDF5 file rewritten in place may hold another dataset at the planned address, "
           "with a byte-identical header; a Zarr shard its chunks at other offsets); define the "
           "pipeline again");
  }
  // a shard's index, as read when the plan was made; an object read at its planned ETag (If-Match, and
  // the plan read the index at that ETag too) is that version's, without a request per open
  if (file.check_offset >= 0 && !object_->ReadsArePinned()) {
    std::string held(file.check.size(), '\0');
    FlightGuard flight(path_, file.check_offset, static_cast<int64_t>(held.size()));
    const int64_t got = object_->ReadAt(held.data(), held.size(), file.check_offset);
    if (got < 0) Fail(path_ + ": read of its index failed (" + std::strerror(-got) + ")");
    if (got != static_cast<int64_t>(held.size()) || held != file.check)
      Fail(path_ + ": its index (" + std::to_string(file.check.size()) + " bytes at byte " +
           std::to_string(file.check_offset) + ") differs from the one read when the plan was made: the shard "
           "was rewritten since (a copy or restore that kept its size and modification time); define the "
           "pipeline again");
  }
}

}  // namespace dali_mesh
