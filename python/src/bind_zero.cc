// tutti.ShardedOptimizer: ZeRO-1/2 (include/tutti/zero.h) over a
// tutti.Reducer, for Python training loops that drive the reducer
// themselves (grad_ready() from hooks, synchronize(), then step()).  The
// PyTorch optimizer-wrapper route is tutti.torch.ZeroRedundancyOptimizer
// (stage 1, torch's interface); this one is the C++ optimizer: float32
// master weights and state for this rank's shards only, stage 2's
// reduce-scatter, the bucketed all-gather.  Collectives run without the GIL.
#include <pybind11/stl.h>

#include <memory>
#include <optional>
#include <string>

#include "bindings.h"
#include "convert.h"
#include "core/check.h"
#include "tutti/zero.h"

namespace tutti {
namespace py {
namespace {

pyb::dict hyper_to_dict(const optim::Hyper& h) {
  pyb::dict d;
  d["kind"] = optim::kind_name(h.kind);
  d["lr"] = h.lr;
  d["momentum"] = h.momentum;
  d["dampening"] = h.dampening;
  d["nesterov"] = h.nesterov;
  d["beta1"] = h.beta1;
  d["beta2"] = h.beta2;
  d["eps"] = h.eps;
  d["weight_decay"] = h.weight_decay;
  d["maximize"] = h.maximize;
  return d;
}

}  // namespace

void bind_zero(pyb::module_& m) {
  pyb::class_<ShardedOptimizer, Stateful, std::shared_ptr<ShardedOptimizer>>(
      m, "ShardedOptimizer",
      "ZeRO-1/2 over a built tutti.Reducer: this rank keeps float32 master "
      "weights and optimizer state for its shard of every bucket; stage 2 "
      "reduce-scatters the gradients instead of all-reducing them.  step() "
      "after a reducing synchronize() updates the shards and all-gathers the "
      "parameters (docs/zero.md).")
      .def(pyb::init([](std::shared_ptr<Reducer> reducer, const std::string& kind, float lr,
                        float momentum, float dampening, bool nesterov, float beta1,
                        float beta2, float eps, float weight_decay, bool maximize, int stage,
                        pyb::object reduce_dtype, bool overlap_all_gather,
                        int bucket_buffers, int gather_buffers, std::string name) {
             TUTTI_ARG_CHECK(reducer != nullptr,
                             "ShardedOptimizer: reducer is None, expected a tutti.Reducer");
             const optim::Hyper h = make_hyper(kind, lr, momentum, dampening, nesterov,
                                               beta1, beta2, eps, weight_decay, maximize);
             ShardedOptimizerOptions o;
             o.stage = stage;
             if (!reduce_dtype.is_none()) o.reduce_dtype = parse_dtype(reduce_dtype);
             o.overlap_all_gather = overlap_all_gather;
             o.bucket_buffers = bucket_buffers;
             o.gather_buffers = gather_buffers;
             o.name = std::move(name);
             pyb::gil_scoped_release nogil;  // collective: agrees the options
             return std::make_shared<ShardedOptimizer>(*reducer, h, o);
           }),
           pyb::arg("reducer"), pyb::kw_only(), pyb::arg("kind") = "adam",
           pyb::arg("lr") = 1e-3f, pyb::arg("momentum") = 0.f, pyb::arg("dampening") = 0.f,
           pyb::arg("nesterov") = false, pyb::arg("beta1") = 0.9f,
           pyb::arg("beta2") = 0.999f, pyb::arg("eps") = 1e-8f,
           pyb::arg("weight_decay") = 0.f, pyb::arg("maximize") = false,
           pyb::arg("stage") = 2, pyb::arg("reduce_dtype") = pyb::none(),
           pyb::arg("overlap_all_gather") = false, pyb::arg("bucket_buffers") = 2,
           pyb::arg("gather_buffers") = 2, pyb::arg("name") = "zero",
           // The reducer must outlive the optimizer (it holds a reference).
           pyb::keep_alive<1, 2>(),
           "Collective: every rank passes the same stage and hyper-parameters "
           "(MismatchError naming the first difference).  Construct after "
           "reducer.build() and reducer.broadcast_parameters().  kind: 'sgd', "
           "'adam' or 'adamw' (torch.optim semantics); reduce_dtype: None, "
           "'float16' or 'bfloat16' (stage 2: the dtype gradients travel in); "
           "bucket_buffers / gather_buffers: pool sizes (0: one per bucket).")
      .def("step",
           [](ShardedOptimizer& o, float grad_scale, int64_t stream) {
             pyb::gil_scoped_release nogil;
             o.step(grad_scale, as_stream(stream));
           },
           pyb::arg("grad_scale") = 1.f, pyb::arg("stream") = 0,
           "Collective, once after each reducing synchronize(): updates this "
           "rank's shards from the averaged gradients times grad_scale (e.g. "
           "a loss scaler's inv_scale) and all-gathers the parameters.")
      .def("wait_parameter",
           [](ShardedOptimizer& o, int index) {
             pyb::gil_scoped_release nogil;
             o.wait_parameter(index);
           },
           pyb::arg("index"),
           "overlap_all_gather: writes reducer parameter `index` (and the "
           "buckets all-gathered before it); e.g. from a forward pre-hook.")
      .def("wait_parameters",
           [](ShardedOptimizer& o) {
             pyb::gil_scoped_release nogil;
             o.wait_parameters();
           },
           "overlap_all_gather: writes every parameter.")
      .def("gradient_shards",
           [](std::shared_ptr<ShardedOptimizer> o) {
             pyb::list out;
             for (const Tensor& t : o->gradient_shards()) out.append(TensorView{t, o});
             return out;
           },
           "The averaged gradient elements this rank owns, one TensorView per "
           "bucket (zero-copy; valid until the next step()): a norm or "
           "non-finite check over them, combined over the group, counts each "
           "element once.")
      .def("consolidate",
           [](ShardedOptimizer& o) {
             StateDict s;
             {
               pyb::gil_scoped_release nogil;
               s = o.consolidate();
             }
             return state_to_numpy(s);
           },
           "Collective: the unsharded float32 master weights and optimizer "
           "state per parameter, as {name: numpy array} copies on every rank.")
      .def_property(
          "lr", [](const ShardedOptimizer& o) { return o.hyper().lr; },
          [](ShardedOptimizer& o, float lr) { o.hyper().lr = lr; },
          "Learning rate of the following steps (the same on every rank).")
      .def_property(
          "weight_decay", [](const ShardedOptimizer& o) { return o.hyper().weight_decay; },
          [](ShardedOptimizer& o, float wd) { o.hyper().weight_decay = wd; },
          "Weight decay of the following steps (the same on every rank).")
      .def_property_readonly("hyper", [](const ShardedOptimizer& o) {
        return hyper_to_dict(o.hyper());
      }, "The hyper-parameters, as a dict (a copy).")
      .def_property_readonly("steps", &ShardedOptimizer::steps, "Completed step() calls.")
      .def_property_readonly("stage", [](const ShardedOptimizer& o) {
        return o.options().stage;
      })
      .def_property_readonly("shards", [](const ShardedOptimizer& o) {
        pyb::list out;
        for (const ZeroShard& s : o.shards()) {
          pyb::dict d;
          d["bucket"] = s.bucket;
          d["bucket_numel"] = s.bucket_numel;
          d["shard_numel"] = s.shard_numel;
          d["begin"] = s.begin;
          d["end"] = s.end;
          out.append(d);
        }
        return out;
      }, "This rank's range [begin, end) of every bucket.")
      .def_property_readonly("state_bytes", &ShardedOptimizer::state_bytes,
                             "Bytes of master weights + optimizer state on this rank.")
      .def_property_readonly("unsharded_state_bytes", &ShardedOptimizer::unsharded_state_bytes,
                             "The same for an unsharded optimizer.")
      .def_property_readonly("gradient_bytes", &ShardedOptimizer::gradient_bytes,
                             "Bytes of gradient storage the reducer and optimizer hold here.")
      .def_property_readonly("gather_bytes", &ShardedOptimizer::gather_bytes,
                             "Bytes of the all-gather buffers on this rank.")
      .def("__repr__", [](const ShardedOptimizer& o) {
        return "<tutti.ShardedOptimizer stage " + std::to_string(o.options().stage) +
               ", " + std::to_string(o.shards().size()) + " buckets, step " +
               std::to_string(o.steps()) + ">";
      });
}

}  // namespace py
}  // namespace tutti
