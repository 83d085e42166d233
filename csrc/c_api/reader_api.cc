// dali_mesh: the C entry points of the batch reader (csrc/reader/batch_reader.h), in
// libdali_mesh_kernels.so and bound in dali_mesh/_kernels/reader_api.py (PlanReader): a plan file's windows
// for a list of sample ids read into the caller's host buffers, as fn.dali_mesh.read_windows reads
// them on the CPU, on threads of this library's own instead of DALI's. The tests hold it to numpy,
// zarr-python and h5py without importing DALI.
//
// Functions that take `err` return a count (>= 0) on success, or -1 with a message in
// err[0..err_len).
#include <algorithm>
#include <cstdint>
#include <exception>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "c_api/export.h"
#include "reader/batch_reader.h"

using dali_mesh::c_api::Fail;


// A batch reader of the plan file at `plan_path` for windows of type `dtype` (a DType: DALI's type
// numbers), `outputs` windows per sample id, reads of about `task_bytes` per task, `prefetch`
// (1: announce a batch's ranges first), and, with n_channels > 0, the per-channel normalisation
// (x - mean[c]) / stddev[c] on `channel_axis` (the operator's arguments of the same names), and
// `read_ahead` (ReaderOptions::read_ahead: 0 off, 1 object stores, 2 always), with at most
// `read_ahead_batches` batches read ahead (1..kMaxAheadBatches) holding `read_ahead_bytes` at most.
// Returns the reader (free it with dali_mesh_reader_close), or null with the reason in `err` (a plan
// file the loader refuses, options that do not fit it).
DM_EXPORT void *dali_mesh_reader_open(const char *plan_path, int dtype, int outputs, int64_t task_bytes,
                                      int prefetch, const float *mean, const float *stddev, int64_t n_channels,
                                      int channel_axis, int read_ahead, int read_ahead_batches,
                                      int64_t read_ahead_bytes, char *err, int64_t err_len) {
  try {
    dali_mesh::ReaderOptions options;
    options.dtype = dtype;
    options.outputs = outputs;
    options.task_bytes = task_bytes;
    options.prefetch = prefetch != 0;
    if (n_channels > 0) {
      options.mean.assign(mean, mean + n_channels);
      options.stddev.assign(stddev, stddev + n_channels);
    }
    options.channel_axis = channel_axis;
    options.read_ahead = read_ahead;
    if (read_ahead_batches < 1 || read_ahead_batches > dali_mesh::kMaxAheadBatches)
      throw std::invalid_argument("read_ahead_batches " + std::to_string(read_ahead_batches) + " is not in 1.." +
                                  std::to_string(dali_mesh::kMaxAheadBatches));
    if (read_ahead_bytes < 0)
      throw std::invalid_argument("read_ahead_bytes " + std::to_string(read_ahead_bytes) + " is negative");
    options.read_ahead_batches = read_ahead_batches;
    options.read_ahead_bytes = read_ahead_bytes;
    return new dali_mesh::BatchReader(dali_mesh::LoadPlanSet(plan_path), std::move(options));
  } catch (const std::exception &e) {
    Fail(e.what(), err, err_len);
    return nullptr;
  }
}

DM_EXPORT void dali_mesh_reader_close(void *reader) { delete static_cast<dali_mesh::BatchReader *>(reader); }

// The windows of the batch ids[0..n_ids): outputs * n_ids of them, window j = k * n_ids + i being
// output k's window of ids[i]. Writes window j's number of axes to ndims[j] and its extents to
// shapes[j * max_ndim ...]. Returns the number of windows, or -1 (an id out of range, a window of
// more than max_ndim axes).
DM_EXPORT int64_t dali_mesh_reader_shapes(void *reader, const int64_t *ids, int64_t n_ids, int64_t *ndims,
                                          int64_t *shapes, int64_t max_ndim, char *err, int64_t err_len) {
  try {
    auto *r = static_cast<dali_mesh::BatchReader *>(reader);
    r->SetBatch(ids, static_cast<int>(n_ids));
    for (int64_t j = 0; j < r->num_windows(); j++) {
      const auto &shape = r->window_plan(j).shape;
      if (static_cast<int64_t>(shape.size()) > max_ndim)
        return Fail("window " + std::to_string(j) + " has " + std::to_string(shape.size()) + " axes, more than " +
                        std::to_string(max_ndim),
                    err, err_len);
      ndims[j] = static_cast<int64_t>(shape.size());
      std::copy(shape.begin(), shape.end(), shapes + j * max_ndim);
    }
    return r->num_windows();
  } catch (const std::exception &e) {
    return Fail(e.what(), err, err_len);
  }
}

