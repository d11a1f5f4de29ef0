#include "preemption/http_client.h"

#include <curl/curl.h>

#include <algorithm>
#include <mutex>

#include "core/check.h"
#include "tutti/log.h"

namespace tutti {
namespace preempt {
namespace {

constexpr size_t kMaxBody = 1 << 20;

size_t on_data(char* ptr, size_t size, size_t n, void* user) {
  auto* body = static_cast<std::string*>(user);
  const size_t bytes = size * n;
  if (body->size() + bytes > kMaxBody) return 0;  // aborts the transfer
  body->append(ptr, bytes);
  return bytes;
}

void global_init() {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

}  // namespace

int UnreachableLog::report(const char* source, const std::string& url,
                           const HttpResponse& r) {
  if (r.status == 429 || r.status >= 500) {
    backoff_ms_ = backoff_ms_ ? std::min(2 * backoff_ms_, kMaxBackoffMs) : kFirstBackoffMs;
    if (!throttle_logged_)
      TUTTI_LOG(kWarn) << "preemption source " << source << ": " << url << " answered HTTP "
                       << r.status << "; backing off (" << kFirstBackoffMs / 1000
                       << " s, doubling up to " << kMaxBackoffMs / 1000 << " s)";
    throttle_logged_ = true;
    return backoff_ms_;
  }
  backoff_ms_ = 0;
  if (!logged_)
    TUTTI_LOG(kWarn) << "preemption source " << source << ": " << url << " answered "
                     << (r.status ? "HTTP " + std::to_string(r.status) : r.error)
                     << "; will keep polling";
  logged_ = true;
  return 0;
}

HttpClient::HttpClient(int timeout_ms) : curl_(nullptr), timeout_ms_(timeout_ms) {
  global_init();
  curl_ = curl_easy_init();
  if (!curl_) TUTTI_THROW(kInternal, "curl_easy_init failed");
}

HttpClient::~HttpClient() { curl_easy_cleanup(static_cast<CURL*>(curl_)); }

HttpResponse HttpClient::request(const std::string& method, const std::string& url,
                                 const std::vector<std::string>& headers) {
  CURL* c = static_cast<CURL*>(curl_);
  curl_easy_reset(c);
  HttpResponse r;
  struct curl_slist* list = nullptr;
  for (const auto& h : headers) list = curl_slist_append(list, h.c_str());
  curl_easy_setopt(c, CURLOPT_URL, url.c_str());
  curl_easy_setopt(c, CURLOPT_HTTPHEADER, list);
  curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);  // we run in a thread
  curl_easy_setopt(c, CURLOPT_NOPROXY, "*");
  curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 0L);
  curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, static_cast<long>(timeout_ms_));
  curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, static_cast<long>(timeout_ms_));
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_data);
  curl_easy_setopt(c, CURLOPT_WRITEDATA, &r.body);
  if (method == "PUT") {
    curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, "PUT");
    curl_easy_setopt(c, CURLOPT_POSTFIELDS, "");
    curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE, 0L);
  }
  const CURLcode rc = curl_easy_perform(c);
  if (rc == CURLE_OK) {
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &r.status);
  } else {
    r.error = curl_easy_strerror(rc);
    r.body.clear();
  }
  curl_slist_free_all(list);
  return r;
}

}  // namespace preempt
}  // namespace tutti
