// Core facts: dtypes, devices, settings, logging, build information.
#include <pybind11/stl.h>

#include "bindings.h"
#include "tutti/tutti.h"

namespace tutti {
namespace py {

namespace pyb = pybind11;

void bind_core(pyb::module_& m) {
  m.attr("__version__") = pyb::str(std::to_string(TUTTI_VERSION_MAJOR) + "." +
                                   std::to_string(TUTTI_VERSION_MINOR) + "." +
                                   std::to_string(TUTTI_VERSION_PATCH));
  m.def("cuda_built", &cuda_built, "True when tutti was compiled with CUDA.");
  m.def("nccl_built", [] { return static_cast<bool>(TUTTI_WITH_NCCL); },
        "True when tutti was compiled with the NCCL backend.");
  m.def("cuda_device_count", &cuda_device_count,
        "CUDA devices visible to this process (0 without CUDA).");
  m.def("dtype_names", [] {
    std::vector<std::string> out;
    for (int d = 0; d < kNumDTypes; ++d) out.push_back(dtype_name(static_cast<DType>(d)));
    return out;
  }, "Names of the element types tutti supports.");
  // The timeline (docs/timeline.md), as Horovod's hvd.start_timeline.
  m.def("start_timeline", &timeline::start, pyb::arg("path"),
        "Start recording this rank's Chrome/Perfetto trace: <path>.rank<R>.json, or "
        "<path>/rank<R>.json when path is a directory (TUTTI_TIMELINE does it at init).");
  m.def("stop_timeline", &timeline::stop, pyb::call_guard<pyb::gil_scoped_release>(),
        "Flush and close the timeline (idempotent; shutdown() calls it).");
  m.def("timeline_active", &timeline::active, "True while a timeline records.");
  m.def("timeline_file", &timeline::file, "The trace file being written ('' when none).");
  m.def("timeline_mark", &timeline::mark, pyb::arg("name"),
        "An instant event on the compute track.");
  m.def("timeline_begin", &timeline::begin, pyb::arg("name"),
        "Open a span on this thread's compute track.");
  m.def("timeline_end", &timeline::end, "Close this thread's innermost span.");
  m.def("config_get", [](const std::string& name) {
    return config::get_string(name.c_str());
  }, pyb::arg("name"), "The current value (or default) of a TUTTI_* setting.");
  m.def("config_reload", &config::reload,
        "Re-read TUTTI_* settings from the environment (after os.environ changes).");
  m.def("config_settings", [] {
    pyb::list out;
    for (const auto& s : config::all_settings())
      out.append(pyb::make_tuple(s.name, s.type, s.default_value, s.help));
    return out;
  }, "Every TUTTI_* setting as (name, type, default, help).");
  m.def("set_log_level", [](const std::string& level) {
    static const std::pair<const char*, LogLevel> kLevels[] = {
        {"error", LogLevel::kError}, {"warn", LogLevel::kWarn},
        {"info", LogLevel::kInfo},   {"debug", LogLevel::kDebug},
        {"trace", LogLevel::kTrace}};
    for (const auto& l : kLevels)
      if (level == l.first) return set_log_level(l.second);
    throw Error(ErrorCode::kInvalidArgument,
                "log level '" + level + "' is not one of error, warn, info, debug, trace");
  }, pyb::arg("level"));
  m.def("log", [](const std::string& level, const std::string& msg) {
    const LogLevel l = level == "error" ? LogLevel::kError
                       : level == "warn" ? LogLevel::kWarn
                       : level == "debug" ? LogLevel::kDebug
                                          : LogLevel::kInfo;
    if (log_enabled(l)) log_message(l, msg);
  }, pyb::arg("level"), pyb::arg("message"), "Rank-prefixed log line.");
}

}  // namespace py
}  // namespace tutti
