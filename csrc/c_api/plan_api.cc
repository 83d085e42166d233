// dali_mesh: the C entry points of the read plans (csrc/plan/plan.h, csrc/reader/), in
// libdali_mesh_kernels.so and bound in dali_mesh/_kernels/plan_api.py: a loaded plan file as JSON, the plan
// format's canonical JSON and checksum (so that Python's writer is checked against this reader),
// and test hooks that run the plan executor's pieces on a plan file written by dali_mesh.pipeline.native.
//
// Functions that take `err` return a count or size (>= 0) on success, or -1 with a message in
// err[0..err_len).
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <exception>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "c_api/export.h"
#include "kernels/slice_gpu.h"
#include "plan/plan.h"
#include "plan/plan_fields.h"
#include "reader/device_fill.h"
#include "reader/finish.h"
#include "reader/tasks.h"

using dali_mesh::c_api::Fail;

namespace {

// A JSON writer for PlanSetJson: `"name":value` members, a comma before each but the first of an
// object or list; byte strings (paths, check and fill bytes) as lowercase hex, since a JSON string
// cannot hold any bytes.
class Json {
 public:
  void Open(char c) {
    Sep();
    s_ += c;
  }
  void Close(char c) { s_ += c; }
  void Key(const char *name) {
    Sep();
    s_ += '"';
    s_ += name;
    s_ += "\":";
    after_key_ = true;
  }
  void Int(const char *name, int64_t v) {
    Key(name);
    Raw(std::to_string(v));
  }
  void Bool(const char *name, bool v) {
    Key(name);
    Raw(v ? "true" : "false");
  }
  void Bytes(const char *name, const std::string &b) {
    static const char kDigits[] = "0123456789abcdef";
    std::string h = "\"";
    for (unsigned char c : b) {
      h += kDigits[c >> 4];
      h += kDigits[c & 15];
    }
    Key(name);
    Raw(h + '"');
  }
  void Ints(const char *name, const std::vector<int64_t> &v) {
    if (name) Key(name);
    Open('[');
    for (int64_t x : v) Raw(std::to_string(x));
    Close(']');
  }
  // One field of a list of plan/plan_fields.h, by its type.
  void Field(const char *name, int64_t v) { Int(name, v); }
  void Field(const char *name, const std::string &v) { Bytes(name, v); }
  void Field(const char *name, const std::vector<int64_t> &v) { Ints(name, v); }
  // `"name":[...]`, an object per entry of `v` written by `each(entry)` between its braces.
  template <class T, class Each>
  void Objects(const char *name, const std::vector<T> &v, Each &&each) {
    Key(name);
    Open('[');
    for (const T &x : v) {
      Open('{');
      each(x);
      Close('}');
    }
    Close(']');
  }
  void IntLists(const char *name, const std::vector<std::vector<int64_t>> &v) {
    Key(name);
    Open('[');
    for (const auto &row : v) Ints(nullptr, row);
    Close(']');
  }
  const std::string &str() const { return s_; }

