// Tensor parallel: ProcessMesh, region operators and the parallel layers.
//
// Layers own their parameter shards; weight()/weight_grad() are TensorViews
// over that memory (zero-copy through DLPack) that keep the layer alive.
// Forward/backward issue TP-group collectives: the GIL is released.
#include <pybind11/stl.h>

#include <memory>

#include "bindings.h"
#include "convert.h"
#include "core/check.h"
#include "tutti/tensor_parallel.h"

namespace tutti {
namespace py {
namespace {

using RegionFn = void (*)(const ProcessMesh&, const Tensor&, const Tensor&,
                          const RegionOptions&);

struct Region {
  const char* name;
  RegionFn forward;
  RegionFn backward;
  const char* doc;
};

const Region kRegions[] = {
    {"copy_to_tp", copy_to_tp_forward, copy_to_tp_backward,
     "forward identity, backward all-reduce (sum)"},
    {"reduce_from_tp", reduce_from_tp_forward, reduce_from_tp_backward,
     "forward all-reduce (sum), backward identity"},
    {"gather_from_tp", gather_from_tp_forward, gather_from_tp_backward,
     "forward all-gather on the last dimension, backward keeps this rank's slice"},
    {"scatter_to_tp", scatter_to_tp_forward, scatter_to_tp_backward,
     "forward keeps this rank's slice of the last dimension, backward all-gathers"},
    {"gather_from_sequence_parallel", gather_from_sequence_parallel_forward,
     gather_from_sequence_parallel_backward,
     "forward all-gather on the first dimension, backward reduce-scatter (sum)"},
    {"reduce_scatter_to_sequence_parallel",
     reduce_scatter_to_sequence_parallel_forward,
     reduce_scatter_to_sequence_parallel_backward,
     "forward reduce-scatter (sum) on the first dimension, backward all-gather"},
    {"scatter_to_sequence_parallel", scatter_to_sequence_parallel_forward,
     scatter_to_sequence_parallel_backward,
     "forward keeps this rank's slice of the first dimension, backward all-gathers"},
};

void def_region(pyb::module_& m, const std::string& name, RegionFn fn,
                const std::string& doc) {
  m.def(name.c_str(),
        [fn, name](std::shared_ptr<ProcessMesh> mesh, pyb::handle input,
                   pyb::handle output, const std::string& tensor_name, int64_t stream) {
          TUTTI_ARG_CHECK(mesh != nullptr, name, ": mesh is None");
          PyTensor in = import_tensor(input, "input", stream);
          PyTensor out = import_tensor(output, "output", stream);
          RegionOptions o;
          o.name = tensor_name;
          o.stream = as_stream(stream);
          pyb::gil_scoped_release nogil;
          fn(*mesh, in.tensor, out.tensor, o);
        },
        pyb::arg("mesh"), pyb::arg("input"), pyb::arg("output"), pyb::kw_only(),
        pyb::arg("name") = "", pyb::arg("stream") = 0, doc.c_str());
}

pyb::object param_to_py(const TPParameter& p, std::shared_ptr<const void> owner) {
  pyb::dict d;
  d["name"] = p.name;
  d["value"] = pyb::cast(TensorView{p.value, owner});
  d["grad"] = pyb::cast(TensorView{p.grad, owner});
  d["shard"] = shard_to_dict(p.shard);
  d["tp_replicated"] = p.tp_replicated();
  return std::move(d);
}

pyb::list params_to_py(const std::vector<TPParameter>& ps,
                       std::shared_ptr<const void> owner) {
  pyb::list out;
  for (const auto& p : ps) out.append(param_to_py(p, owner));
  return out;
}

// ColumnParallelLinear and RowParallelLinear differ in one layout flag
// (gather_output / input_is_parallel) and share the rest of the API.
template <typename Layer, typename Options>
pyb::class_<Layer, TensorParallelLinear, std::shared_ptr<Layer>> def_linear_class(
    pyb::module_& m, const char* cls_name, const char* doc, const char* default_name,
    const char* flag_name, bool Options::*flag, bool flag_default) {
  pyb::class_<Layer, TensorParallelLinear, std::shared_ptr<Layer>> cls(m, cls_name, doc);
  cls.def(pyb::init([flag](std::shared_ptr<ProcessMesh> mesh, int64_t in, int64_t out,
                           std::string name, bool bias, bool flag_value,
                           bool sequence_parallel, pyb::handle dtype, pyb::handle device,
                           int64_t stream) {
            Options o;
            o.name = std::move(name);
            o.bias = bias;
            o.*flag = flag_value;
            o.sequence_parallel = sequence_parallel;
            o.dtype = parse_dtype(dtype);
            o.device = parse_device(device);
            o.stream = as_stream(stream);
            return std::make_shared<Layer>(std::move(mesh), in, out, o);
          }),
          pyb::arg("mesh"), pyb::arg("in_features"), pyb::arg("out_features"),
          pyb::kw_only(), pyb::arg("name") = default_name, pyb::arg("bias") = true,
          pyb::arg(flag_name) = flag_default, pyb::arg("sequence_parallel") = false,
          pyb::arg("dtype") = "float32", pyb::arg("device") = "cpu",
          pyb::arg("stream") = 0)
      .def_property_readonly(flag_name, [flag](const Layer& l) { return l.options().*flag; })
      .def_property_readonly("sequence_parallel",
                             [](const Layer& l) { return l.options().sequence_parallel; })
      .def("forward",
           [](Layer& l, pyb::handle input, pyb::handle output) {
             PyTensor in = import_tensor(input, "input");
             PyTensor out = import_tensor(output, "output");
             pyb::gil_scoped_release nogil;
             l.forward(in.tensor, out.tensor);
           },
           pyb::arg("input"), pyb::arg("output"), "Y = X W^T + b into `output`.")
      .def("backward",
           [](Layer& l, pyb::handle input, pyb::handle grad_output, pyb::handle grad_input) {
             PyTensor in = import_tensor(input, "input");
             PyTensor go = import_tensor(grad_output, "grad_output");
             PyTensor gi;
             if (!grad_input.is_none()) gi = import_tensor(grad_input, "grad_input");
             pyb::gil_scoped_release nogil;
             l.backward(in.tensor, go.tensor, gi.tensor);
           },
           pyb::arg("input"), pyb::arg("grad_output"), pyb::arg("grad_input") = pyb::none(),
           "Accumulates weight_grad/bias_grad and writes grad_input (None: skip).");
  return cls;
}

// Parameters, gradients and initialisation, for every layer type.
template <typename Cls, typename Layer>
void def_params(Cls& cls) {
  cls.def_property_readonly("weight", [](std::shared_ptr<Layer> l) {
       return TensorView{l->weight(), l};
     }, "This rank's weight shard (zero-copy view).")
      .def_property_readonly("weight_grad", [](std::shared_ptr<Layer> l) {
        return TensorView{l->weight_grad(), l};
      })
      .def("zero_grad", [](Layer& l) {
        pyb::gil_scoped_release nogil;
        l.zero_grad();
      })
      .def("init_from_seed", [](Layer& l, uint64_t seed) {
        pyb::gil_scoped_release nogil;
        l.init_from_seed(seed);
      }, pyb::arg("seed"),
         "Every element a function of (seed, global index): the same global "
         "tensor at any tp_size.")
      .def("parameters", [](std::shared_ptr<Layer> l) {
        return params_to_py(l->parameters(), l);
      }, "[{name, value, grad, shard, tp_replicated}] with zero-copy views.");
}

}  // namespace

void bind_tp(pyb::module_& m) {
  pyb::class_<ProcessMesh, std::shared_ptr<ProcessMesh>>(
      m, "ProcessMesh",
      "Tensor parallel x data parallel mesh; TP groups are consecutive ranks.")
      .def(pyb::init([](std::shared_ptr<ProcessGroup> world, int tp_size) {
             pyb::gil_scoped_release nogil;
             return std::make_shared<ProcessMesh>(std::move(world), tp_size);
           }),
           pyb::arg("world"), pyb::arg("tp_size"),
           "Collective over `world`; tp_size must divide its size.")
      .def_property_readonly("tp_size", &ProcessMesh::tp_size)
      .def_property_readonly("dp_size", &ProcessMesh::dp_size)
      .def_property_readonly("tp_rank", &ProcessMesh::tp_rank)
      .def_property_readonly("dp_rank", &ProcessMesh::dp_rank)
      .def_property_readonly("world", &ProcessMesh::world)
      .def_property_readonly("tp_group", &ProcessMesh::tp_group)
      .def_property_readonly("dp_group", &ProcessMesh::dp_group)
      .def("rank_of", &ProcessMesh::rank_of, pyb::arg("dp_rank"), pyb::arg("tp_rank"))
      .def_property_readonly("tp_within_node", &ProcessMesh::tp_within_node)
      .def("comm_stats", [](const ProcessMesh& mesh) {
        const CommStats s = mesh.comm_stats();
        pyb::dict d;
        d["allreduce_calls"] = s.allreduce_calls;
        d["allreduce_bytes"] = s.allreduce_bytes;
        d["allgather_calls"] = s.allgather_calls;
        d["allgather_bytes"] = s.allgather_bytes;
        d["reduce_scatter_calls"] = s.reduce_scatter_calls;
        d["reduce_scatter_bytes"] = s.reduce_scatter_bytes;
        d["calls"] = s.calls();
        d["bytes"] = s.bytes();
        return d;
      }, "Traffic of TP collectives issued through this mesh (full buffer sizes).")
      .def("reset_comm_stats", &ProcessMesh::reset_comm_stats)
      .def("__repr__", [](const ProcessMesh& mesh) {
        return "<tutti.ProcessMesh " + mesh.str() + ">";
      });

  pyb::module_ tp = m.def_submodule(
      "tensor_parallel", "Megatron-style region operators and parallel layers.");
  for (const Region& r : kRegions) {
    def_region(tp, std::string(r.name) + "_forward", r.forward,
               std::string(r.name) + " forward: " + r.doc + ".");
    def_region(tp, std::string(r.name) + "_backward", r.backward,
               std::string(r.name) + " backward (the conjugate of its forward).");
  }
  tp.def("grad_norm_squared",
         [](std::shared_ptr<ProcessMesh> mesh, pyb::handle layers, int64_t stream) {
           // Layers (or their parameters() lists) -> the C++ parameters.
           std::vector<TPParameter> params;
           for (const auto& item : pyb::reinterpret_borrow<pyb::sequence>(layers)) {
             if (pyb::isinstance<TensorParallelLinear>(item)) {
               for (auto& p : item.cast<TensorParallelLinear&>().parameters())
                 params.push_back(p);
             } else if (pyb::isinstance<VocabParallelEmbedding>(item)) {
               for (auto& p : item.cast<VocabParallelEmbedding&>().parameters())
                 params.push_back(p);
             } else {
               TUTTI_THROW(kInvalidArgument,
                           "grad_norm_squared takes tensor-parallel layers");
             }
           }
           pyb::gil_scoped_release nogil;
           return tp_grad_norm_squared(*mesh, params, as_stream(stream));
         },
         pyb::arg("mesh"), pyb::arg("layers"), pyb::arg("stream") = 0,
         "Squared L2 norm of the layers' gradients over the TP group "
         "(replicated ones counted once): the dense model's value.  Collective.");

  tp.def("allreduce_sequence_parallel_grads",
         [](std::shared_ptr<ProcessMesh> mesh, pyb::handle grads, int64_t stream) {
           TUTTI_ARG_CHECK(mesh != nullptr, "allreduce_sequence_parallel_grads: mesh is None");
           auto g = import_tensors(grads, "grads", stream);
           pyb::gil_scoped_release nogil;
           allreduce_sequence_parallel_grads(*mesh, views(g), as_stream(stream));
         },
         pyb::arg("mesh"), pyb::arg("grads"), pyb::arg("stream") = 0,
         "Sum each gradient in place over the TP group: the gradients of "
         "parameters in the sequence-parallel region that are not TP-sharded "
         "(LayerNorm weight/bias), partial per rank until then.  Collective.");

  pyb::class_<TensorParallelLinear, Stateful, std::shared_ptr<TensorParallelLinear>> base(
      tp, "TensorParallelLinear", "Y = X W^T + b with W [out, in] split over TP.");
  def_params<decltype(base), TensorParallelLinear>(base);
  base.def_property_readonly("bias", [](std::shared_ptr<TensorParallelLinear> l) {
        return l->bias().numel() == 0 && l->bias().data() == nullptr
                   ? pyb::none()
                   : pyb::cast(TensorView{l->bias(), l});
      }, "This rank's bias (None without bias).")
      .def_property_readonly("bias_grad", [](std::shared_ptr<TensorParallelLinear> l) {
        return l->bias_grad().numel() == 0 && l->bias_grad().data() == nullptr
                   ? pyb::none()
                   : pyb::cast(TensorView{l->bias_grad(), l});
      })
      .def("load_from_full",
           [](TensorParallelLinear& l, pyb::handle w, pyb::handle b) {
             PyTensor pw = import_array_like(w, "full_weight");
             PyTensor pb;
             if (!b.is_none()) pb = import_array_like(b, "full_bias");
             pyb::gil_scoped_release nogil;
             l.load_from_full(pw.tensor, pb.tensor);
           },
           pyb::arg("full_weight"), pyb::arg("full_bias") = pyb::none(),
           "Copies this rank's slices of the global host weight [out, in] and bias [out].")
      .def_property_readonly("in_features", &TensorParallelLinear::in_features)
      .def_property_readonly("out_features", &TensorParallelLinear::out_features);

  def_linear_class<ColumnParallelLinear, ColumnParallelLinearOptions>(
      tp, "ColumnParallelLinear",
      "W split by output features; output gathered (gather_output) or this "
      "rank's [..., out/p] slice.",
      "column_parallel_linear", "gather_output",
      &ColumnParallelLinearOptions::gather_output, true)
      .def_property_readonly("out_features_per_rank",
                             &ColumnParallelLinear::out_features_per_rank);
  def_linear_class<RowParallelLinear, RowParallelLinearOptions>(
      tp, "RowParallelLinear",
      "W split by input features; partial products summed over TP, bias added once.",
      "row_parallel_linear", "input_is_parallel",
      &RowParallelLinearOptions::input_is_parallel, false)
      .def_property_readonly("in_features_per_rank", &RowParallelLinear::in_features_per_rank);

  pyb::class_<VocabParallelEmbedding, Stateful, std::shared_ptr<VocabParallelEmbedding>>
      emb(tp, "VocabParallelEmbedding",
          "Embedding table split by vocabulary rows; lookups all-reduced over TP.");
  emb.def(pyb::init([](std::shared_ptr<ProcessMesh> mesh, int64_t vocab, int64_t dim,
                       std::string name, bool sequence_parallel, pyb::handle dtype,
                       pyb::handle device, int64_t stream) {
            VocabParallelEmbeddingOptions o;
            o.name = std::move(name);
            o.sequence_parallel = sequence_parallel;
            o.dtype = parse_dtype(dtype);
            o.device = parse_device(device);
            o.stream = as_stream(stream);
            return std::make_shared<VocabParallelEmbedding>(std::move(mesh), vocab, dim, o);
          }),
          pyb::arg("mesh"), pyb::arg("vocab_size"), pyb::arg("embedding_dim"),
          pyb::kw_only(), pyb::arg("name") = "vocab_parallel_embedding",
          pyb::arg("sequence_parallel") = false, pyb::arg("dtype") = "float32",
          pyb::arg("device") = "cpu", pyb::arg("stream") = 0)
      .def("forward",
           [](VocabParallelEmbedding& e, pyb::handle ids, pyb::handle output) {
             PyTensor i = import_tensor(ids, "ids");
             PyTensor o = import_tensor(output, "output");
             pyb::gil_scoped_release nogil;
             e.forward(i.tensor, o.tensor);
           },
           pyb::arg("ids"), pyb::arg("output"))
      .def("backward",
           [](VocabParallelEmbedding& e, pyb::handle ids, pyb::handle grad_output) {
             PyTensor i = import_tensor(ids, "ids");
             PyTensor g = import_tensor(grad_output, "grad_output");
             pyb::gil_scoped_release nogil;
             e.backward(i.tensor, g.tensor);
           },
           pyb::arg("ids"), pyb::arg("grad_output"), "Accumulates weight_grad.")
      .def("load_from_full",
           [](VocabParallelEmbedding& e, pyb::handle w) {
             PyTensor pw = import_array_like(w, "full_weight");
             pyb::gil_scoped_release nogil;
             e.load_from_full(pw.tensor);
           },
           pyb::arg("full_weight"))
      .def_property_readonly("vocab_size", &VocabParallelEmbedding::vocab_size)
      .def_property_readonly("vocab_start", &VocabParallelEmbedding::vocab_start)
      .def_property_readonly("vocab_per_rank", &VocabParallelEmbedding::vocab_per_rank);
  def_params<decltype(emb), VocabParallelEmbedding>(emb);

  pyb::class_<VocabParallelCrossEntropy, std::shared_ptr<VocabParallelCrossEntropy>>(
      tp, "VocabParallelCrossEntropy",
      "Softmax cross-entropy over logits split by vocabulary across TP; no "
      "rank holds the full logits.")
      .def(pyb::init([](std::shared_ptr<ProcessMesh> mesh, int64_t vocab,
                        std::string name, int64_t ignore_index, int64_t stream) {
             VocabParallelCrossEntropyOptions o;
             o.name = std::move(name);
             o.ignore_index = ignore_index;
             o.stream = as_stream(stream);
             return std::make_shared<VocabParallelCrossEntropy>(std::move(mesh), vocab, o);
           }),
           pyb::arg("mesh"), pyb::arg("vocab_size"), pyb::kw_only(),
           pyb::arg("name") = "vocab_parallel_cross_entropy",
           pyb::arg("ignore_index") = -100, pyb::arg("stream") = 0)
      .def("forward",
           [](VocabParallelCrossEntropy& c, pyb::handle logits, pyb::handle targets,
              pyb::handle losses, pyb::handle mean_loss) {
             PyTensor l = import_tensor(logits, "logits");
             PyTensor t = import_tensor(targets, "targets");
             PyTensor ls;
             if (!losses.is_none()) ls = import_tensor(losses, "losses");
             PyTensor ml = import_tensor(mean_loss, "mean_loss");
             pyb::gil_scoped_release nogil;
             c.forward(l.tensor, t.tensor, ls.tensor, ml.tensor);
           },
           pyb::arg("logits"), pyb::arg("targets"), pyb::arg("losses"),
           pyb::arg("mean_loss"),
           "Writes per-token losses (float32, or None to skip) and the mean "
           "over non-ignored tokens (float32 [1]).  Collective.")
      .def("backward",
           [](VocabParallelCrossEntropy& c, pyb::handle logits, pyb::handle targets,
              pyb::handle grad_logits, float grad_scale) {
             PyTensor l = import_tensor(logits, "logits");
             PyTensor t = import_tensor(targets, "targets");
             PyTensor g = import_tensor(grad_logits, "grad_logits");
             pyb::gil_scoped_release nogil;
             c.backward(l.tensor, t.tensor, g.tensor, grad_scale);
           },
           pyb::arg("logits"), pyb::arg("targets"), pyb::arg("grad_logits"),
           pyb::arg("grad_scale") = 1.0f,
           "d(grad_scale * mean_loss)/d(logits) into grad_logits; no communication.")
      .def_property_readonly("vocab_size", &VocabParallelCrossEntropy::vocab_size)
      .def_property_readonly("vocab_start", &VocabParallelCrossEntropy::vocab_start)
      .def_property_readonly("vocab_per_rank", &VocabParallelCrossEntropy::vocab_per_rank);
}

}  // namespace py
}  // namespace tutti
