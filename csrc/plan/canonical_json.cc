// dali_mesh: the canonical form of a JSON object (see canonical_json.h).
#include "plan/canonical_json.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

namespace dali_mesh {

bool CanonicalJson(const std::string &text, std::string *out) {
  // 1: whitespace outside strings dropped
  std::string s;
  s.reserve(text.size());
  bool in_str = false;
  for (size_t i = 0; i < text.size(); i++) {
    const char c = text[i];
    if (in_str) {
      s += c;
      if (c == '\\') {
        if (++i >= text.size()) return false;
        s += text[i];
      } else if (c == '"') {
        in_str = false;
      }
    } else if (c != ' ' && c != '\t' && c != '\n' && c != '\r') {
      s += c;
      if (c == '"') in_str = true;
    }
  }
  if (in_str || s.size() < 2 || s.front() != '{' || s.back() != '}') return false;
  // 2: the top-level members "key":value, split at the commas outside strings and brackets
  std::vector<std::pair<std::string, std::string>> members;
  const size_t end = s.size() - 1;  // the closing brace
  size_t i = 1;
  while (i < end) {
    if (s[i] != '"') return false;
    size_t k = i + 1;
    while (k < end && s[k] != '"') k += s[k] == '\\' ? 2 : 1;
    if (k >= end || s[k + 1] != ':') return false;
    std::string key = s.substr(i, k + 1 - i);
    const size_t v = k + 2;
    int depth = 0;
    bool str = false;
    for (i = v; i < end; i++) {
      const char c = s[i];
      if (str) {
        if (c == '\\') i++;
        else if (c == '"') str = false;
      } else if (c == '"') {
        str = true;
      } else if (c == '{' || c == '[') {
        depth++;
      } else if (c == '}' || c == ']') {
        if (--depth < 0) return false;
      } else if (c == ',' && depth == 0) {
        break;
      }
    }
    if (str || depth != 0 || i == v || i > end) return false;
    members.emplace_back(std::move(key), s.substr(v, i - v));
    if (i < end && ++i == end) return false;  // a comma before the closing brace
  }
  std::sort(members.begin(), members.end());
  out->assign(1, '{');  // (not assign("{"): a false -Wrestrict of GCC 12 at -O3)
  bool first = true;
  for (const auto &m : members) {
    if (m.first == "\"attributes\"" || m.first == "\"dimension_names\"") continue;
    if (!first) *out += ',';
    first = false;
    *out += m.first;
    *out += ':';
    *out += m.second;
  }
  *out += '}';
  return true;
}

}  // namespace dali_mesh
