// Minimal HTTP for metadata endpoints, through libcurl: no proxy (metadata
// addresses are link-local or loopback and must never go to a proxy), no
// redirects, a timeout per request, and a cap on the body size.
#pragma once

#include <string>
#include <vector>

namespace tutti {
namespace preempt {

struct HttpResponse {
  long status = 0;    // 0: no answer (refused, timed out, ...)
  std::string body;
  std::string error;  // curl's message when status is 0
};

// Logs once per source that its endpoint does not answer as expected (an
// instance of another cloud, no metadata service): not an error, polling
// goes on.  A throttled or failing endpoint (429, 5xx: Azure IMDS allows
// about 5 requests/s per VM) is paced: report() returns a backoff that
// doubles from 1 s to 60 s (logged once) until ok().
class UnreachableLog {
 public:
  // Returns the milliseconds to wait before the next request (0: the usual
  // poll interval).
  int report(const char* source, const std::string& url, const HttpResponse& r);
  // A good answer: back to the usual pace.
  void ok() { backoff_ms_ = 0; }

  static constexpr int kFirstBackoffMs = 1000;
  static constexpr int kMaxBackoffMs = 60000;

 private:
  bool logged_ = false;
  bool throttle_logged_ = false;
  int backoff_ms_ = 0;
};

class HttpClient {
 public:
  explicit HttpClient(int timeout_ms);
  ~HttpClient();
  HttpClient(const HttpClient&) = delete;
  HttpClient& operator=(const HttpClient&) = delete;
  // method: "GET" or "PUT" (with an empty body).  Headers as "Name: value".
  HttpResponse request(const std::string& method, const std::string& url,
                       const std::vector<std::string>& headers);

 private:
  void* curl_;
  int timeout_ms_;
};

}  // namespace preempt
}  // namespace tutti
