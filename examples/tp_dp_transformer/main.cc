// Tensor parallel x data parallel training of a small transformer-style
// block: a next-token language model
//
//   e = Embedding(ids)                         vocab-parallel embedding
//   h = e + Row(gelu(Column(e)))               Megatron MLP block + residual
//   logits = Head(h)                           column-parallel, vocab-sharded
//   loss = CrossEntropy(logits, next_ids)      vocab-parallel cross-entropy
//
// on a ProcessMesh of TP x DP ranks (TP innermost).  Each data-parallel
// replica trains on its own slice of the batch; the reducer averages the
// (sharded) gradients over the data-parallel group while clipping combines
// the norm over the tensor-parallel group.  The data: sequences from a fixed
// random permutation, so token t+1 is a learnable function of token t.
//
//   mpirun -np 4 build/examples/tp_dp_transformer/tp_dp_transformer --tp 2
//
// Exits 0 when the loss fell below half of its start and the data-parallel
// replicas hold bit-identical parameters.
#include <tutti/tutti.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

namespace {

struct Args {
  int tp = 2;
  int64_t vocab = 64, hidden = 32, ffn = 128, seq = 16, batch = 8;  // per replica
  int steps = 100;
  float lr = 10.0f;
  double clip = 10.0;
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    const double v = std::atof(argv[i + 1]);
    if (k == "--tp") a.tp = static_cast<int>(v);
    else if (k == "--steps") a.steps = static_cast<int>(v);
    else if (k == "--lr") a.lr = static_cast<float>(v);
    else if (k == "--hidden") a.hidden = static_cast<int64_t>(v);
    else if (k == "--vocab") a.vocab = static_cast<int64_t>(v);
    else if (k == "--clip") a.clip = v;
  }
  return a;
}

float gelu(float x) { return 0.5f * x * (1.0f + std::tanh(0.7978845608f * (x + 0.044715f * x * x * x))); }
float gelu_grad(float x) {
  const float u = 0.7978845608f * (x + 0.044715f * x * x * x);
  const float t = std::tanh(u);
  return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * 0.7978845608f * (1.0f + 3 * 0.044715f * x * x);
}

tutti::Tensor mat(std::vector<float>& v, int64_t rows, int64_t cols) {
  return tutti::Tensor(v.data(), tutti::DType::kFloat32, tutti::Shape{rows, cols});
}

}  // namespace

