// Vocabulary-parallel softmax cross-entropy.
//
// With logits z split over the TP group by vocabulary, for token i:
//   m_i   = max over the whole vocabulary   (all-reduce MAX of local maxima)
//   S_i   = sum_j exp(z_ij - m_i)           (all-reduce SUM of local sums)
//   t_i   = z_i,target - m_i                (all-reduce SUM: only the rank
//                                            holding the target adds it)
//   loss_i = log S_i - t_i
// Subtracting the global maximum keeps every exp() in (0, 1], so large
// logits neither overflow nor lose the target's contribution.  The two SUM
// all-reduces travel as one buffer [S; t].  Backward needs no communication:
// d loss_i / d z_ij = exp(z_ij - m_i) / S_i - [j is the target].
#include "core/check.h"
#include "tensor_parallel/layer_util.h"
#include "tensor_parallel/mesh_impl.h"
#include "tensor_parallel/ops.h"
#include "tensor_parallel/tp_comm.h"
#include "tutti/tensor_parallel.h"

namespace tutti {
namespace {

enum Slot { kMax, kStats, kMeanCount, kLosses };

}  // namespace

class VocabParallelCrossEntropy::Impl {
 public:
  Impl(ProcessMeshPtr mesh_in, int64_t vocab_in,
       const VocabParallelCrossEntropyOptions& o)
      : label(tp::layer_label("VocabParallelCrossEntropy", o.name)),
        mesh(std::move(mesh_in)),
        options(o) {
    TUTTI_ARG_CHECK(mesh != nullptr, label, ": the mesh is null");
    tp::check_divisible(label, "vocab_size", vocab_in, mesh->tp_size());
    vocab = vocab_in;
    local = vocab / mesh->tp_size();
    start = mesh->tp_rank() * local;
  }

  // Checks logits/targets and returns logits as [n, local].
  Tensor check(const Tensor& logits, const Tensor& targets,
               const std::string& what) const {
    TUTTI_ARG_CHECK(logits.dtype() == DType::kFloat32 ||
                        logits.dtype() == DType::kFloat16 ||
                        logits.dtype() == DType::kBFloat16,
                    what, ": logits ", logits.str(),
                    " must be float32, float16 or bfloat16");
    Tensor z = tp::view_2d(logits, local, -1, logits.dtype(), logits.device(),
                           what, "logits");
    TUTTI_ARG_CHECK(
        targets.dtype() == DType::kInt32 || targets.dtype() == DType::kInt64,
        what, ": targets ", targets.str(), " must be int32 or int64");
    TUTTI_ARG_CHECK(
        targets.numel() == z.shape()[0] && targets.device() == logits.device(),
        what, ": targets ", targets.str(),
        " must hold one id per row of logits ", logits.str(), " (",
        z.shape()[0], ") on the same device");
    return z;
  }

  Tensor scalar_f32(const Tensor& t, int64_t n, Device d,
                    const std::string& what, const char* role) const {
    TUTTI_ARG_CHECK(
        t.dtype() == DType::kFloat32 && t.numel() == n && t.device() == d, what,
        ": ", role, " ", t.str(), " must be float32 with ", n, " elements on ",
        d.str());
    return t.flatten();
  }

  std::string label;
  ProcessMeshPtr mesh;
  VocabParallelCrossEntropyOptions options;
  int64_t vocab = 0, local = 0, start = 0;
  tp::Workspace ws;
  // Saved by forward for backward: max [n], stats [2n], mean_count [2].
  Tensor max, stats, mean_count;
  int64_t saved_rows = -1;
};

VocabParallelCrossEntropy::VocabParallelCrossEntropy(
    ProcessMeshPtr mesh, int64_t vocab_size,
    const VocabParallelCrossEntropyOptions& options)
    : impl_(std::make_unique<Impl>(std::move(mesh), vocab_size, options)) {}

VocabParallelCrossEntropy::~VocabParallelCrossEntropy() = default;

void VocabParallelCrossEntropy::forward(const Tensor& logits,
                                        const Tensor& targets,
                                        const Tensor& losses,
                                        const Tensor& mean_loss) {
  const std::string what = impl_->label + " forward";
  return tp::fail_fast(
      *impl_->mesh->impl(), logits.device(), what, [&] {
        Impl& c = *impl_;
        Tensor z = c.check(logits, targets, what);
        const int64_t n = z.shape()[0];
        const Device d = logits.device();
        Tensor mean = c.scalar_f32(mean_loss, 1, d, what, "mean_loss");
        Tensor loss = tp::is_absent(losses)
                          ? c.ws.get(kLosses, DType::kFloat32, Shape{n}, d)
                          : c.scalar_f32(losses, n, d, what, "losses");
        if (!targets.is_cuda())
          for (int64_t i = 0; i < n; ++i) {
            const int64_t t =
                load_as_double(targets.data(), targets.dtype(), i);
            TUTTI_ARG_CHECK(
                t == c.options.ignore_index || (t >= 0 && t < c.vocab), what,
                ": target ", t, " of row ", i,
                " is outside the vocabulary [0, ", c.vocab,
                ") and is not ignore_index ", c.options.ignore_index);
          }
        void* stream = c.options.stream;
        MeshImpl& m = *c.mesh->impl();
        c.saved_rows = -1;
        c.max = c.ws.get(kMax, DType::kFloat32, Shape{n}, d);
        c.stats = c.ws.get(kStats, DType::kFloat32, Shape{2 * n}, d);
        c.mean_count = c.ws.get(kMeanCount, DType::kFloat32, Shape{2}, d);
        tp::ce_local_max(z, c.max, stream);
        tp::allreduce(m, c.max, ReduceOp::kMax, what + ": row maximum", stream);
        tp::ce_local_sums(z, targets, c.start, c.options.ignore_index, c.max,
                          c.stats, stream);
        tp::allreduce(m, c.stats, ReduceOp::kSum,
                      what + ": sum of exponentials and target logits", stream);
        tp::ce_finalize(c.stats, targets, c.vocab, c.options.ignore_index, loss,
                        c.mean_count, stream);
        tp::copy_tensor(mean, c.mean_count.slice(0, 1), stream);
        c.saved_rows = n;
      });
}

void VocabParallelCrossEntropy::backward(const Tensor& logits,
                                         const Tensor& targets,
                                         const Tensor& grad_logits,
                                         float grad_scale) {
  const std::string what = impl_->label + " backward";
  return tp::fail_fast(
      *impl_->mesh->impl(), logits.device(), what, [&] {
        Impl& c = *impl_;
        Tensor z = c.check(logits, targets, what);
        TUTTI_ARG_CHECK(
            c.saved_rows == z.shape()[0] && c.max.device() == logits.device(),
            what, ": needs the forward of the same ", z.shape()[0],
            " rows first (the last forward saw ",
            c.saved_rows < 0 ? std::string("none")
                             : std::to_string(c.saved_rows),
            ")");
        Tensor g =
            tp::view_2d(grad_logits, c.local, z.shape()[0], logits.dtype(),
                        logits.device(), what, "grad_logits");
        tp::ce_backward(z, targets, c.start, c.options.ignore_index, c.max,
                        c.stats, c.mean_count, grad_scale, g, c.options.stream);
      });
}

int64_t VocabParallelCrossEntropy::vocab_size() const { return impl_->vocab; }
int64_t VocabParallelCrossEntropy::vocab_start() const { return impl_->start; }
int64_t VocabParallelCrossEntropy::vocab_per_rank() const {
  return impl_->local;
}

}  // namespace tutti