// Reads the windows of the batch ids[0..n_ids) (as dali_mesh_reader_shapes numbers them) into
// out[j], a host buffer of out_bytes[j] bytes (the window's bytes exactly), on `threads` threads.
// Returns the number of windows, or -1 with the reader's error (a file changed since the plan, a
// corrupt chunk, ...) or a buffer of another size.
DM_EXPORT int64_t dali_mesh_reader_read(void *reader, const int64_t *ids, int64_t n_ids, void *const *out,
                                        const int64_t *out_bytes, int threads, char *err, int64_t err_len) {
  try {
    auto *r = static_cast<dali_mesh::BatchReader *>(reader);
    r->SetBatch(ids, static_cast<int>(n_ids));
    std::vector<char *> dst(r->num_windows());
    for (int64_t j = 0; j < r->num_windows(); j++) {
      const int64_t bytes = r->window_plan(j).bytes();
      if (out_bytes[j] != bytes)
        return Fail("window " + std::to_string(j) + " is " + std::to_string(bytes) + " bytes, its buffer " +
                        std::to_string(out_bytes[j]),
                    err, err_len);
      dst[j] = static_cast<char *>(out[j]);
    }
    r->Read(dst, dali_mesh::RunOnThreads(threads));
    return r->num_windows();
  } catch (const std::exception &e) {
    return Fail(e.what(), err, err_len);
  }
}

// Starts reading the batch ids[0..n_ids) ahead on `threads` threads of its own (BatchReader::ReadAhead:
// a later dali_mesh_reader_read of those ids waits for it and copies). Returns 1 when it was started
// or is on its way, 0 when not (reading ahead is off, or the batch is too large or has an id out of
// range), -1 on an error.
DM_EXPORT int64_t dali_mesh_reader_read_ahead(void *reader, const int64_t *ids, int64_t n_ids, int threads, char *err,
                                              int64_t err_len) {
  try {
    auto *r = static_cast<dali_mesh::BatchReader *>(reader);
    return r->ReadAhead(ids, static_cast<int>(n_ids), threads) ? 1 : 0;
  } catch (const std::exception &e) {
    return Fail(e.what(), err, err_len);
  }
}

// As the read_windows operator does before it reads a batch: sets the batch ids[0..n_ids) (the one read
// next) and reads ahead the `batches` batches that follow it, next[b * n_ids ...] each
// (BatchReader::ReadAheadBatches: those read ahead that are neither are dropped). Returns how many are
// being read ahead, or -1 on an error.
DM_EXPORT int64_t dali_mesh_reader_read_ahead_batches(void *reader, const int64_t *ids, int64_t n_ids,
                                                      const int64_t *next, int batches, int threads, char *err,
                                                      int64_t err_len) {
  try {
    auto *r = static_cast<dali_mesh::BatchReader *>(reader);
    r->SetBatch(ids, static_cast<int>(n_ids));
    return r->ReadAheadBatches(next, static_cast<int>(n_ids), batches, threads);
  } catch (const std::exception &e) {
    return Fail(e.what(), err, err_len);
  }
}

// What the reader's batches read ahead hold against read_ahead_bytes (BatchReader::ahead_budget): the
// bound (out[0]), the bytes counted now (out[1]) and at most so far (out[2]), the fetches that waited for
// room (out[3]) and the longest wait in microseconds (out[4]); and its batches read ahead whose jobs
// have not ended (out[5]).
DM_EXPORT void dali_mesh_reader_ahead_budget(void *reader, int64_t *out) {
  auto *r = static_cast<dali_mesh::BatchReader *>(reader);
  const auto s = r->ahead_budget();
  out[0] = r->options().read_ahead_bytes;
  out[1] = s.held;
  out[2] = s.peak;
  out[3] = s.waits;
  out[4] = s.longest_wait_us;
  out[5] = r->ahead_in_flight();
}

// Batches read ahead whose buffers exist now, in this process (AheadAlive).
DM_EXPORT int64_t dali_mesh_reader_ahead_alive() { return dali_mesh::AheadAlive(); }

// Batches read from what was read ahead (out[0]), batches read ahead then dropped unused (out[1]) and
// batches whose read ahead failed, read again when wanted (out[2]).
DM_EXPORT void dali_mesh_reader_ahead_counts(void *reader, int64_t *out) {
  auto *r = static_cast<dali_mesh::BatchReader *>(reader);
  out[0] = r->ahead_used();
  out[1] = r->ahead_dropped();
  out[2] = r->ahead_failed();
}