 private:
  void Sep() {
    if (!after_key_ && !s_.empty() && s_.back() != '{' && s_.back() != '[') s_ += ',';
    after_key_ = false;
  }
  void Raw(const std::string &v) {
    Sep();
    s_ += v;
  }
  std::string s_;
  bool after_key_ = false;
};

// Every field of a loaded plan set, named as in plan/plan.h; those the file holds in its order (the lists
// of plan/plan_fields.h, which the loader reads by).
std::string PlanSetJson(const dali_mesh::PlanSet &set) {
  Json j;
  const auto field = [&j](const char *name, const auto &v) { j.Field(name, v); };
  j.Open('{');
  j.Bytes("source", set.source);
  j.Objects("plans", set.plans, [&](const dali_mesh::ReadPlan &p) {
    j.Int("ndim", p.ndim);
    dali_mesh::ForEachField(p, dali_mesh::kReadPlanSizeFields, field);
    j.Bool("fortran", p.fortran);
    j.Bool("coded", p.coded);
    j.Ints("shape", p.shape);
    dali_mesh::ForEachField(p, dali_mesh::kReadPlanUnitFields, field);
    dali_mesh::ForEachField(p, dali_mesh::kReadPlanGroupFields, field);
    dali_mesh::ForEachField(p, dali_mesh::kReadPlanCheckFields, field);
    j.IntLists("copy_dst", p.copy_dst);
    j.IntLists("copy_src", p.copy_src);
    j.IntLists("fills", p.fills);
    j.Int("max_gap", p.max_gap);  // derived when loaded
  });
  j.Objects("files", set.files, [&](const dali_mesh::PlanFile &f) {
    dali_mesh::ForEachField(f, dali_mesh::kPlanFileFields, [&](const char *name, const auto &v) {
      if constexpr (std::is_same_v<std::decay_t<decltype(v)>, int64_t>) {
        if (std::strcmp(name, "store") == 0) return j.Bytes(name, set.stores[v]);  // the store's spec, not its index
      }
      j.Field(name, v);
    });
  });
  j.Objects("parts", set.parts,
            [&](const dali_mesh::PlanPart &q) { dali_mesh::ForEachField(q, dali_mesh::kPlanPartFields, field); });
  j.Objects("coders", set.coders, [&](const dali_mesh::Coder &c) {
    std::vector<int64_t> ids, args;
    for (const auto &st : c.steps) {
      ids.push_back(st.id);
      args.push_back(st.arg);
    }
    j.Ints("ids", ids);
    j.Ints("args", args);
    j.Int("chunk_bytes", c.chunk_bytes);
    j.Bytes("fill", c.fill);
  });
  j.Objects("chunks", set.chunks,
            [&](const dali_mesh::PlanChunk &c) { dali_mesh::ForEachField(c, dali_mesh::kPlanChunkFields, field); });
  j.Objects("items", set.items, [&](const dali_mesh::PlanItem &it) {
    j.Int("finish", it.finish);
    j.Int("part_begin", it.part_begin);
    j.Int("part_end", it.part_end);
  });
  j.Close('}');
  return j.str();
}

// What the entry points on a plan file share: `body(set)` on the plan file at `plan_path` as LoadPlanSet
// loads it (checked), its result; or -1 with the error's message (the plan file refused, or what `body`
// threw) in err[0..err_len).
template <typename Body>
int64_t OnPlanFile(const char *plan_path, char *err, int64_t err_len, Body &&body) {
  try {
    dali_mesh::PlanSet set = dali_mesh::LoadPlanSet(plan_path);
    return body(set);
  } catch (const std::exception &e) {
    return Fail(e.what(), err, err_len);
  }
}

}  // namespace

// The plan file at `plan_path` as LoadPlanSet loads it (checked, JSON checks in canonical form),
// as one JSON object: {"source", "plans": [ReadPlan...], "files": [PlanFile...], "parts":
// [PlanPart...], "items": [PlanItem...]}, every field named as in plan/plan.h, byte strings
// (source, path, check, fill) in hex. Returns the text's length n (without its NUL); the text and a
// NUL are written to out[0..out_size) only when out_size > n, so that a caller can retry with a
// buffer of n + 1. -1 on an error (the plan file refused), described in `err`.
DM_EXPORT int64_t dali_mesh_plan_dump(const char *plan_path, char *out, int64_t out_size, char *err,
                                      int64_t err_size) {
  return OnPlanFile(plan_path, err, err_size, [&](dali_mesh::PlanSet &set) -> int64_t {
    return dali_mesh::c_api::CopyText(PlanSetJson(set), out, out_size);
  });
}

// The canonical form (CanonicalJson) of text[0..n): returns its length m, written to
// out[0..out_size) (no NUL) only when out_size >= m; -1 when the text is not one JSON object, -2
// when there is no memory for it.
DM_EXPORT int64_t dali_mesh_canonical_json(const char *text, int64_t n, char *out, int64_t out_size) {
  if (n < 0 || (n > 0 && !text)) return -1;
  std::string canon;
  try {
    if (!dali_mesh::CanonicalJson(std::string(text ? text : "", n), &canon)) return -1;
  } catch (const std::exception &) {
    return -2;
  }
  const int64_t m = canon.size();
  if (out && out_size >= m) std::memcpy(out, canon.data(), m);
  return m;
}

