// dali_mesh: an object of a remote store, opened (see http_object.h).
#include "storage/http_object.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "storage/http_text.h"

namespace dali_mesh {

namespace {

// An object of a remote store opened at a version; every read is of that version or an error.
class HttpObject : public StoredObject {
 public:
  // `first`: the object's first bytes, from the answer that named its version (an open): reads inside
  // them cost no request
  HttpObject(const HttpStore *store, std::string key, const ObjectVersion &v, std::string first = std::string())
      : store_(store), key_(std::move(key)), first_(std::move(first)) {
    name_ = store->NameOf(key_);
    version_ = v;
  }
  int64_t ReadAt(char *dst, int64_t n, int64_t offset) const override {
    if (offset >= 0 && version_.size >= 0 && n > 0) {
      const int64_t want = std::min(n, std::max<int64_t>(0, version_.size - offset));
      if (Kept(offset, want)) {
        std::memcpy(dst, first_.data() + offset, want);
        return want;
      }
    }
    return store_->Get(key_, offset, n, dst, version_.tag, version_.size);
  }
  void ReadVector(std::vector<struct iovec> *iov, int64_t offset) const override {
    std::vector<std::pair<char *, int64_t>> bufs;
    bufs.reserve(iov->size());
    int64_t n = 0;
    for (const auto &v : *iov) {
      bufs.emplace_back(static_cast<char *>(v.iov_base), static_cast<int64_t>(v.iov_len));
      n += v.iov_len;
    }
    if (version_.size >= 0 && offset + n > version_.size)
      StoreFail(name_ + ": read of " + std::to_string(n) + " bytes at byte " + std::to_string(offset) +
                " runs past the end of the object (" + std::to_string(version_.size) + " bytes): it is shorter than "
                "planned");
    if (Kept(offset, n)) {
      for (const auto &b : bufs) {
        std::memcpy(b.first, first_.data() + offset, b.second);
        offset += b.second;
      }
    } else {
      store_->GetVector(key_, bufs, offset, version_.tag, version_.size);
    }
    iov->clear();
  }
  void ReadRanges(const std::vector<Range> &ranges) const override {
    std::vector<Range> remote;
    for (const auto &r : ranges) {
      if (r.offset < 0 || (version_.size >= 0 && r.offset + r.bytes > version_.size))
        StoreFail(name_ + ": read of " + std::to_string(r.bytes) + " bytes at byte " + std::to_string(r.offset) +
                  " runs past the end of the object (" + std::to_string(version_.size) + " bytes)");
      if (Kept(r.offset, r.bytes))
        std::memcpy(r.dst, first_.data() + r.offset, r.bytes);
      else
        remote.push_back(r);
    }
    if (!remote.empty()) store_->GetMany(key_, remote, version_.tag, version_.size);
  }
  // with a cache, the same ranges each epoch (guesses differ with the order chunks are read in, and
  // the cache keeps exact ranges)
  bool GuessParts() const override { return store_->config().cache.empty(); }
  RoundTrip Cost() const override { return store_->Cost(); }
  // an S3 (or GCS XML) ETag, which the service changes with the content and honours in If-Match (as
  // RemoteStore.pins): not a plain HTTP(S) server's (nginx's is the modification time and size, kept
  // by a copy that keeps both), nor a generation or a date (checked after the answer)
  bool ReadsArePinned() const override { return store_->config().kind == "s3" && IsEtag(version_.tag); }
  void CheckUnchanged() const override {
    // every read sent If-Match (an ETag) and had its total size checked (an answer without the ETag
    // had its version asked for again); a tag made of a generation or a date is asked for again, by a
    // GET of one byte (a URL presigned for GET refuses HEAD)
    if (IsEtag(version_.tag)) return;
    ObjectVersion now;
    char byte;
    int64_t got = 0;
    if (!store_->OpenRange(key_, 1, &byte, &got, &now) || now.size != version_.size || now.tag != version_.tag)
      StoreFail(name_ + ": the object was replaced while it was read: what was read could mix two versions; define "
                "the pipeline again");
  }

 private:
  // whether [offset, offset + n) lies in the first bytes kept
  bool Kept(int64_t offset, int64_t n) const {
    return offset >= 0 && n >= 0 && offset + n <= static_cast<int64_t>(first_.size());
  }
  const HttpStore *store_;
  std::string key_;
  std::string first_;
};

}  // namespace

std::unique_ptr<StoredObject> MakeHttpObject(const HttpStore *store, std::string key, const ObjectVersion &version,
                                             std::string first) {
  return std::make_unique<HttpObject>(store, std::move(key), version, std::move(first));
}

}  // namespace dali_mesh
