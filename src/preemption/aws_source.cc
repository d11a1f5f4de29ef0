// AWS EC2 spot interruption notices through IMDSv2.
//
// PUT {base}/latest/api/token (X-aws-ec2-metadata-token-ttl-seconds) gives a
// session token; with it (X-aws-ec2-metadata-token):
//   GET /latest/meta-data/spot/instance-action
//       200 {"action": "terminate"|"stop"|"hibernate", "time": "..."}: the
//       instance goes away in about two minutes -> kStop; 404: nothing.
//   GET /latest/meta-data/events/recommendations/rebalance
//       200 {"noticeTime": "..."}: elevated risk -> kRebalance; 404: nothing.
// A 401 means the token expired: fetch a new one next time.
#include <chrono>

#include "checkpoint/untrusted_json.h"
#include "preemption/http_client.h"
#include "preemption/notice_source.h"
#include "tutti/error.h"

namespace tutti {
namespace preempt {
namespace {

constexpr int kTokenTtlS = 21600;

// "spot/instance-action: terminate at 2026-11-23T22:50:00Z".  A 200 from
// this endpoint is a notice whatever its body: an unreadable one is still a
// stop (a false stop costs a checkpoint, a missed one the work since the
// last), described as such.
std::string describe_action(const std::string& body) {
  try {
    const auto doc = ckpt::parse_untrusted_json(body, 4, "aws spot/instance-action");
    const auto action = doc.find("action");
    const auto time = doc.find("time");
    if (doc.is_object() && action != doc.end() && action->is_string() && time != doc.end() &&
        time->is_string())
      return "spot/instance-action: " + action->get<std::string>() + " at " +
             time->get<std::string>();
  } catch (const Error&) {
  }
  return "spot/instance-action (unreadable body, treated as a stop): " + body.substr(0, 200);
}

class AwsSource : public NoticeSource {
 public:
  AwsSource(std::string base, int timeout_ms) : base_(std::move(base)), http_(timeout_ms) {}
  const char* name() const override { return "aws"; }

  Observation poll() override {
    Observation o;
    if (!ensure_token(&o)) return o;
    const std::vector<std::string> auth = {"X-aws-ec2-metadata-token: " + token_};
    HttpResponse r = http_.request("GET", base_ + "/latest/meta-data/spot/instance-action", auth);
    if (r.status == 401) token_.clear();
    if (r.status == 429 || r.status >= 500) {
      o.retry_after_ms = unreachable_.report("aws", base_ + "/latest/meta-data", r);
      return o;
    }
    if (r.status == 200) {
      o.kind = NoticeKind::kStop;
      o.detail = describe_action(r.body);
      return o;
    }
    r = http_.request("GET", base_ + "/latest/meta-data/events/recommendations/rebalance", auth);
    if (r.status == 401) token_.clear();
    if (r.status == 200) {
      o.kind = NoticeKind::kRebalance;
      o.detail = "events/recommendations/rebalance " + r.body;
    }
    return o;
  }

 private:
  bool ensure_token(Observation* o) {
    const auto now = std::chrono::steady_clock::now();
    if (!token_.empty() && now < expires_) return true;
    const HttpResponse r =
        http_.request("PUT", base_ + "/latest/api/token",
                      {"X-aws-ec2-metadata-token-ttl-seconds: " + std::to_string(kTokenTtlS)});
    if (r.status != 200 || r.body.empty()) {
      o->retry_after_ms = unreachable_.report("aws", base_ + "/latest/api/token", r);
      token_.clear();
      return false;
    }
    unreachable_.ok();
    token_ = r.body;
    expires_ = now + std::chrono::seconds(kTokenTtlS - 60);
    return true;
  }

  std::string base_;
  HttpClient http_;
  std::string token_;
  std::chrono::steady_clock::time_point expires_;
  UnreachableLog unreachable_;
};

}  // namespace

std::unique_ptr<NoticeSource> make_aws_source(const std::string& base_url, int timeout_ms) {
  return std::make_unique<AwsSource>(base_url, timeout_ms);
}

}  // namespace preempt
}  // namespace tutti
