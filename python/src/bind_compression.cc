// Gradient compression: tutti.Compressor objects the Reducer passes each
// bucket through, created by name with their options, with checkpointable
// state (error-feedback residuals, PowerSGD factors) through Stateful.
#include <pybind11/stl.h>

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
        return d;
      }, "Totals since construction or reset_stats(): uncompressed_bytes, "
         "wire_bytes, encode/comm/decode seconds.")
      .def("reset_stats", &Compressor::reset_stats)
      .def("__repr__", [](const Compressor& c) {
        return "<tutti.Compressor '" + c.name() + "'>";
      });
}

}  // namespace py
}  // namespace tutti
