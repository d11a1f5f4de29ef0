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
// goes on.
class UnreachableLog {
 public:
  void report(const char* source, const std::string& url, const HttpResponse& r);

 private:
  bool logged_ = false;
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
