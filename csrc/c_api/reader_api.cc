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
#include <string>
#include <vector>

#include "c_api/export.h"
#include "reader/batch_reader.h"

using dali_mesh::c_api::Fail;


// A batch reader of the plan file at `plan_path` for windows of type `dtype` (a DType: DALI's type
// numbers), `outputs` windows per sample id, reads of about `task_bytes` per task, `prefetch`
// (1: announce a batch's ranges first), and, with n_channels > 0, the per-channel normalisation
// (x - mean[c]) / stddev[c] on `channel_axis` (the operator's arguments of the same names), and
// `read_ahead` (ReaderOptions::read_ahead: 0 off, 1 object stores, 2 always). Returns
// the reader (free it with dali_mesh_reader_close), or null with the reason in `err` (a plan file
// the loader refuses, options that do not fit it).
DM_EXPORT void *dali_mesh_reader_open(const char *plan_path, int dtype, int outputs, int64_t task_bytes,
                                      int prefetch, const float *mean, const float *stddev, int64_t n_channels,
                                      int channel_axis, int read_ahead, char *err, int64_t err_len) {
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

// Batches read from what was read ahead (out[0]), batches read ahead then dropped unused (out[1]) and
// batches whose read ahead failed, read again when wanted (out[2]).
// Batches read ahead whose buffers exist now, in this process (AheadAlive).
DM_EXPORT int64_t dali_mesh_reader_ahead_alive() { return dali_mesh::AheadAlive(); }

DM_EXPORT void dali_mesh_reader_ahead_counts(void *reader, int64_t *out) {
  auto *r = static_cast<dali_mesh::BatchReader *>(reader);
  out[0] = r->ahead_used();
  out[1] = r->ahead_dropped();
  out[2] = r->ahead_failed();
}
