// dali_mesh: the plan fuzz harness (tests/io/test_plan_fuzz.py builds it with AddressSanitizer and
// UndefinedBehaviorSanitizer and runs it over plan files with crafted words). For each plan file of
// argv[2..]: LoadPlanSet, then every item read by the reader's pieces (csrc/reader/) as
// fn.dali_mesh.read_windows reads it (groups split into tasks of argv[1] bytes; raw parts opened,
// checked and read by ReadGroups; coded parts' chunks read and decoded by ReadChunk into a buffer of
// exactly the chunk's bytes, their units copied out by CopyUnits; FinishWindow), into heap buffers
// of exactly the window's bytes, so that a write or read past any of them is a report. Prints one
// line per file: "ok <FNV-1a of every window>" or "err <reason>".
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "codecs/codecs.h"
#include "plan/plan.h"
#include "reader/finish.h"
#include "reader/open_file.h"
#include "reader/read_units.h"
#include "reader/tasks.h"

namespace {

uint64_t Fnv(uint64_t h, const char *p, int64_t n) {
  for (int64_t i = 0; i < n; i++) h = (h ^ static_cast<unsigned char>(p[i])) * 1099511628211ull;
  return h;
}

// what the harness allocates at most for one window or decoded chunk: a crafted shape may claim
// terabytes, which the loader cannot tell from a large real window (the operator's output
// allocation then fails in DALI)
constexpr int64_t kMaxBuffer = int64_t(1) << 24;

void Cap(int64_t bytes, const char *what) {
  if (bytes > kMaxBuffer)
    throw std::runtime_error(std::string(what) + " of " + std::to_string(bytes) + " bytes: more than the harness allocates");
}

uint64_t ReadEverything(const char *path, int64_t task_bytes) {
  using namespace dali_mesh;  // NOLINT
  PlanSet set = LoadPlanSet(path);
  for (auto &plan : set.plans)
    if (!plan.coded) SplitLargeGroups(&plan, task_bytes);
  uint64_t h = 1469598103934665603ull;
  for (const PlanItem &it : set.items) {
    const ReadPlan &fin = set.plans[it.finish];
    const int64_t bytes = fin.bytes();
    Cap(bytes, "a window");
    std::unique_ptr<char[]> out(new char[bytes ? bytes : 1]()), stage;
    char *dst = out.get();
    if (fin.fortran && fin.volume() > 0) {
      stage.reset(new char[bytes]());
      dst = stage.get();
    }
    std::vector<char> scratch;
    HeldBytes stored;
    for (int64_t k = it.part_begin; k < it.part_end; k++) {
      const PlanPart &part = set.parts[k];
      const ReadPlan &plan = set.plans[part.plan];
      if (plan.coded) {
        const int64_t chunk_bytes = set.coders[set.chunks[part.file].coder].chunk_bytes;
        Cap(chunk_bytes, "a decoded chunk");
        std::unique_ptr<char[]> decoded(new char[chunk_bytes ? chunk_bytes : 1]);
        std::vector<std::pair<int64_t, int64_t>> ranges;  // what the part copies out, as the operator asks
        AddUnitRanges(plan, part.base, &ranges);
        MergeRanges(&ranges);
        ReadChunk(set, part.file, plan, set.files[set.chunks[part.file].file].key, &stored, decoded.get(), &ranges);
        CopyUnits(plan, decoded.get() + part.base, dst + part.dst_base);
        continue;
      }
      OpenFile file;
      file.Open(set.files[part.file], plan, set.files[part.file].key);
      for (const auto &task : SplitGroups(plan, task_bytes))
        ReadGroups(file, plan, part.base, task.first, task.second, dst + part.dst_base, &scratch);
    }
    FinishWindow(fin, dst, out.get());
    h = Fnv(h, out.get(), bytes);
  }
  return h;
}

}  // namespace

int main(int argc, char **argv) {
  if (argc < 2) return 2;
  const int64_t task_bytes = std::strtoll(argv[1], nullptr, 10);
  for (int a = 2; a < argc; a++) {
    try {
      std::printf("ok %016llx\n", static_cast<unsigned long long>(ReadEverything(argv[a], task_bytes)));
    } catch (const std::exception &e) {
      std::string why = e.what();
      for (char &c : why)
        if (c == '\n') c = ' ';
      std::printf("err %s\n", why.c_str());
    }
  }
  return 0;
}
