// dali_mesh: the C entry points of the batch reader (csrc/reader/batch_reader.h), in
// libdali_mesh_kernels.so and bound in dali_mesh/_kernels.py (PlanReader): a plan file's windows
// for a list of sample ids read into the caller's host buffers, as fn.dali_mesh.read_windows reads
// them on the CPU, on threads of this library's own instead of DALI's. The tests hold it to numpy,
// zarr-python and h5py without importing DALI.
//
// Functions that take `err` return a count (>= 0) on success, or -1 with a message in
// err[0..err_len).
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "c_api/export.h"
#include "reader/batch_reader.h"

using dali_mesh::c_api::Fail;

namespace {

// RunTasks on `threads` threads (this one among them), the larger tasks first (as DALI's thread
// pool orders its work by priority); every task runs, the first error is rethrown after the last.
dali_mesh::RunTasks ThreadsRunner(int threads) {
  if (threads <= 1) return dali_mesh::RunSerially;
  return [threads](const dali_mesh::TaskFn &fn, int64_t n, const dali_mesh::TaskCost &cost) {
    std::vector<int64_t> order(n), costs(n);
    std::iota(order.begin(), order.end(), int64_t(0));
    for (int64_t t = 0; t < n; t++) costs[t] = cost(t);
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return costs[a] > costs[b]; });
    std::atomic<int64_t> next{0};
    std::mutex mutex;
    std::exception_ptr error;
    auto work = [&] {
      for (int64_t k; (k = next.fetch_add(1)) < n;) {
        try {
          fn(order[k]);
        } catch (...) {
          std::lock_guard<std::mutex> lock(mutex);
          if (!error) error = std::current_exception();
        }
      }
    };
    std::vector<std::thread> pool;
    const int64_t helpers = std::min<int64_t>(threads, n) - 1;
    for (int64_t k = 0; k < helpers; k++) pool.emplace_back(work);
    work();
    for (auto &t : pool) t.join();
    if (error) std::rethrow_exception(error);
  };
}

}  // namespace

// A batch reader of the plan file at `plan_path` for windows of type `dtype` (a DType: DALI's type
// numbers), `outputs` windows per sample id, reads of about `task_bytes` per task, `prefetch`
// (1: announce a batch's ranges first), and, with n_channels > 0, the per-channel normalisation
// (x - mean[c]) / stddev[c] on `channel_axis` (the operator's arguments of the same names). Returns
// the reader (free it with dali_mesh_reader_close), or null with the reason in `err` (a plan file
// the loader refuses, options that do not fit it).
DM_EXPORT void *dali_mesh_reader_open(const char *plan_path, int dtype, int outputs, int64_t task_bytes,
                                      int prefetch, const float *mean, const float *stddev, int64_t n_channels,
                                      int channel_axis, char *err, int64_t err_len) {
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
    r->Read(dst, ThreadsRunner(threads));
    return r->num_windows();
  } catch (const std::exception &e) {
    return Fail(e.what(), err, err_len);
  }
}
