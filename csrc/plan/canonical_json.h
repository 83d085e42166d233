// dali_mesh: the canonical form of a JSON metadata file, as a plan's check holds it (DALI-free).
#ifndef DALI_MESH_PLAN_CANONICAL_JSON_H_
#define DALI_MESH_PLAN_CANONICAL_JSON_H_

#include <string>

namespace dali_mesh {

// A JSON object's canonical form for the "file changed since the plan" check: whitespace outside
// strings dropped, the top-level members sorted by their key (as written, quotes included), the
// members "attributes" and "dimension_names" left out (Zarr v3 keeps user attributes and axis names
// in zarr.json; neither changes the bytes of a chunk). Values are kept as written. Returns false
// when `text` is not one JSON object (as far as this scan can tell). The only implementation: the
// Python planner calls it through dali_mesh._kernels.canonical_json.
bool CanonicalJson(const std::string &text, std::string *out);

}  // namespace dali_mesh

#endif  // DALI_MESH_PLAN_CANONICAL_JSON_H_
