// Gradient compression: tutti.Compressor objects the Reducer passes each
// bucket through, created by name with their options, with checkpointable
// state (error-feedback residuals, PowerSGD factors) through Stateful.
#include <pybind11/stl.h>

#include <optional>

#include "bindings.h"
#include "convert.h"
#include "tutti/compression.h"

namespace tutti {
namespace py {

void bind_compression(pyb::module_& m) {
  pyb::class_<Compressor, Stateful, std::shared_ptr<Compressor>>(
      m, "Compressor",
      "Replaces each gradient bucket's all-reduce (pass it to "
      "tutti.Reducer(compressor=...)).  Its state_dict() carries error-feedback "
      "residuals and PowerSGD factors.")
      .def_property_readonly("name", &Compressor::name)
      .def("stats", [](const Compressor& c) {
        const CompressStats s = c.stats();
        pyb::dict d;
        d["uncompressed_bytes"] = s.uncompressed_bytes;
        d["wire_bytes"] = s.wire_bytes;
        d["encode_seconds"] = s.encode_seconds;
        d["comm_seconds"] = s.comm_seconds;
        d["decode_seconds"] = s.decode_seconds;
        d["nonfinite_steps"] = s.nonfinite_steps;
        return d;
      }, "Totals since construction or reset_stats(): uncompressed_bytes, "
         "wire_bytes, encode/comm/decode seconds, nonfinite_steps (bucket steps "
         "skipped because some rank's gradients held Inf/NaN).")
      .def("reset_stats", &Compressor::reset_stats)
      .def("__repr__", [](const Compressor& c) {
        return "<tutti.Compressor '" + c.name() + "'>";
      });

  m.def("make_compressor",
        [](const std::string& name, std::optional<double> topk_ratio,
           std::optional<int> powersgd_rank, std::optional<int64_t> powersgd_start_step,
           std::optional<double> powersgd_min_compression,
           std::optional<int64_t> onebit_chunk, std::optional<int> auto_probe_steps,
           std::optional<uint64_t> seed) {
          CompressorOptions o = CompressorOptions::from_env();
          if (topk_ratio) o.topk_ratio = *topk_ratio;
          if (powersgd_rank) o.powersgd_rank = *powersgd_rank;
          if (powersgd_start_step) o.powersgd_start_step = *powersgd_start_step;
          if (powersgd_min_compression) o.powersgd_min_compression = *powersgd_min_compression;
          if (onebit_chunk) o.onebit_chunk = *onebit_chunk;
          if (auto_probe_steps) o.auto_probe_steps = *auto_probe_steps;
          if (seed) o.seed = *seed;
          return make_compressor(name, o);
        },
        pyb::arg("name"), pyb::kw_only(), pyb::arg("topk_ratio") = pyb::none(),
        pyb::arg("powersgd_rank") = pyb::none(),
        pyb::arg("powersgd_start_step") = pyb::none(),
        pyb::arg("powersgd_min_compression") = pyb::none(),
        pyb::arg("onebit_chunk") = pyb::none(), pyb::arg("auto_probe_steps") = pyb::none(),
        pyb::arg("seed") = pyb::none(),
        "A compressor by name: none, fp16, bf16, topk, powersgd, onebit, auto.  "
        "Options left None take their TUTTI_* setting (TUTTI_TOPK_RATIO, "
        "TUTTI_POWERSGD_RANK, TUTTI_POWERSGD_START_STEP, TUTTI_ONEBIT_CHUNK, "
        "TUTTI_AUTO_PROBE_STEPS); powersgd_min_compression (2.0) and seed (0) "
        "are code-only.");
}

}  // namespace py
}  // namespace tutti
