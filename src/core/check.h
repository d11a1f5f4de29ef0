// Internal check macros.  Each throws tutti::Error with file:line and, for the
// comparison forms, both operands ("a vs b").  Never exit() or abort().
#pragma once

#include <exception>
#include <sstream>
#include <string>

#include "tutti/error.h"
#include "tutti/export.h"

namespace tutti {
namespace detail {

inline void append_all(std::ostringstream&) {}
template <typename T, typename... Rest>
void append_all(std::ostringstream& os, const T& v, const Rest&... rest) {
  os << v;
  append_all(os, rest...);
}

// Concatenates its arguments with operator<<.
template <typename... Args>
std::string cat(const Args&... args) {
  std::ostringstream os;
  append_all(os, args...);
  return os.str();
}

// "rank 3: " once the world is known, "" before.  Exported (though not in
// the installed headers) so the Python extension's checks raise the same way.
TUTTI_API std::string rank_prefix();

// The message of a failed library call (MPI, NCCL):
// "<context>: <function> failed: <the library's text>", where <function> is
// the call's name without its arguments and <context> (the op, the group,
// the peer) may be empty.  One format for TUTTI_MPI_CHECK and
// TUTTI_NCCL_CHECK and their non-throwing forms.
inline std::string call_failed(const char* expr, const std::string& context,
                               const std::string& text) {
  std::string call(expr);
  const size_t paren = call.find('(');
  if (paren != std::string::npos) call.resize(paren);
  while (!call.empty() && call.back() == ' ') call.pop_back();
  return context.empty() ? cat(call, " failed: ", text)
                         : cat(context, ": ", call, " failed: ", text);
}

[[noreturn]] TUTTI_API void throw_error(ErrorCode code, const char* file,
                                        int line, const std::string& message);

// The Error held by `e`; any other exception becomes kInternal with its
// what() (for code that hands a failure on: a watchdog breaking a
// communicator, a work failing with its op's error).
Error error_of(const std::exception_ptr& e);

}  // namespace detail
}  // namespace tutti

// Throws Error(code) with "rank R: " + the concatenated arguments.
#define TUTTI_THROW(code, ...)                                               \
  ::tutti::detail::throw_error(::tutti::ErrorCode::code, __FILE__, __LINE__, \
                               ::tutti::detail::cat(__VA_ARGS__))

// Caller errors: kInvalidArgument with the given message.
#define TUTTI_ARG_CHECK(cond, ...)                  \
  do {                                              \
    if (!(cond)) TUTTI_THROW(kInvalidArgument, __VA_ARGS__); \
  } while (0)

// Invariants: kInternal naming the failed condition.
#define TUTTI_CHECK(cond, ...)                                              \
  do {                                                                      \
    if (!(cond))                                                            \
      TUTTI_THROW(kInternal, "check failed: " #cond " ", ##__VA_ARGS__);    \
  } while (0)

#define TUTTI_CHECK_OP_(a, b, op, ...)                                      \
  do {                                                                      \
    const auto& tutti_a_ = (a);                                             \
    const auto& tutti_b_ = (b);                                             \
    if (!(tutti_a_ op tutti_b_))                                            \
      TUTTI_THROW(kInternal, "check failed: " #a " " #op " " #b " (",       \
                  tutti_a_, " vs ", tutti_b_, ") ", ##__VA_ARGS__);         \
  } while (0)

#define TUTTI_CHECK_EQ(a, b, ...) TUTTI_CHECK_OP_(a, b, ==, ##__VA_ARGS__)
#define TUTTI_CHECK_NE(a, b, ...) TUTTI_CHECK_OP_(a, b, !=, ##__VA_ARGS__)
#define TUTTI_CHECK_LT(a, b, ...) TUTTI_CHECK_OP_(a, b, <, ##__VA_ARGS__)
#define TUTTI_CHECK_LE(a, b, ...) TUTTI_CHECK_OP_(a, b, <=, ##__VA_ARGS__)
#define TUTTI_CHECK_GE(a, b, ...) TUTTI_CHECK_OP_(a, b, >=, ##__VA_ARGS__)
