// Azure spot VM eviction notices through Scheduled Events: GET
// {base}/metadata/scheduledevents?api-version=2020-07-01 with "Metadata: true"
// returns {"DocumentIncarnation": n, "Events": [{"EventId": ..., "EventType":
// "Preempt", "Resources": ["vmname"], "NotBefore": ...}, ...]}.  A Preempt
// event naming this VM (or naming none) is a stop notice, at least 30
// seconds ahead.  The VM's own name comes from
// /metadata/instance/compute/name; while it is unknown, any Preempt event
// counts (a false stop costs a checkpoint, a missed one costs work).
#include "checkpoint/untrusted_json.h"
#include "preemption/http_client.h"
#include "preemption/notice_source.h"
#include "tutti/error.h"
#include "tutti/log.h"

namespace tutti {
namespace preempt {
namespace {

class AzureSource : public NoticeSource {
 public:
  AzureSource(std::string base, int timeout_ms) : base_(std::move(base)), http_(timeout_ms) {}
  const char* name() const override { return "azure"; }

  Observation poll() override {
    Observation o;
    if (vm_name_.empty()) {
      const HttpResponse n = http_.request(
          "GET", base_ + "/metadata/instance/compute/name?api-version=2021-02-01&format=text",
          {"Metadata: true"});
      if (n.status == 200) vm_name_ = n.body;
    }
    const std::string url = base_ + "/metadata/scheduledevents?api-version=2020-07-01";
    const HttpResponse r = http_.request("GET", url, {"Metadata: true"});
    if (r.status != 200) {
      o.retry_after_ms = unreachable_.report("azure", url, r);
      return o;
    }
    unreachable_.ok();
    try {
      const auto doc = ckpt::parse_untrusted_json(r.body, 8, "azure scheduledevents");
      if (!doc.is_object()) return o;
      const auto events = doc.find("Events");
      if (events == doc.end() || !events->is_array()) return o;
      for (const auto& e : *events) {
        if (!e.is_object()) continue;
        const auto type = e.find("EventType");
        if (type == e.end() || !type->is_string() || type->get<std::string>() != "Preempt")
          continue;
        bool mine = true;
        const auto res = e.find("Resources");
        if (!vm_name_.empty() && res != e.end() && res->is_array() && !res->empty()) {
          mine = false;
          for (const auto& name : *res)
            if (name.is_string() && name.get<std::string>() == vm_name_) mine = true;
        }
        if (!mine) continue;
        o.kind = NoticeKind::kStop;
        o.detail = "scheduledevents " + e.dump();
        return o;
      }
    } catch (const Error& e) {
      if (!bad_json_)
        TUTTI_LOG(kWarn) << "preemption source azure: unreadable answer: " << e.message();
      bad_json_ = true;
    }
    return o;
  }

 private:
  std::string base_;
  HttpClient http_;
  std::string vm_name_;
  UnreachableLog unreachable_;
  bool bad_json_ = false;
};

}  // namespace

std::unique_ptr<NoticeSource> make_azure_source(const std::string& base_url, int timeout_ms) {
  return std::make_unique<AzureSource>(base_url, timeout_ms);
}

}  // namespace preempt
}  // namespace tutti
