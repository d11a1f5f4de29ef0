// Preemption: tutti.PreemptionMonitor (signals, trigger file, AWS / GCP /
// Azure metadata) and the collective stop decision.
//
// exit_preempted() is not bound: the C++ function exits from inside the
// interpreter; tutti.exit_preempted() (Python) closes checkpoint managers,
// shuts tutti down and raises SystemExit(PREEMPTED_EXIT_CODE) instead.
#include "bindings.h"

#include <pybind11/stl.h>

#include <memory>
#include <optional>

#include "convert.h"
#include "tutti/preemption.h"

#include "core/check.h"

namespace tutti {
namespace py {
namespace {

// close() restores the signal handlers at a point the program chooses.
struct PyMonitor {
  std::unique_ptr<PreemptionMonitor> mon;
  PreemptionMonitor& get() {
    TUTTI_ARG_CHECK(mon != nullptr, "PreemptionMonitor is closed");
    return *mon;
  }
};

}  // namespace

void bind_preemption(pyb::module_& m) {
  m.attr("PREEMPTED_EXIT_CODE") = kPreemptedExitCode;
  pyb::enum_<NoticeKind>(m, "NoticeKind", "How urgent a preemption notice is.")
      .value("NONE", NoticeKind::kNone)
      .value("REBALANCE", NoticeKind::kRebalance)
      .value("STOP", NoticeKind::kStop);

  pyb::enum_<PreemptionAction>(m, "PreemptionAction",
                                "What every rank does at a step boundary (decide()).")
      .value("CONTINUE", PreemptionAction::kContinue)
      .value("SAVE_NOW", PreemptionAction::kSaveNow,
             "an early warning (AWS rebalance recommendation): save now, keep training")
      .value("STOP", PreemptionAction::kStop,
             "save, wait for the commit, exit_preempted()");

  auto group_or_world = [](std::shared_ptr<ProcessGroup> g) {
    return g ? g : world();
  };
  pyb::class_<PyMonitor>(
      m, "PreemptionMonitor",
      "Watches for preemption notices (SIGTERM/SIGUSR1/SIGUSR2, a trigger file, "
      "AWS/GCP/Azure metadata) and lets every rank stop at the same step: call "
      "should_stop() (collective) once per step.")
      .def(pyb::init([](std::string sources, int poll_ms, std::string trigger_file,
                        std::string aws_url, std::string gcp_url, std::string azure_url,
                        int http_timeout_ms, std::optional<bool> stop_on_rebalance) {
             PreemptionOptions o;
             o.sources = std::move(sources);
             o.poll_ms = poll_ms;
             o.trigger_file = std::move(trigger_file);
             o.aws_url = std::move(aws_url);
             o.gcp_url = std::move(gcp_url);
             o.azure_url = std::move(azure_url);
             o.http_timeout_ms = http_timeout_ms;
             o.stop_on_rebalance = stop_on_rebalance;
             auto p = std::make_unique<PyMonitor>();
             pyb::gil_scoped_release nogil;
             p->mon = std::make_unique<PreemptionMonitor>(o);
             return p;
           }),
           pyb::kw_only(), pyb::arg("sources") = "", pyb::arg("poll_ms") = 0,
           pyb::arg("trigger_file") = "", pyb::arg("aws_url") = "",
           pyb::arg("gcp_url") = "", pyb::arg("azure_url") = "",
           pyb::arg("http_timeout_ms") = 0, pyb::arg("stop_on_rebalance") = pyb::none(),
           "sources: comma-separated signals,file,aws,gcp,azure, 'all' or 'none' "
           "('' = TUTTI_PREEMPT_SOURCES).  Empty/zero options take their TUTTI_* "
           "setting.  Installs signal handlers until the monitor is closed.")
      .def("local", [](PyMonitor& p) { return p.get().local(); },
           "The most urgent notice this process has seen (no communication).")
      .def("notice", [](PyMonitor& p) -> pyb::object {
        auto n = p.get().notice();
        if (!n) return pyb::none();
        pyb::dict d;
        d["kind"] = n->kind;
        d["source"] = n->source;
        d["detail"] = n->detail;
        d["seconds_since_start"] = n->seconds_since_start;
        return std::move(d);
      }, "{kind, source, detail, seconds_since_start} of the most urgent notice, or None.")
      .def("agree", [group_or_world](PyMonitor& p, std::shared_ptr<ProcessGroup> g) {
        auto group = group_or_world(g);
        PreemptionMonitor& mon = p.get();
        pyb::gil_scoped_release nogil;
        return mon.agree(*group);
      }, pyb::arg("group") = pyb::none(),
         "Collective: the most urgent notice any rank has seen (MAX), the same everywhere.")
      .def("should_stop",
           [group_or_world](PyMonitor& p, std::shared_ptr<ProcessGroup> g) {
             auto group = group_or_world(g);
             PreemptionMonitor& mon = p.get();
             pyb::gil_scoped_release nogil;
             return mon.should_stop(*group);
           },
           pyb::arg("group") = pyb::none(),
           "Collective: True on every rank at the same call once any rank saw a "
           "stop notice (or a rebalance with stop_on_rebalance).")
      .def("decide",
           [group_or_world](PyMonitor& p, std::shared_ptr<ProcessGroup> g) {
             auto group = group_or_world(g);
             PreemptionMonitor& mon = p.get();
             pyb::gil_scoped_release nogil;
             return mon.decide(*group);
           },
           pyb::arg("group") = pyb::none(),
           "Collective: the agreed notice as a PreemptionAction, the same on every "
           "rank: STOP as should_stop(); SAVE_NOW at the first call that agrees on a "
           "rebalance recommendation (once per monitor); else CONTINUE.")
      .def("notify",
           [](PyMonitor& p, NoticeKind kind, const std::string& source,
              const std::string& detail) { p.get().notify(kind, source, detail); },
           pyb::arg("kind"), pyb::arg("source"), pyb::arg("detail") = "",
           "Raises a notice from code (a custom source, a test).")
      .def_property_readonly("sources", [](PyMonitor& p) { return p.get().sources(); })
      .def("close", [](PyMonitor& p) {
        pyb::gil_scoped_release nogil;
        p.mon.reset();
      }, "Stops polling and restores the previous signal handlers.")
      .def("__enter__", [](pyb::object self) { return self; })
      .def("__exit__", [](PyMonitor& p, pyb::args) {
        pyb::gil_scoped_release nogil;
        p.mon.reset();
        return false;
      });
}

}  // namespace py
}  // namespace tutti
