// dali_mesh: finishing a window on the host (see finish.h).
#include "reader/finish.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

namespace dali_mesh {

using detail::Prod;

namespace {

void FillPattern(char *dst, int64_t nbytes, const char *value, int64_t itemsize) {
  if (nbytes <= 0) return;
  std::memcpy(dst, value, itemsize);
  int64_t done = itemsize;
  while (done < nbytes) {  // doubling copies: log2(n) memcpy calls
    int64_t n = std::min(done, nbytes - done);
    std::memcpy(dst + done, dst, n);
    done += n;
  }
}

template <int S>
void TransposeT(const char *stage, char *out, const std::vector<int64_t> &shape, int64_t itemsize) {
  // out (C order, `shape`) [i_0..i_{n-1}] = stage (C order, reversed shape) [i_{n-1}..i_0]: the
  // stage stride of out axis k is prod(shape[:k]) elements (out's Fortran strides)
  const int n = static_cast<int>(shape.size());
  const int64_t es = S ? S : itemsize;
  std::vector<int64_t> stride(n), idx(n, 0);
  int64_t st = 1;
  for (int k = 0; k < n; k++) {
    stride[k] = st;
    st *= shape[k];
  }
  const int64_t inner = shape[n - 1], inner_stride = stride[n - 1] * es;
  const int64_t rows = Prod(shape, 0, n - 1);
  for (int64_t r = 0; r < rows; r++) {
    int64_t off = 0;
    for (int k = 0; k < n - 1; k++) off += idx[k] * stride[k];
    const char *src = stage + off * es;
    for (int64_t i = 0; i < inner; i++, src += inner_stride, out += es) std::memcpy(out, src, es);
    for (int k = n - 2; k >= 0; k--) {  // odometer over the outer axes
      if (++idx[k] < shape[k]) break;
      idx[k] = 0;
    }
  }
}

}  // namespace

void FinishWindow(const ReadPlan &plan, char *staging, char *out, bool boundary) {
  const int64_t vol = plan.volume();
  if (vol == 0) return;
  const int64_t es = plan.itemsize;
  if (plan.fortran && staging != out) {
    switch (es) {
      case 1: TransposeT<1>(staging, out, plan.shape, es); break;
      case 2: TransposeT<2>(staging, out, plan.shape, es); break;
      case 4: TransposeT<4>(staging, out, plan.shape, es); break;
      case 8: TransposeT<8>(staging, out, plan.shape, es); break;
      default: TransposeT<0>(staging, out, plan.shape, es);
    }
  } else if (staging != out) {
    std::memcpy(out, staging, vol * es);
  }
  if (!boundary) return;
  // axis by axis, copies then fills (as dali_mesh.plan.WindowPlan.finish): a slab copied along
  // axis a may carry not-yet-valid cells of later axes, which their own passes overwrite
  for (int a = 0; a < plan.ndim; a++) {
    const int64_t outer = Prod(plan.shape, 0, a), n_a = plan.shape[a];
    const int64_t inner = Prod(plan.shape, a + 1, plan.shape.size()) * es;
    const auto &cd = plan.copy_dst[a], &cs = plan.copy_src[a], &fl = plan.fills[a];
    for (int64_t o = 0; o < outer; o++) {
      char *slab = out + o * n_a * inner;
      for (size_t k = 0; k < cd.size(); k++)
        std::memcpy(slab + cd[k] * inner, slab + cs[k] * inner, inner);
      for (int64_t p : fl) FillPattern(slab + p * inner, inner, plan.fill.data(), es);
    }
  }
}

void NormalizeWindow(const ReadPlan &plan, char *out, int channel_axis, const std::vector<float> &mean,
                     const std::vector<float> &stddev) {
  const int64_t outer = Prod(plan.shape, 0, channel_axis), nc = plan.shape[channel_axis];
  const int64_t inner = Prod(plan.shape, channel_axis + 1, plan.shape.size());
  float *x = reinterpret_cast<float *>(out);
  for (int64_t o = 0; o < outer; o++) {
    for (int64_t c = 0; c < nc; c++) {
      const float m = mean[c], sd = stddev[c];
      float *p = x + (o * nc + c) * inner;
      for (int64_t k = 0; k < inner; k++) p[k] = (p[k] - m) / sd;
    }
  }
}

}  // namespace dali_mesh
