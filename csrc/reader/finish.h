// dali_mesh: finishing a window on the host once its bytes are read: the Fortran transpose, the
// boundary program (copies and constant fills) and the per-channel normalisation. DALI-free.
#ifndef DALI_MESH_READER_FINISH_H_
#define DALI_MESH_READER_FINISH_H_

#include <vector>

#include "plan/plan.h"

namespace dali_mesh {

// Fortran transpose (staging -> out; staging == out for C order), then (with `boundary`) the
// copies and fills.
void FinishWindow(const ReadPlan &plan, char *staging, char *out, bool boundary = true);

// Per-channel normalisation of a finished float32 window `out` of `plan`, in place:
// x = (x - mean[c]) / stddev[c], c the index on `channel_axis` (its extent is mean's size), the
// arithmetic as the strided-slice kernel's (float32). Every cell, the boundary's too (a constant
// cell becomes (fill - mean[c]) / stddev[c]): the window of the normalised sample padded as the
// unnormalised one was, as normalising the whole window after the read gives it.
void NormalizeWindow(const ReadPlan &plan, char *out, int channel_axis, const std::vector<float> &mean,
                     const std::vector<float> &stddev);

}  // namespace dali_mesh

#endif  // DALI_MESH_READER_FINISH_H_