// The plan file checksum (PlanChecksum, as LoadPlanSet verifies it) of the n_bytes / 8 words at
// `words` (a plan file's words after the magic, its checksum left out) into *out. Returns 0, or -1
// when n_bytes is not a whole number of words.
DM_EXPORT int dali_mesh_plan_checksum(const uint8_t *words, int64_t n_bytes, uint64_t *out) {
  if (n_bytes < 0 || n_bytes % 8 || (n_bytes && !words) || !out) return -1;
  *out = dali_mesh::PlanChecksum(reinterpret_cast<const char *>(words), static_cast<size_t>(n_bytes / 8));
  return 0;
}

// For every plan of the plan file at `plan_path`: a window of pseudo-random bytes (the cells read)
// finished by the host program (FinishWindow) and, where DeviceFillProgram gives one, by the GPU
// strided-slice kernel's host emulation (BuildGpuPlan + EmulateGpuPlan) into another buffer.
// Returns the number of plans whose device program equals the host's byte for byte, or -1 (a
// mismatch or an error, described in `err`); *host_only counts the plans left to the host.
DM_EXPORT int64_t dali_mesh_check_device_fill(const char *plan_path, int dtype, int64_t *host_only,
                                              char *err, int64_t err_len) {
  return OnPlanFile(plan_path, err, err_len, [&](dali_mesh::PlanSet &set) -> int64_t {
    using namespace dali_mesh;  // NOLINT
    int64_t checked = 0;
    *host_only = 0;
    uint64_t x = 0x2545F4914F6CDD1Dull;
    for (size_t k = 0; k < set.plans.size(); k++) {
      const ReadPlan &plan = set.plans[k];
      SliceSample sample;
      if (!DeviceFillProgram(plan, &sample).empty()) {
        ++*host_only;
        continue;
      }
      std::vector<char> window(plan.bytes());
      for (auto &c : window) {  // xorshift: every byte of the window, read or not
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        c = static_cast<char>(x >> 56);
      }
      std::vector<char> host = window, device(plan.bytes(), '\xcd');
      FinishWindow(plan, host.data(), host.data());
      const void *in[1] = {window.data()};
      void *out[1] = {device.data()};
      GpuPlan gplan;
      std::string e = BuildGpuPlan({sample}, in, out, DeviceFillParams(plan, dtype), &gplan);
      if (!e.empty()) return Fail("plan " + std::to_string(k) + ": BuildGpuPlan: " + e, err, err_len);
      EmulateGpuPlan(gplan);
      if (host != device) {
        size_t i = 0;
        while (host[i] == device[i]) i++;
        return Fail("plan " + std::to_string(k) + ": the device fill differs from the host's at byte " +
                        std::to_string(i),
                    err, err_len);
      }
      checked++;
    }
    return checked;
  });
}

// For every plan of the plan file at `plan_path`: its groups split as the operator splits them
// (SplitLargeGroups, then SplitGroups with `task_bytes`). Returns the number of tasks of all plans
// (-1 on an error, described in `err`); *max_task is the most file bytes one task spans.
DM_EXPORT int64_t dali_mesh_plan_tasks(const char *plan_path, int64_t task_bytes, int64_t *max_task,
                                       char *err, int64_t err_len) {
  return OnPlanFile(plan_path, err, err_len, [&](dali_mesh::PlanSet &set) -> int64_t {
    using namespace dali_mesh;  // NOLINT
    int64_t n = 0;
    *max_task = 0;
    for (auto &plan : set.plans) {
      SplitLargeGroups(&plan, task_bytes);
      for (auto &t : SplitGroups(plan, task_bytes)) {
        n++;
        const int64_t b = plan.group_begin[t.first], e = plan.group_end[t.second - 1];
        *max_task = std::max(*max_task, plan.file_end(e - 1) - plan.file_off[b]);
      }
    }
    return n;
  });
}
