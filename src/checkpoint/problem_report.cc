#include "checkpoint/problem_report.h"

#include <algorithm>

#include <nlohmann/json.hpp>

#include "checkpoint/untrusted_json.h"
#include "core/check.h"

namespace tutti {
namespace ckpt {
namespace {

using json = nlohmann::json;

// An aggregate: {"p": [[rank, kind, text], ...] (by rank), "more": {kind: n}}.
json empty_aggregate() { return {{"p", json::array()}, {"more", json::object()}}; }

void merge(json& into, const json& child, size_t cap) {
  std::vector<json> all(into["p"].begin(), into["p"].end());
  all.insert(all.end(), child["p"].begin(), child["p"].end());
  std::stable_sort(all.begin(), all.end(),
                   [](const json& a, const json& b) { return a[0].get<int>() < b[0].get<int>(); });
  json more = into["more"];
  for (auto it = child["more"].begin(); it != child["more"].end(); ++it)
    more[it.key()] = more.value(it.key(), uint64_t{0}) + it->get<uint64_t>();
  std::map<int64_t, size_t> kept;
  json p = json::array();
  for (json& x : all) {
    const int64_t kind = x[1].get<int64_t>();
    if (kept[kind]++ < cap) {
      p.push_back(std::move(x));
    } else {
      const std::string k = std::to_string(kind);
      more[k] = more.value(k, uint64_t{0}) + 1;
    }
  }
  into["p"] = std::move(p);
  into["more"] = std::move(more);
}

std::string truncated(const std::string& text) {
  if (text.size() <= kMaxText) return text;
  // Cut at a UTF-8 character boundary so the JSON stays valid.
  size_t n = kMaxText;
  while (n > 0 && (static_cast<unsigned char>(text[n]) & 0xc0) == 0x80) --n;
  return text.substr(0, n) + "...";
}

}  // namespace

std::string ProblemSummary::rank_list() const {
  std::string s = count > 1 ? "ranks " : "rank ";
  for (size_t i = 0; i < ranks.size(); ++i) s += (i ? ", " : "") + std::to_string(ranks[i]);
  if (count > ranks.size()) s += ", ... (" + std::to_string(count) + " ranks)";
  return s;
}

std::map<int64_t, ProblemSummary> gather_problems(Agreement& agree, int64_t kind,
                                                  const std::string& text, const char* phase,
                                                  std::string (*fallback)(int rank),
                                                  size_t cap) {
  json mine = empty_aggregate();
  if (kind != 0) {
    const std::string t = text.empty() && fallback ? fallback(agree.rank()) : text;
    mine["p"].push_back({agree.rank(), kind, truncated(t)});
  }
  const std::string all = agree.tree_gather(
      mine.dump(-1, ' ', false, json::error_handler_t::replace),
      [cap](std::string& into, const std::string& child) {
        json a = json::parse(into), b = json::parse(child);
        merge(a, b, cap);
        into = a.dump(-1, ' ', false, json::error_handler_t::replace);
      },
      phase);
  // Rank 0 composes; every rank gets the same summaries.
  json summaries = json::object();
  if (agree.rank() == 0) {
    const json agg = json::parse(all);
    for (const json& x : agg["p"]) {
      const std::string k = std::to_string(x[1].get<int64_t>());
      json& s = summaries[k];
      if (s.is_null()) s = {{"ranks", json::array()}, {"count", 0}, {"text", ""}};
      const int r = x[0].get<int>();
      std::string t = x[2].get<std::string>();
      if (t.empty()) t = "rank " + std::to_string(r) + " (no reason given)";
      s["ranks"].push_back(r);
      s["count"] = s["count"].get<uint64_t>() + 1;
      s["text"] = s["text"].get<std::string>() + (s["text"].get<std::string>().empty() ? "" : "; ") + t;
    }
    for (auto it = agg["more"].begin(); it != agg["more"].end(); ++it) {
      json& s = summaries[it.key()];
      if (s.is_null()) s = {{"ranks", json::array()}, {"count", 0}, {"text", ""}};
      s["count"] = s["count"].get<uint64_t>() + it->get<uint64_t>();
      s["text"] = s["text"].get<std::string>() + "; and " + std::to_string(it->get<uint64_t>()) +
                  " more ranks";
    }
  }
  const json got = parse_untrusted_json(
      agree.broadcast(summaries.dump(-1, ' ', false, json::error_handler_t::replace), 0, phase), 4,
      "problem reports");
  std::map<int64_t, ProblemSummary> out;
  for (auto it = got.begin(); it != got.end(); ++it) {
    ProblemSummary s;
    for (const json& r : (*it)["ranks"]) s.ranks.push_back(r.get<int>());
    s.count = (*it)["count"].get<uint64_t>();
    s.text = (*it)["text"].get<std::string>();
    out[std::stoll(it.key())] = std::move(s);
  }
  return out;
}

}  // namespace ckpt
}  // namespace tutti
