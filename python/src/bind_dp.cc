// Data parallel: tutti.Reducer over DLPack parameter/gradient tensors.
//
// The reducer keeps views of the registered tensors for its lifetime; the
// Python object holds their DLPack capsules (attribute `_tensors`), so the
// memory stays alive even if the framework drops its own reference (torch:
// `p.data = ...`).  grad_ready() is called from autograd hooks and
// synchronize() waits for communication: both release the GIL.  The reducer
// is a Stateful (its reducing-step counter, which compressors see).
#include <pybind11/stl.h>

#include <memory>
#include <optional>
#include <vector>

#include "bindings.h"
#include "convert.h"
#include "core/check.h"
#include "tutti/data_parallel.h"

namespace tutti {
namespace py {
namespace {

// A context manager over Reducer::no_sync(); keeps the reducer alive (a
// NoSyncGuard must not outlive it).
struct PyNoSync {
  std::shared_ptr<Reducer> reducer;
  std::unique_ptr<NoSyncGuard> guard;
};

ReduceOp parse_grad_op(const pyb::handle& op) {
  if (pyb::isinstance<ReduceOp>(op)) return op.cast<ReduceOp>();
  const std::string s = pyb::str(op);
  if (s == "avg" || s == "average" || s == "mean") return ReduceOp::kAvg;
  if (s == "sum") return ReduceOp::kSum;
  TUTTI_THROW(kInvalidArgument, "Reducer op '", s, "' is not 'avg' or 'sum'");
}

pyb::dict stats_dict(const ReducerStats& s) {
  pyb::dict d;
  d["steps"] = s.steps;
  d["accumulation_passes"] = s.accumulation_passes;
  d["buckets_reduced"] = s.buckets_reduced;
  d["buckets_launched_early"] = s.buckets_launched_early;
  d["bytes_reduced"] = s.bytes_reduced;
  d["unready_gradients"] = s.unready_gradients;
  d["wait_seconds"] = s.wait_seconds;
  d["writeback_seconds"] = s.writeback_seconds;
  d["buffer_allocations"] = s.buffer_allocations;
  d["bucket_rebuilds"] = s.bucket_rebuilds;
  d["bytes_copied_in"] = s.bytes_copied_in;
  d["bytes_copied_out"] = s.bytes_copied_out;
  d["marked_unused"] = s.marked_unused;
  d["bucket_bytes"] = s.bucket_bytes;
  d["pool_waits"] = s.pool_waits;
  d["pool_growths"] = s.pool_growths;
  return d;
}

pyb::dict bucket_to_dict(const BucketLayout& b) {
  pyb::dict d;
  d["id"] = b.id;
  d["dtype"] = std::string(dtype_name(b.dtype));
  d["device"] = b.device.str();
  d["numel"] = b.numel;
  pyb::list slots;
  for (const auto& s : b.slots) {
    pyb::dict slot;
    slot["name"] = s.name;
    slot["offset"] = s.offset;
    slot["shape"] = pyb::tuple(pyb::cast(s.shape.vec()));
    slots.append(slot);
  }
  d["slots"] = slots;
  return d;
}

}  // namespace

void bind_dp(pyb::module_& m) {
  pyb::class_<PyNoSync>(m, "NoSync",
                        "Context manager: backward passes inside accumulate "
                        "locally and synchronize() returns False.")
      .def("__enter__", [](PyNoSync& n) {
        TUTTI_ARG_CHECK(!n.guard, "Reducer.no_sync(): this context is already open");
        n.guard = std::make_unique<NoSyncGuard>(n.reducer->no_sync());
        return &n;
      }, pyb::return_value_policy::reference)
      .def("__exit__", [](PyNoSync& n, pyb::args) {
        n.guard.reset();
        return false;
      });

  pyb::class_<Reducer, Stateful, std::shared_ptr<Reducer>>(
      m, "Reducer", pyb::dynamic_attr(),
      "Averages gradients over a data-parallel group while backward runs: "
      "register (param, grad) pairs, build(), then per backward pass "
      "grad_ready(i) as each gradient is final and synchronize() at the end.")
      .def(pyb::init([](std::shared_ptr<ProcessGroup> group,
                        std::optional<double> bucket_cap_mb,
                        std::optional<double> first_bucket_cap_mb,
                        int backward_passes_per_step, std::optional<bool> hierarchical,
                        int hierarchical_node_size, pyb::object compressor,
                        pyb::object op, std::string name,
                        std::optional<bool> learn_bucket_order,
                        bool find_unused_parameters, bool static_graph,
                        bool gradient_as_bucket_view, double gradient_predivide_factor,
                        std::optional<bool> check_parameters) {
             ReducerOptions o = ReducerOptions::from_env();
             if (bucket_cap_mb) o.bucket_cap_mb = *bucket_cap_mb;
             if (first_bucket_cap_mb) o.first_bucket_cap_mb = *first_bucket_cap_mb;
             o.backward_passes_per_step = backward_passes_per_step;
             if (hierarchical) o.hierarchical = *hierarchical;
             o.hierarchical_node_size = hierarchical_node_size;
             // None: TUTTI_COMPRESSION (from_env); a name: a new compressor
             // ("none": no compressor); or a Compressor object.
             if (pyb::isinstance<pyb::str>(compressor)) {
               const std::string n = compressor.cast<std::string>();
               o.compressor = n == "none" ? nullptr : make_compressor(n);
             } else if (!compressor.is_none()) {
               o.compressor = compressor.cast<std::shared_ptr<Compressor>>();
             }
             o.op = parse_grad_op(op);
             o.name = std::move(name);
             if (learn_bucket_order) o.learn_bucket_order = *learn_bucket_order;
             o.find_unused_parameters = find_unused_parameters;
             o.static_graph = static_graph;
             o.gradient_as_bucket_view = gradient_as_bucket_view;
             o.gradient_predivide_factor = gradient_predivide_factor;
             if (check_parameters) o.check_parameters = *check_parameters;
             return std::make_shared<Reducer>(std::move(group), o);
           }),
           pyb::arg("group"), pyb::kw_only(), pyb::arg("bucket_cap_mb") = pyb::none(),
           pyb::arg("first_bucket_cap_mb") = pyb::none(),
           pyb::arg("backward_passes_per_step") = 1,
           pyb::arg("hierarchical") = pyb::none(), pyb::arg("hierarchical_node_size") = 0,
           pyb::arg("compressor") = pyb::none(), pyb::arg("op") = "avg",
           pyb::arg("name") = "dp", pyb::arg("learn_bucket_order") = pyb::none(),
           pyb::arg("find_unused_parameters") = false, pyb::arg("static_graph") = false,
           pyb::arg("gradient_as_bucket_view") = false,
           pyb::arg("gradient_predivide_factor") = 1.0,
           pyb::arg("check_parameters") = pyb::none(),
           "Options left None take their TUTTI_* setting (TUTTI_BUCKET_MB, "
           "TUTTI_FIRST_BUCKET_MB, TUTTI_HIERARCHICAL, TUTTI_COMPRESSION, "
           "TUTTI_LEARN_BUCKET_ORDER, TUTTI_CHECK_PARAMETERS: the first "
           "reducing synchronize() checks that every rank holds the same "
           "parameter bytes).  gradient_as_bucket_view: gradients "
           "live in the buckets (gradient(i)); find_unused_parameters: "
           "mark_unused() fills a slot early; static_graph: the parameters "
           "unused in the first step are filled early in every later one.  "
           "compressor: a tutti.Compressor, a name ('powersgd'; 'none' for "
           "none), or None for the setting.  op: 'avg' or 'sum'.  "
           "gradient_predivide_factor f (Horovod's): divide by f before the "
           "sum and by W / f after it (avg only; with a compressor only none, "
           "fp16 and bf16, which divide by f before the cast and by W / f after "
           "it).")
      .def("add_parameter",
           [](pyb::object self, const std::string& name, pyb::handle param, pyb::handle grad) {
             const std::string pn = "parameter '" + name + "'";
             const std::string gn = "gradient of '" + name + "'";
             PyTensor p = import_tensor(param, pn.c_str());
             // None: no gradient tensor (gradient_as_bucket_view only).
             PyTensor g;
             if (!grad.is_none()) g = import_tensor(grad, gn.c_str());
             const int index = self.cast<Reducer&>().add_parameter(name, p.tensor, g.tensor);
             if (!pyb::hasattr(self, "_tensors")) self.attr("_tensors") = pyb::list();
             pyb::list keep = self.attr("_tensors");
             for (const PyTensor* t : {&p, &g}) {
               if (!t->capsule) continue;
               keep.append(t->capsule);
               keep.append(t->owner);
             }
             return index;
           },
           pyb::arg("name"), pyb::arg("param"), pyb::arg("grad"),
           "Registers a parameter and the tensor its gradient accumulates in "
           "(both stay referenced while the reducer lives; grad may be None "
           "with gradient_as_bucket_view).  Returns the index grad_ready() "
           "takes.")
      .def("mark_unused", [](Reducer& r, int index, int64_t stream) {
        pyb::gil_scoped_release nogil;
        r.mark_unused(index, as_stream(stream));
      }, pyb::arg("index"), pyb::arg("stream") = 0,
         "Gradient `index` will not be produced in this pass "
         "(find_unused_parameters): its slot is filled now, so its bucket "
         "can launch during backward.")
      .def("gradient", [](std::shared_ptr<Reducer> r, int index) {
        const Tensor t = r->gradient(index);
        std::shared_ptr<const void> owner = r->gradient_storage(index);
        if (!owner) owner = r;
        return export_tensor(t, std::move(owner));
      }, pyb::arg("index"),
         "DLPack capsule of the gradient the reducer reduces for parameter "
         "`index`: with gradient_as_bucket_view its slice of the bucket "
         "(torch.from_dlpack(...) aliases it; the memory lives as long as the "
         "view).")
      .def("build", [](Reducer& r) {
        pyb::gil_scoped_release nogil;
        r.build();
      }, "Collective: plans buckets and checks that every rank registered the "
         "same parameters (MismatchError naming the first difference).")
      .def("grad_ready", [](Reducer& r, int index, int64_t stream) {
        pyb::gil_scoped_release nogil;
        r.grad_ready(index, as_stream(stream));
      }, pyb::arg("index"), pyb::arg("stream") = 0,
         "Gradient `index` is final for this pass; a complete bucket starts "
         "its all-reduce.  Never waits for communication.")
      .def("synchronize", [](Reducer& r, int64_t stream) {
        pyb::gil_scoped_release nogil;
        return r.synchronize(as_stream(stream));
      }, pyb::arg("stream") = 0,
         "Ends a backward pass.  True when it reduced (every gradient holds the "
         "average/sum, bit-identical on every rank); False for an "
         "accumulation pass.")
      .def("set_gradient_scale", &Reducer::set_gradient_scale, pyb::arg("scale"),
           "The factor the following passes' gradients carry (the AMP loss "
           "scale): error-feedback compressors keep residuals in these units.  "
           "Call between passes.")
      .def("no_sync", [](std::shared_ptr<Reducer> r) { return PyNoSync{r, nullptr}; },
           "with reducer.no_sync(): ... accumulate without communicating.")
      .def("broadcast_parameters", [](Reducer& r, int root, int64_t stream) {
        pyb::gil_scoped_release nogil;
        r.broadcast_parameters(root, as_stream(stream));
      }, pyb::arg("root") = 0, pyb::arg("stream") = 0,
         "Collective: copies every registered parameter from `root`.")
      .def("broadcast_state",
           [](Reducer& r, pyb::handle state, int root, int64_t stream) {
             if (pyb::isinstance<Stateful>(state)) {
               auto s = state.cast<std::shared_ptr<Stateful>>();
               pyb::gil_scoped_release nogil;
               r.broadcast_state(*s, root, as_stream(stream));
               return;
             }
             std::vector<PyTensor> keep;
             StateDict sd = state_from_mapping(state, &keep, "broadcast_state");
             pyb::gil_scoped_release nogil;
             r.broadcast_state(sd, root, as_stream(stream));
           },
           pyb::arg("state"), pyb::arg("root") = 0, pyb::arg("stream") = 0,
           "Collective: copies a dict name -> tensor (in place) or a tutti "
           "Stateful object's state from `root`.  Lists must agree across ranks.")
      .def_property_readonly("buckets", [](Reducer& r) {
        pyb::list out;
        for (const auto& b : r.buckets()) out.append(bucket_to_dict(b));
        return out;
      }, "The bucket plan after build(): [{id, dtype, device, numel, slots}].")
      .def_property_readonly("num_parameters", [](Reducer& r) {
        return r.num_parameters();
      })
      .def_property_readonly("next_pass_reduces", [](Reducer& r) {
        return r.next_pass_reduces();
      }, "True when the current/next synchronize() will communicate.")
      .def_property_readonly("group", [](Reducer& r) { return r.group(); })
      .def_property_readonly("options", [](Reducer& r) {
        const ReducerOptions& o = r.options();
        pyb::dict d;
        d["bucket_cap_mb"] = o.bucket_cap_mb;
        d["gradient_predivide_factor"] = o.gradient_predivide_factor;
        d["first_bucket_cap_mb"] = o.first_bucket_cap_mb;
        d["backward_passes_per_step"] = o.backward_passes_per_step;
        d["hierarchical"] = o.hierarchical;
        d["hierarchical_node_size"] = o.hierarchical_node_size;
        d["compressor"] = o.compressor ? pyb::cast(o.compressor) : pyb::none();
        d["op"] = std::string(reduce_op_name(o.op));
        d["name"] = o.name;
        d["learn_bucket_order"] = o.learn_bucket_order;
        d["find_unused_parameters"] = o.find_unused_parameters;
        d["static_graph"] = o.static_graph;
        d["gradient_as_bucket_view"] = o.gradient_as_bucket_view;
        d["check_parameters"] = o.check_parameters;
        return d;
      })
      .def("stats", [](Reducer& r) { return stats_dict(r.stats()); },
           "Counters: steps, accumulation_passes, buckets_reduced, "
           "buckets_launched_early, bytes_reduced, unready_gradients, "
           "wait_seconds, writeback_seconds, buffer_allocations, "
           "bucket_rebuilds, bytes_copied_in, bytes_copied_out, marked_unused, "
           "bucket_bytes, pool_waits, pool_growths.")
      .def("__repr__", [](Reducer& r) {
        return "<tutti.Reducer '" + r.options().name + "' " +
               std::to_string(r.num_parameters()) + " parameters>";
      });
}

}  // namespace py
}  // namespace tutti