int main(int argc, char** argv) {
  const Args a = parse(argc, argv);
  tutti::init();
  auto world = tutti::world();
  auto mesh = std::make_shared<tutti::ProcessMesh>(world, a.tp);
  const int rank = world->rank();
  if (rank == 0) std::printf("mesh: %s\n", mesh->str().c_str());

  // ---- the model (each TP rank holds its shards)
  using namespace tutti;
  VocabParallelEmbeddingOptions eo;
  eo.name = "embed";
  VocabParallelEmbedding embed(mesh, a.vocab, a.hidden, eo);
  ColumnParallelLinearOptions fc1o;
  fc1o.name = "mlp.fc1";
  fc1o.gather_output = false;
  ColumnParallelLinear fc1(mesh, a.hidden, a.ffn, fc1o);
  RowParallelLinearOptions fc2o;
  fc2o.name = "mlp.fc2";
  fc2o.input_is_parallel = true;
  RowParallelLinear fc2(mesh, a.ffn, a.hidden, fc2o);
  ColumnParallelLinearOptions heado;
  heado.name = "head";
  heado.gather_output = false;
  heado.bias = false;
  ColumnParallelLinear head(mesh, a.hidden, a.vocab, heado);
  VocabParallelCrossEntropy xent(mesh, a.vocab);
  embed.init_from_seed(1);
  fc1.init_from_seed(2);
  fc2.init_from_seed(3);
  head.init_from_seed(4);

  // ---- data parallel over the replicas: every shard's gradient
  std::vector<TPParameter> params;
  for (const auto& p : embed.parameters()) params.push_back(p);
  for (const auto& p : fc1.parameters()) params.push_back(p);
  for (const auto& p : fc2.parameters()) params.push_back(p);
  for (const auto& p : head.parameters()) params.push_back(p);
  ReducerOptions ro = ReducerOptions::from_env();
  ro.name = "dp";
  Reducer reducer(mesh->dp_group(), ro);
  for (const auto& p : params) reducer.add_parameter(p.name, p.value, p.grad);
  reducer.build();
  std::vector<Tensor> grads;
  amp::ClipOptions clip;
  clip.group = mesh->tp_group().get();
  for (const auto& p : params) {
    grads.push_back(p.grad);
    clip.replicated.push_back(p.tp_replicated());
    clip.names.push_back(p.name);
  }

  // ---- data: next token = perm[token]
  std::vector<int64_t> perm(a.vocab);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), std::mt19937(7));
  const int64_t n = a.batch * a.seq;
  std::vector<int64_t> ids(n), targets(n);
  std::vector<float> e(n * a.hidden), z(n * fc1.out_features_per_rank()), g(z.size()),
      m(n * a.hidden), h(n * a.hidden), logits(n * head.out_features_per_rank()),
      losses(n), mean(1), dlogits(logits.size()), dh(h.size()), dg(g.size()), dz(z.size()),
      de(e.size());
  float first_loss = 0, loss = 0;
  for (int step = 0; step < a.steps; ++step) {
    std::mt19937 rng(1000 * step + mesh->dp_rank());  // each replica its own data
    std::uniform_int_distribution<int64_t> tok(0, a.vocab - 1);
    for (int64_t b = 0; b < a.batch; ++b) {
      int64_t t = tok(rng);
      for (int64_t s = 0; s < a.seq; ++s) {
        ids[b * a.seq + s] = t;
        t = perm[t];
        targets[b * a.seq + s] = t;
      }
    }
    Tensor tids(ids.data(), DType::kInt64, Shape{n}), ttgt(targets.data(), DType::kInt64, Shape{n});
    // forward
    embed.forward(tids, mat(e, n, a.hidden));
    fc1.forward(mat(e, n, a.hidden), mat(z, n, fc1.out_features_per_rank()));
    for (size_t i = 0; i < z.size(); ++i) g[i] = gelu(z[i]);
    fc2.forward(mat(g, n, fc1.out_features_per_rank()), mat(m, n, a.hidden));
    for (size_t i = 0; i < h.size(); ++i) h[i] = e[i] + m[i];
    head.forward(mat(h, n, a.hidden), mat(logits, n, head.out_features_per_rank()));
    xent.forward(mat(logits, n, head.out_features_per_rank()), ttgt,
                 Tensor(losses.data(), DType::kFloat32, Shape{n}),
                 Tensor(mean.data(), DType::kFloat32, Shape{1}));
    loss = mean[0];
    // backward (gradients accumulate into the layers; clear them first)
    embed.zero_grad();
    fc1.zero_grad();
    fc2.zero_grad();
    head.zero_grad();
    xent.backward(mat(logits, n, head.out_features_per_rank()), ttgt,
                  mat(dlogits, n, head.out_features_per_rank()), 1.0f / static_cast<float>(n));
    head.backward(mat(h, n, a.hidden), mat(dlogits, n, head.out_features_per_rank()),
                  mat(dh, n, a.hidden));
    fc2.backward(mat(g, n, fc1.out_features_per_rank()), mat(dh, n, a.hidden),
                 mat(dg, n, fc1.out_features_per_rank()));
    for (size_t i = 0; i < z.size(); ++i) dz[i] = dg[i] * gelu_grad(z[i]);
    fc1.backward(mat(e, n, a.hidden), mat(dz, n, fc1.out_features_per_rank()), mat(de, n, a.hidden));
    for (size_t i = 0; i < de.size(); ++i) de[i] += dh[i];  // residual
    embed.backward(tids, mat(de, n, a.hidden));
    // data-parallel average (all layers' gradients are final now), then a
    // global norm clip over the tensor-parallel shards, then SGD
    for (int i = static_cast<int>(params.size()) - 1; i >= 0; --i) reducer.grad_ready(i);
    reducer.synchronize();
    amp::clip_grad_norm(grads, a.clip, clip);
    for (const auto& p : params) {
      float* w = p.value.data_as<float>();
      const float* gw = p.grad.data_as<float>();
      for (int64_t i = 0; i < p.value.numel(); ++i) w[i] -= a.lr * gw[i];
    }
    world->allreduce(Tensor::of(&loss, 1), ReduceOp::kAvg, {"loss"});
    if (step == 0) first_loss = loss;
    if (rank == 0 && (step % 10 == 0 || step == a.steps - 1))
      std::printf("step %3d  loss %.4f\n", step, loss);
  }

  // Data-parallel replicas must hold bit-identical shards.
  uint64_t hash = 1469598103934665603ull;
  for (const auto& p : params) {
    const unsigned char* b = static_cast<const unsigned char*>(p.value.data());
    for (size_t i = 0; i < p.value.nbytes(); ++i) hash = (hash ^ b[i]) * 1099511628211ull;
  }
  const int dp = mesh->dp_size();
  std::vector<uint64_t> hashes(dp);
  mesh->dp_group()->allgather(Tensor(&hash, DType::kInt64, Shape{1}),
                              Tensor(hashes.data(), DType::kInt64, Shape{dp}));
  bool identical = true;
  for (uint64_t x : hashes) identical = identical && x == hashes[0];
  const bool learned = loss < 0.5f * first_loss;
  if (rank == 0)
    std::printf("loss %.4f -> %.4f (%s); data-parallel replicas %s\n", first_loss, loss,
                learned ? "learned" : "DID NOT LEARN", identical ? "identical" : "DIFFER");
  tutti::shutdown();
  return learned && identical ? 0 : 1;
}
