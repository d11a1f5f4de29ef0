// VocabParallelEmbedding: the table [V, H] split by vocabulary rows.
//
//   forward   Y = sum over TP of lookup_r(ids)   (rows of ids held elsewhere
//             are zero here; all-reduce, or SP reduce-scatter)
//   backward  dE_r[id - start] += dY[i] for the ids this rank holds, summed
//             in float32 (a float32 scratch table for float16/bfloat16)
#include "core/check.h"
#include "tensor_parallel/layer_util.h"
#include "tensor_parallel/mesh_impl.h"
#include "tensor_parallel/ops.h"
#include "tensor_parallel/parameter.h"
#include "tensor_parallel/tp_comm.h"
#include "tutti/tensor_parallel.h"

namespace tutti {
namespace {

enum Slot { kFullOutput, kGatheredGrad, kGradAccumulator };

const ProcessMeshPtr& checked(const ProcessMeshPtr& mesh,
                              const std::string& label, int64_t vocab,
                              int64_t dim, DType dtype) {
  TUTTI_ARG_CHECK(mesh != nullptr, label, ": the mesh is null");
  TUTTI_ARG_CHECK(dim > 0, label, ": embedding_dim ", dim, " must be positive");
  TUTTI_ARG_CHECK(dtype == DType::kFloat32 || dtype == DType::kFloat16 ||
                      dtype == DType::kBFloat16,
                  label, ": dtype ", dtype_name(dtype),
                  " is not float32, float16 or bfloat16");
  tp::check_divisible(label, "vocab_size", vocab, mesh->tp_size());
  return mesh;
}

int64_t sequence_length(const Tensor& t) {
  return t.ndim() >= 1 ? t.shape()[0] : 1;
}

}  // namespace

class VocabParallelEmbedding::Impl {
 public:
  Impl(ProcessMeshPtr mesh_in, int64_t vocab_in, int64_t dim_in,
       const VocabParallelEmbeddingOptions& o)
      : label(tp::layer_label("VocabParallelEmbedding", o.name)),
        mesh(checked(mesh_in, label, vocab_in, dim_in, o.dtype)),
        m(*mesh->impl()),
        vocab(vocab_in),
        dim(dim_in),
        local(vocab_in / m.tp_size),
        start(m.tp_rank * local),
        options(o),
        weight(o.name + ".weight", {vocab_in, dim_in}, 0, m.tp_rank, m.tp_size,
               o.dtype, o.device) {}

  // ids must be int32/int64 on the layer's device; host ids are range-checked.
  void check_ids(const Tensor& ids, const std::string& what) const {
    TUTTI_ARG_CHECK(
        ids.dtype() == DType::kInt32 || ids.dtype() == DType::kInt64, what,
        ": ids ", ids.str(), " must be int32 or int64");
    TUTTI_ARG_CHECK(ids.device() == options.device, what, ": ids ", ids.str(),
                    " must be on ", options.device.str());
    if (ids.is_cuda()) return;
    for (int64_t i = 0; i < ids.numel(); ++i) {
      const int64_t id = load_as_double(ids.data(), ids.dtype(), i);
      TUTTI_ARG_CHECK(id >= 0 && id < vocab, what, ": id ", id, " at position ",
                      i, " is outside the vocabulary [0, ", vocab, ")");
    }
  }

  // Rows of the output: all ids, or this rank's slice of the sequence.
  int64_t output_rows(const Tensor& ids, const std::string& what) const {
    if (!sequence_parallel()) return ids.numel();
    tp::check_divisible(what, "sequence length (ids' first dimension)",
                        sequence_length(ids), m.tp_size, /*may_be_zero=*/true);
    return ids.numel() / m.tp_size;
  }

  bool sequence_parallel() const {
    return options.sequence_parallel && m.tp_size > 1;
  }

