// dali_mesh: the plan file's fields, object by object, in file order: one list per object, which the
// loader reads (plan_file.cc LoadPlanSet) and the dump writes (c_api/plan_api.cc dali_mesh_plan_dump),
// so that the two cannot drift apart. The schema's source is Python's field tables, which write the
// file (dali_mesh/plan/encoding.py, types.py); tests/io/test_read_plan.py holds these lists to them (the
// dump's fields, in order, are the tables'). A list calls field(name, member) once per field, in file
// order: an int64_t is one word, a std::string a byte string (its length, its bytes, padding to 8), a
// std::vector<int64_t> the words of an array whose count the file gave before it. Counts and the checks
// of what was read stay with the loader.
#ifndef DALI_MESH_PLAN_PLAN_FIELDS_H_
#define DALI_MESH_PLAN_PLAN_FIELDS_H_

#include "plan/plan.h"

namespace dali_mesh {

// PlanFile (encoding.py _PLAN_FILE); `store` is an index into the plan set's store table.
template <class File, class Field>
void PlanFileFields(File &f, Field &&field) {
  field("store", f.store);
  field("key", f.key);
  field("size", f.size);
  field("mtime_ns", f.mtime_ns);
  field("tag", f.tag);
  field("check_offset", f.check_offset);
  field("check", f.check);
}

// A row of the chunk table (PlanSet.add_chunk's arguments).
template <class Chunk, class Field>
void PlanChunkFields(Chunk &c, Field &&field) {
  field("file", c.file);
  field("offset", c.offset);
  field("nbytes", c.nbytes);
  field("coder", c.coder);
}

// One part of an item (types.py PlanPart).
template <class Part, class Field>
void PlanPartFields(Part &q, Field &&field) {
  field("file", q.file);
  field("plan", q.plan);
  field("base", q.base);
  field("dst_base", q.dst_base);
}

// A ReadPlan's arrays of its units, each of its unit count (encoding.py _READ_PLAN, after n_groups).
template <class Plan, class Field>
void ReadPlanUnitFields(Plan &p, Field &&field) {
  field("file_off", p.file_off);
  field("dst_off", p.dst_off);
  field("unit_bytes", p.unit_bytes);
  field("unit_count", p.unit_count);
  field("file_step", p.file_step);
  field("dst_step", p.dst_step);
}

// A ReadPlan's arrays of its read groups, each of its group count (after its units' arrays).
template <class Plan, class Field>
void ReadPlanGroupFields(Plan &p, Field &&field) {
  field("group_begin", p.group_begin);
  field("group_end", p.group_end);
}

}  // namespace dali_mesh

#endif  // DALI_MESH_PLAN_PLAN_FIELDS_H_
