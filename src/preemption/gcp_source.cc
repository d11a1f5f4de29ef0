// GCP spot / preemptible VM notices: GET
// {base}/computeMetadata/v1/instance/preempted with "Metadata-Flavor: Google"
// answers TRUE once the VM is being preempted (about 30 seconds before it
// stops), FALSE otherwise.
#include "preemption/http_client.h"
#include "preemption/notice_source.h"

namespace tutti {
namespace preempt {
namespace {

class GcpSource : public NoticeSource {
 public:
  GcpSource(std::string base, int timeout_ms) : base_(std::move(base)), http_(timeout_ms) {}
  const char* name() const override { return "gcp"; }

  Observation poll() override {
    Observation o;
    const std::string url = base_ + "/computeMetadata/v1/instance/preempted";
    const HttpResponse r = http_.request("GET", url, {"Metadata-Flavor: Google"});
    if (r.status != 200) {
      o.retry_after_ms = unreachable_.report("gcp", url, r);
      return o;
    }
    unreachable_.ok();
    std::string v = r.body;
    while (!v.empty() && (v.back() == '\n' || v.back() == '\r' || v.back() == ' ')) v.pop_back();
    if (v == "TRUE") {
      o.kind = NoticeKind::kStop;
      o.detail = "instance/preempted TRUE";
    }
    return o;
  }

 private:
  std::string base_;
  HttpClient http_;
  UnreachableLog unreachable_;
};

}  // namespace

std::unique_ptr<NoticeSource> make_gcp_source(const std::string& base_url, int timeout_ms) {
  return std::make_unique<GcpSource>(base_url, timeout_ms);
}

}  // namespace preempt
}  // namespace tutti