  std::string label;
  ProcessMeshPtr mesh;
  MeshImpl& m;
  int64_t vocab, dim, local, start;
  VocabParallelEmbeddingOptions options;
  tp::Parameter weight;
  tp::Workspace ws;
};

VocabParallelEmbedding::VocabParallelEmbedding(
    ProcessMeshPtr mesh, int64_t vocab_size, int64_t embedding_dim,
    const VocabParallelEmbeddingOptions& options)
    : impl_(std::make_unique<Impl>(std::move(mesh), vocab_size, embedding_dim,
                                   options)) {}

VocabParallelEmbedding::~VocabParallelEmbedding() = default;

void VocabParallelEmbedding::forward(const Tensor& ids, const Tensor& output) {
  const std::string what = impl_->label + " forward";
  return tp::fail_fast(
      impl_->m, impl_->options.device, what, [&] {
        Impl& e = *impl_;
        e.check_ids(ids, what);
        const int64_t n = ids.numel();
        Tensor y =
            tp::view_2d(output, e.dim, e.output_rows(ids, what),
                        e.options.dtype, e.options.device, what, "output");
        void* stream = e.options.stream;
        if (!e.sequence_parallel()) {
          tp::embedding_lookup(ids, e.weight.value(), e.start, y, stream);
          tp::allreduce(e.m, y, ReduceOp::kSum, what + ": output", stream);
          return;
        }
        Tensor full = e.ws.get(kFullOutput, e.options.dtype, Shape{n, e.dim},
                               e.options.device);
        tp::embedding_lookup(ids, e.weight.value(), e.start, full, stream);
        tp::reduce_scatter_rows(e.m, full, y, what + ": output", stream);
      });
}

void VocabParallelEmbedding::backward(const Tensor& ids,
                                      const Tensor& grad_output) {
  const std::string what = impl_->label + " backward";
  return tp::fail_fast(
      impl_->m, impl_->options.device, what, [&] {
        Impl& e = *impl_;
        e.check_ids(ids, what);
        const int64_t n = ids.numel();
        Tensor dy =
            tp::view_2d(grad_output, e.dim, e.output_rows(ids, what),
                        e.options.dtype, e.options.device, what, "grad_output");
        void* stream = e.options.stream;
        if (e.sequence_parallel()) {
          Tensor full = e.ws.get(kGatheredGrad, e.options.dtype,
                                 Shape{n, e.dim}, e.options.device);
          tp::allgather_rows(e.m, dy, full,
                             what + ": sequence-parallel grad_output", stream);
          dy = full;
        }
        // float16/bfloat16 tables sum their gradient in a float32 copy kept in
        // the layer's workspace (allocated on the first backward, then reused).
        const Tensor acc =
            e.options.dtype == DType::kFloat32
                ? Tensor()
                : e.ws.get(kGradAccumulator, DType::kFloat32,
                           Shape{e.local, e.dim}, e.options.device);
        tp::embedding_grad(ids, dy, e.start, e.weight.grad(), acc, stream);
      });
}

Tensor VocabParallelEmbedding::weight() const { return impl_->weight.value(); }
Tensor VocabParallelEmbedding::weight_grad() const {
  return impl_->weight.grad();
}
void VocabParallelEmbedding::zero_grad() {
  impl_->weight.zero_grad(impl_->options.stream);
}
void VocabParallelEmbedding::init_from_seed(uint64_t seed) {
  impl_->weight.init_uniform(seed, 0,
                             1.7320508075688772);  // sqrt(3): unit variance
}
void VocabParallelEmbedding::load_from_full(const Tensor& full_weight) {
  impl_->weight.load_full(full_weight, impl_->label);
}
std::vector<TPParameter> VocabParallelEmbedding::parameters() const {
  return {impl_->weight.describe()};
}
StateDict VocabParallelEmbedding::state_dict() {
  return {impl_->weight.named()};
}
int64_t VocabParallelEmbedding::vocab_size() const { return impl_->vocab; }
int64_t VocabParallelEmbedding::vocab_start() const { return impl_->start; }
int64_t VocabParallelEmbedding::vocab_per_rank() const { return impl_->local; }

}  // namespace tutti
