// Process groups and collectives on DLPack tensors.
//
// Every collective accepts any object with __dlpack__ (zero-copy) and runs
// in place on it or into `out`.  The GIL is released while tutti works, so
// other Python threads (data loaders) keep running.  async_op=True returns a
// Work that keeps the tensors alive until it is waited on.
#include <pybind11/stl.h>

#include <string>
#include <vector>

#include "bindings.h"
#include "dlpack_tensor.h"
#include "tutti/tutti.h"

namespace tutti {
namespace py {
namespace {

namespace pyb = pybind11;

struct PyWork {
  WorkPtr work;
  std::vector<pyb::object> keep;  // capsules/owners of the tensors in flight
};

ReduceOp parse_op(const pyb::object& op) {
  if (pyb::isinstance<ReduceOp>(op)) return op.cast<ReduceOp>();
  if (pyb::isinstance<pyb::str>(op)) {
    const std::string s = op.cast<std::string>();
    for (ReduceOp r : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMin,
                       ReduceOp::kMax, ReduceOp::kProd})
      if (s == reduce_op_name(r) || (s == "average" && r == ReduceOp::kAvg) ||
          (s == "mean" && r == ReduceOp::kAvg) || (s == "product" && r == ReduceOp::kProd))
        return r;
    throw Error(ErrorCode::kInvalidArgument,
                "reduce op '" + s + "' is not one of sum, avg, min, max, prod");
  }
  throw Error(ErrorCode::kInvalidArgument, "op must be a tutti.ReduceOp or a string");
}

OpOptions options(const std::string& name, int64_t stream, double timeout) {
  OpOptions o;
  o.name = name;
  o.stream = reinterpret_cast<void*>(static_cast<intptr_t>(stream));
  o.timeout_s = timeout;
  return o;
}

// Submits with the GIL released; waits unless async.
pyb::object finish(const std::function<WorkPtr(bool)>& submit, bool async_op,
                   std::vector<PyTensor>&& tensors) {
  WorkPtr w;
  {
    pyb::gil_scoped_release nogil;
    w = submit(!async_op);
    if (!async_op) w->wait();
  }
  if (!async_op) return pyb::none();
  PyWork pw{w, {}};
  for (auto& t : tensors) {
    pw.keep.push_back(t.capsule);
    pw.keep.push_back(t.owner);
  }
  return pyb::cast(std::move(pw));
}

// Blocking calls go through Communicator::submit(blocking=true) so an idle
// communicator runs them on this thread.
WorkPtr submit(ProcessGroup& g, OpRequest&& r, bool blocking) {
  return g.submit(r, blocking);
}

OpRequest request(CollectiveKind kind, const Tensor& in, const Tensor& out,
                  const OpOptions& o) {
  OpRequest r;
  r.kind = kind;
  r.input = in;
  r.output = out;
  r.options = o;
  return r;
}

}  // namespace

void bind_comm(pyb::module_& m) {
  pyb::enum_<ReduceOp>(m, "ReduceOp", "Reduction applied by allreduce/reduce_scatter.")
      .value("SUM", ReduceOp::kSum)
      .value("AVG", ReduceOp::kAvg)
      .value("MIN", ReduceOp::kMin)
      .value("MAX", ReduceOp::kMax)
      .value("PROD", ReduceOp::kProd);

  pyb::class_<PyWork>(m, "Work", "Handle of an operation in flight.")
      .def("wait", [](PyWork& w) {
        {
          pyb::gil_scoped_release nogil;
          w.work->wait();
        }
        w.keep.clear();
      }, "Block until done (CUDA: until the caller's stream is ordered after "
         "it); raises the operation's error.")
      .def("synchronize", [](PyWork& w) {
        {
          pyb::gil_scoped_release nogil;
          w.work->synchronize();
        }
        w.keep.clear();
      }, "Block until the result is in memory (CUDA: the GPU finished).")
      .def("test", [](PyWork& w) { return w.work->test(); },
           "True once done; raises the operation's error if it failed.")
      .def_property_readonly("seq", [](PyWork& w) { return w.work->seq(); })
      .def_property_readonly("description", [](PyWork& w) { return w.work->description(); })
      .def("__repr__", [](PyWork& w) { return "<tutti.Work " + w.work->description() + ">"; });

  pyb::class_<ProcessGroup, std::shared_ptr<ProcessGroup>> group(
      m, "ProcessGroup",
      "A group of ranks; host tensors travel over MPI, CUDA tensors over NCCL.");
  group.def_property_readonly("rank", &ProcessGroup::rank)
      .def_property_readonly("size", &ProcessGroup::size)
      .def_property_readonly("name", &ProcessGroup::name)
      .def("world_rank", &ProcessGroup::world_rank, pyb::arg("group_rank"))
      .def("allreduce",
           [](ProcessGroup& g, pyb::handle tensor, pyb::object op, pyb::object out,
              std::string name, bool async_op, int64_t stream, double timeout) {
             std::vector<PyTensor> ts;
             ts.push_back(import_tensor(tensor, "tensor", stream));
             if (!out.is_none()) ts.push_back(import_tensor(out, "out", stream));
             OpRequest r = request(CollectiveKind::kAllreduce, ts[0].tensor,
                                   ts.back().tensor, options(name, stream, timeout));
             r.op = parse_op(op);
             return finish([&](bool b) { return submit(g, std::move(r), b); },
                           async_op, std::move(ts));
           },
           pyb::arg("tensor"), pyb::arg("op") = ReduceOp::kSum,
           pyb::arg("out") = pyb::none(), pyb::arg("name") = "",
           pyb::arg("async_op") = false, pyb::arg("stream") = 0,
           pyb::arg("timeout") = 0.0,
           "All-reduce `tensor` in place (or into `out`) with `op`.")
      .def("broadcast",
           [](ProcessGroup& g, pyb::handle tensor, int root, std::string name,
              bool async_op, int64_t stream, double timeout) {
             std::vector<PyTensor> ts;
             ts.push_back(import_tensor(tensor, "tensor", stream));
             OpRequest r = request(CollectiveKind::kBroadcast, ts[0].tensor,
                                   ts[0].tensor, options(name, stream, timeout));
             r.root = root;
             return finish([&](bool b) { return submit(g, std::move(r), b); },
                           async_op, std::move(ts));
           },
           pyb::arg("tensor"), pyb::arg("root") = 0, pyb::arg("name") = "",
           pyb::arg("async_op") = false, pyb::arg("stream") = 0,
           pyb::arg("timeout") = 0.0, "Broadcast `tensor` from `root` in place.")
      .def("allgather",
           [](ProcessGroup& g, pyb::handle input, pyb::handle output,
              std::string name, bool async_op, int64_t stream, double timeout) {
             std::vector<PyTensor> ts;
             ts.push_back(import_tensor(input, "input", stream));
             ts.push_back(import_tensor(output, "output", stream));
             OpRequest r = request(CollectiveKind::kAllgather, ts[0].tensor,
                                   ts[1].tensor, options(name, stream, timeout));
             return finish([&](bool b) { return submit(g, std::move(r), b); },
                           async_op, std::move(ts));
           },
           pyb::arg("input"), pyb::arg("output"), pyb::arg("name") = "",
           pyb::arg("async_op") = false, pyb::arg("stream") = 0,
           pyb::arg("timeout") = 0.0,
           "Gather every rank's `input` into `output` (size x input, rank order).")
      .def("allgatherv",
           [](ProcessGroup& g, pyb::handle input, pyb::handle output,
              std::vector<int64_t> counts, std::string name, bool async_op,
              int64_t stream, double timeout) {
             std::vector<PyTensor> ts;
             ts.push_back(import_tensor(input, "input", stream));
             ts.push_back(import_tensor(output, "output", stream));
             OpRequest r = request(CollectiveKind::kAllgatherv, ts[0].tensor,
                                   ts[1].tensor, options(name, stream, timeout));
             r.counts = std::move(counts);
             return finish([&](bool b) { return submit(g, std::move(r), b); },
                           async_op, std::move(ts));
           },
           pyb::arg("input"), pyb::arg("output"), pyb::arg("counts"),
           pyb::arg("name") = "", pyb::arg("async_op") = false,
           pyb::arg("stream") = 0, pyb::arg("timeout") = 0.0,
           "Gather inputs of different sizes; counts[r] elements from rank r.")
      .def("reduce_scatter",
           [](ProcessGroup& g, pyb::handle input, pyb::handle output, pyb::object op,
              std::string name, bool async_op, int64_t stream, double timeout) {
             std::vector<PyTensor> ts;
             ts.push_back(import_tensor(input, "input", stream));
             ts.push_back(import_tensor(output, "output", stream));
             OpRequest r = request(CollectiveKind::kReduceScatter, ts[0].tensor,
                                   ts[1].tensor, options(name, stream, timeout));
             r.op = parse_op(op);
             return finish([&](bool b) { return submit(g, std::move(r), b); },
                           async_op, std::move(ts));
           },
           pyb::arg("input"), pyb::arg("output"), pyb::arg("op") = ReduceOp::kSum,
           pyb::arg("name") = "", pyb::arg("async_op") = false,
           pyb::arg("stream") = 0, pyb::arg("timeout") = 0.0,
           "Reduce `input` (size x output) and scatter block r to rank r.")
      .def("alltoall",
           [](ProcessGroup& g, pyb::handle input, pyb::handle output,
              std::string name, bool async_op, int64_t stream, double timeout) {
             std::vector<PyTensor> ts;
             ts.push_back(import_tensor(input, "input", stream));
             ts.push_back(import_tensor(output, "output", stream));
             OpRequest r = request(CollectiveKind::kAlltoall, ts[0].tensor,
                                   ts[1].tensor, options(name, stream, timeout));
             return finish([&](bool b) { return submit(g, std::move(r), b); },
                           async_op, std::move(ts));
           },
           pyb::arg("input"), pyb::arg("output"), pyb::arg("name") = "",
           pyb::arg("async_op") = false, pyb::arg("stream") = 0,
           pyb::arg("timeout") = 0.0, "Block j of input to rank j; equal blocks.")
      .def("barrier",
           [](ProcessGroup& g, bool async_op, double timeout) {
             OpRequest r = request(CollectiveKind::kBarrier, Tensor(), Tensor(),
                                   options("", 0, timeout));
             return finish([&](bool b) { return submit(g, std::move(r), b); },
                           async_op, {});
           },
           pyb::arg("async_op") = false, pyb::arg("timeout") = 0.0)
      .def("split",
           [](ProcessGroup& g, int color, int key, std::string name) {
             pyb::gil_scoped_release nogil;
             return g.split_group(color, key, name);
           },
           pyb::arg("color"), pyb::arg("key") = 0, pyb::arg("name") = "",
           "Collective: ranks with the same color form a new group ordered by "
           "(key, rank); a negative color returns None.")
      .def("node_group", [](ProcessGroup& g) {
        pyb::gil_scoped_release nogil;
        return g.node_group();
      })
      .def("cross_node_group", [](ProcessGroup& g) {
        pyb::gil_scoped_release nogil;
        return g.cross_node_group();
      })
      .def("synchronize", [](ProcessGroup& g) {
        pyb::gil_scoped_release nogil;
        g.synchronize();
      }, "Wait for every operation submitted so far.")
      .def("__repr__", [](ProcessGroup& g) {
        return "<tutti.ProcessGroup '" + g.name() + "' rank " +
               std::to_string(g.rank()) + " of " + std::to_string(g.size()) + ">";
      });
  // send / recv share their signature.
  for (auto kind : {CollectiveKind::kSend, CollectiveKind::kRecv}) {
    group.def(collective_kind_name(kind),
              [kind](ProcessGroup& g, pyb::handle tensor, int peer, int tag,
                     bool async_op, int64_t stream, double timeout) {
                std::vector<PyTensor> ts;
                ts.push_back(import_tensor(tensor, "tensor", stream));
                OpRequest r = request(kind, ts[0].tensor, ts[0].tensor,
                                      options("", stream, timeout));
                r.root = peer;
                r.tag = tag;
                return finish([&](bool b) { return submit(g, std::move(r), b); },
                              async_op, std::move(ts));
              },
              pyb::arg("tensor"), pyb::arg("peer"), pyb::arg("tag") = 0,
              pyb::arg("async_op") = false, pyb::arg("stream") = 0,
              pyb::arg("timeout") = 0.0,
              kind == CollectiveKind::kSend ? "Send `tensor` to `peer`."
                                            : "Receive exactly `tensor`'s size from `peer`.");
  }

  m.def("init", [](const std::string& world_mode) {
    InitOptions o;
    o.world = world_mode;
    pyb::gil_scoped_release nogil;
    init(o);
  }, pyb::arg("world") = "",
     "Initialise tutti (MPI under mpirun, a world of one otherwise). Idempotent.");
  m.def("shutdown", [] {
    pyb::gil_scoped_release nogil;
    shutdown();
  }, "Drain and release everything; finalises MPI if tutti initialised it.");
  m.def("initialized", &initialized);
  m.def("world", &world, "The world ProcessGroup.");
  m.def("rank", [] { return rank(); });
  m.def("size", [] { return size(); });
  m.def("local_rank", [] { return local_rank(); });
  m.def("local_size", [] { return local_size(); });
}

}  // namespace py
}  // namespace tutti
