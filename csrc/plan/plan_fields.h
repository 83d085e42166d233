// dali_mesh: the plan file's fields, object by object, in file order: one table per object, which the
// loader reads (plan_file.cc LoadPlanSet) and the dump writes (c_api/plan_api.cc dali_mesh_plan_dump),
// so that the two cannot drift apart. The schema's source is Python's field tables, which write the
// file (dali_mesh/plan/encoding.py, types.py); tests/io/test_read_plan.py holds these tables to them (the
// dump's fields, in order, are the tables'). A member that is an int64_t is one word, a std::string a byte
// string (its length, its bytes, padding to 8), a std::vector<int64_t> the words of an array whose count
// the file gave before it. Counts and the checks of what was read stay with the loader.
#ifndef DALI_MESH_PLAN_PLAN_FIELDS_H_
#define DALI_MESH_PLAN_PLAN_FIELDS_H_

#include <tuple>

#include "plan/plan.h"

namespace dali_mesh {

// One field of an object of type T: its name in the schema and the member that holds it.
template <class T, class M>
struct FieldOf {
  const char *name;
  M T::*member;
};
template <class T, class M>
FieldOf(const char *, M T::*) -> FieldOf<T, M>;

// Calls visit(name, member of obj) for each field of `table` (one below), in file order; obj const or not.
template <class Obj, class Table, class Visit>
void ForEachField(Obj &obj, const Table &table, Visit &&visit) {
  std::apply([&](const auto &...f) { (visit(f.name, obj.*(f.member)), ...); }, table);
}

// PlanFile (encoding.py _PLAN_FILE); `store` is an index into the plan set's store table.
inline constexpr std::tuple kPlanFileFields{
    FieldOf{"store", &PlanFile::store}, FieldOf{"key", &PlanFile::key}, FieldOf{"size", &PlanFile::size},
    FieldOf{"mtime_ns", &PlanFile::mtime_ns}, FieldOf{"tag", &PlanFile::tag},
    FieldOf{"check_offset", &PlanFile::check_offset}, FieldOf{"check", &PlanFile::check}};

// A row of the chunk table (PlanSet.add_chunk's arguments).
inline constexpr std::tuple kPlanChunkFields{FieldOf{"file", &PlanChunk::file}, FieldOf{"offset", &PlanChunk::offset},
                                             FieldOf{"nbytes", &PlanChunk::nbytes},
                                             FieldOf{"coder", &PlanChunk::coder}};

// One part of an item (types.py PlanPart).
inline constexpr std::tuple kPlanPartFields{FieldOf{"file", &PlanPart::file}, FieldOf{"plan", &PlanPart::plan},
                                            FieldOf{"base", &PlanPart::base}, FieldOf{"dst_base", &PlanPart::dst_base}};

// A ReadPlan's sizes (encoding.py _READ_PLAN, after ndim); its flags follow, read and checked by the loader.
inline constexpr std::tuple kReadPlanSizeFields{FieldOf{"itemsize", &ReadPlan::itemsize},
                                                FieldOf{"swap_unit", &ReadPlan::swap_unit}};

// A ReadPlan's arrays of its units, each of its unit count (encoding.py _READ_PLAN, after n_groups), then
// those of its read groups, each of its group count.
inline constexpr std::tuple kReadPlanUnitFields{
    FieldOf{"file_off", &ReadPlan::file_off},     FieldOf{"dst_off", &ReadPlan::dst_off},
    FieldOf{"unit_bytes", &ReadPlan::unit_bytes}, FieldOf{"unit_count", &ReadPlan::unit_count},
    FieldOf{"file_step", &ReadPlan::file_step},   FieldOf{"dst_step", &ReadPlan::dst_step}};
inline constexpr std::tuple kReadPlanGroupFields{FieldOf{"group_begin", &ReadPlan::group_begin},
                                                 FieldOf{"group_end", &ReadPlan::group_end}};

// A ReadPlan's check and fill value (after its groups' arrays); its axes' programs follow.
inline constexpr std::tuple kReadPlanCheckFields{FieldOf{"check_offset", &ReadPlan::check_offset},
                                                 FieldOf{"check", &ReadPlan::check}, FieldOf{"fill", &ReadPlan::fill}};

}  // namespace dali_mesh

#endif  // DALI_MESH_PLAN_PLAN_FIELDS_H_
