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
#include "comm/adasum.h"
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

// One collective being prepared: its imported tensors and the request.
struct Call {
  std::vector<PyTensor> tensors;
  OpRequest request;

  const Tensor& add(const pyb::handle& obj, const char* what, int64_t stream) {
    tensors.push_back(import_tensor(obj, what, stream));
    return tensors.back().tensor;
  }
};

// A rank whose arguments cannot even be imported (not contiguous, an
// unsupported dtype or device) still takes part in the agreement check with
// an operation of the same kind that fails validation every rank's check,
// so its peers raise MismatchError ("rank R rejected the arguments")
// at once instead of waiting for it until TUTTI_TIMEOUT.
void poison(ProcessGroup& g, CollectiveKind kind) {
  OpRequest r;
  r.kind = kind;
  r.input = Tensor(nullptr, DType::kFloat32, Shape{0});
  r.output = Tensor(nullptr, DType::kFloat64, Shape{0});  // dtypes differ
  r.root = -1;                                            // no such rank
  try {
    pyb::gil_scoped_release nogil;
    g.submit(r, true)->wait();
  } catch (const Error&) {
    // Expected: this rank raises its own, precise error below.
  }
}

// Prepares (imports, validates) and submits one operation with the GIL
// released; waits unless async_op, else returns a Work that keeps the
// tensors alive.
pyb::object run(ProcessGroup& g, CollectiveKind kind, bool async_op,
                const std::function<void(Call&)>& prepare) {
  // Errors a rank finds on its own before any communication (arguments it
  // cannot import; a device this group cannot route) are shared with its
  // peers through poison().  Point-to-point operations have no agreement.
  const bool collective = kind != CollectiveKind::kSend && kind != CollectiveKind::kRecv;
  auto rejected = [&](const Error& e) {
    return collective && g.size() > 1 &&
           (e.code() == ErrorCode::kInvalidArgument || e.code() == ErrorCode::kUnsupported);
  };
  Call c;
  c.request.kind = kind;
  try {
    prepare(c);
  } catch (const Error& e) {
    if (rejected(e)) poison(g, kind);
    throw;
  }
  WorkPtr w;
  std::exception_ptr routing_error;
  {
    pyb::gil_scoped_release nogil;
    // Blocking calls let an idle communicator run them on this thread.
    try {
      w = g.submit(c.request, !async_op);
    } catch (const Error& e) {
      if (!rejected(e)) throw;
      routing_error = std::current_exception();
    }
    if (w && !async_op) w->wait();
  }
  if (routing_error) {
    poison(g, kind);
    std::rethrow_exception(routing_error);
  }
  if (!async_op) return pyb::none();
  PyWork pw{w, {}};
  for (auto& t : c.tensors) {
    pw.keep.push_back(t.capsule);
    pw.keep.push_back(t.owner);
  }
  return pyb::cast(std::move(pw));
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
      "A group of ranks; host tensors travel over MPI, CUDA tensors over NCCL "
      "(or staged through host memory where ranks share a GPU: TUTTI_DEVICE_TRANSPORT).");
  group.def_property_readonly("rank", &ProcessGroup::rank)
      .def_property_readonly("size", &ProcessGroup::size)
      .def_property_readonly("name", &ProcessGroup::name)
      .def("world_rank", &ProcessGroup::world_rank, pyb::arg("group_rank"))
      .def("allreduce",
           [](ProcessGroup& g, pyb::handle tensor, pyb::object op, pyb::object out,
              std::string name, bool async_op, int64_t stream, double timeout) {
             return run(g, CollectiveKind::kAllreduce, async_op, [&](Call& c) {
               c.request.op = parse_op(op);
               c.request.input = c.add(tensor, "tensor", stream);
               c.request.output = out.is_none() ? c.request.input : c.add(out, "out", stream);
               c.request.options = options(name, stream, timeout);
             });
           },
           pyb::arg("tensor"), pyb::arg("op") = ReduceOp::kSum,
           pyb::arg("out") = pyb::none(), pyb::arg("name") = "",
           pyb::arg("async_op") = false, pyb::arg("stream") = 0,
           pyb::arg("timeout") = 0.0,
           "All-reduce `tensor` in place (or into `out`) with `op`.")
      .def("broadcast",
           [](ProcessGroup& g, pyb::handle tensor, int root, std::string name,
              bool async_op, int64_t stream, double timeout) {
             return run(g, CollectiveKind::kBroadcast, async_op, [&](Call& c) {
               c.request.input = c.request.output = c.add(tensor, "tensor", stream);
               c.request.root = root;
               c.request.options = options(name, stream, timeout);
             });
           },
           pyb::arg("tensor"), pyb::arg("root") = 0, pyb::arg("name") = "",
           pyb::arg("async_op") = false, pyb::arg("stream") = 0,
           pyb::arg("timeout") = 0.0, "Broadcast `tensor` from `root` in place.")
      .def("allgatherv",
           [](ProcessGroup& g, pyb::handle input, pyb::handle output,
              std::vector<int64_t> counts, std::string name, bool async_op,
              int64_t stream, double timeout) {
             return run(g, CollectiveKind::kAllgatherv, async_op, [&](Call& c) {
               c.request.input = c.add(input, "input", stream);
               c.request.output = c.add(output, "output", stream);
               c.request.counts = counts;
               c.request.options = options(name, stream, timeout);
             });
           },
           pyb::arg("input"), pyb::arg("output"), pyb::arg("counts"),
           pyb::arg("name") = "", pyb::arg("async_op") = false,
           pyb::arg("stream") = 0, pyb::arg("timeout") = 0.0,
           "Gather inputs of different sizes; counts[r] elements from rank r.")
      .def("reduce_scatter",
           [](ProcessGroup& g, pyb::handle input, pyb::handle output, pyb::object op,
              std::string name, bool async_op, int64_t stream, double timeout) {
             return run(g, CollectiveKind::kReduceScatter, async_op, [&](Call& c) {
               c.request.op = parse_op(op);
               c.request.input = c.add(input, "input", stream);
               c.request.output = c.add(output, "output", stream);
               c.request.options = options(name, stream, timeout);
             });
           },
           pyb::arg("input"), pyb::arg("output"), pyb::arg("op") = ReduceOp::kSum,
           pyb::arg("name") = "", pyb::arg("async_op") = false,
           pyb::arg("stream") = 0, pyb::arg("timeout") = 0.0,
           "Reduce `input` (size x output) and scatter block r to rank r.")
      .def("adasum_allreduce",
           [](ProcessGroup& g, pyb::handle tensors, std::string name, int64_t stream,
              double timeout) {
             const OpOptions o = options(name, stream, timeout);
             std::vector<PyTensor> imported;
             try {
               imported = import_tensors(tensors, "tensors", stream);
             } catch (const Error&) {
               pyb::gil_scoped_release nogil;
               comm::adasum_reject(g, o);
               throw;
             }
             const std::vector<Tensor> ts = views(imported);
             pyb::gil_scoped_release nogil;
             adasum_allreduce(g, ts, o);
           },
           pyb::arg("tensors"), pyb::arg("name") = "", pyb::arg("stream") = 0,
           pyb::arg("timeout") = 0.0,
           "Adasum (Maleki et al., MLSys 2021) of a list of float tensors, in "
           "place, with per-tensor dot products; blocking.  The group size must "
           "be a power of two.")
      .def("barrier",
           [](ProcessGroup& g, bool async_op, double timeout) {
             return run(g, CollectiveKind::kBarrier, async_op, [&](Call& c) {
               c.request.options = options("", 0, timeout);
             });
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
      .def("join", [](ProcessGroup& g) {
        pyb::gil_scoped_release nogil;
        return g.join();
      }, "Uneven inputs: block until every rank joined, taking part in the "
         "others' all-reduces (identity), barriers and broadcasts meanwhile; "
         "returns the rank that joined last (docs/python.md, join).")
      .def("__repr__", [](ProcessGroup& g) {
        return "<tutti.ProcessGroup '" + g.name() + "' rank " +
               std::to_string(g.rank()) + " of " + std::to_string(g.size()) + ">";
      });
  // allgather and alltoall take (input, output) and nothing else.
  for (auto kind : {CollectiveKind::kAllgather, CollectiveKind::kAlltoall}) {
    group.def(collective_kind_name(kind),
              [kind](ProcessGroup& g, pyb::handle input, pyb::handle output,
                     std::string name, bool async_op, int64_t stream, double timeout) {
                return run(g, kind, async_op, [&](Call& c) {
                  c.request.input = c.add(input, "input", stream);
                  c.request.output = c.add(output, "output", stream);
                  c.request.options = options(name, stream, timeout);
                });
              },
              pyb::arg("input"), pyb::arg("output"), pyb::arg("name") = "",
              pyb::arg("async_op") = false, pyb::arg("stream") = 0,
              pyb::arg("timeout") = 0.0,
              kind == CollectiveKind::kAllgather
                  ? "Gather every rank's `input` into `output` (size x input, rank order)."
                  : "Block j of input to rank j; equal blocks.");
  }
  // send / recv share their signature.
  for (auto kind : {CollectiveKind::kSend, CollectiveKind::kRecv}) {
    group.def(collective_kind_name(kind),
              [kind](ProcessGroup& g, pyb::handle tensor, int peer, int tag,
                     bool async_op, int64_t stream, double timeout) {
                return run(g, kind, async_op, [&](Call& c) {
                  c.request.input = c.request.output = c.add(tensor, "tensor", stream);
                  c.request.root = peer;
                  c.request.tag = tag;
                  c.request.options = options("", stream, timeout);
                });
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
  m.def("mpi_thread_level", &mpi_thread_level,
        "The thread level MPI granted tutti's world (\"MPI_THREAD_MULTIPLE\"), "
        "or \"\" when the world runs without MPI.");
  m.def("world", &world, "The world ProcessGroup.");
  m.def("rank", [] { return rank(); });
  m.def("size", [] { return size(); });
  m.def("local_rank", [] { return local_rank(); });
  m.def("local_size", [] { return local_size(); });
  m.def("recovery_available", &recovery_available,
        "Whether lost ranks can be recovered from in this process: an MPI with "
        "ULFM launched with `mpiexec --with-ft ulfm`, TUTTI_ULFM=1.");
  m.def("recover", [](int tp_size) {
    RecoveryResult r;
    {
      pyb::gil_scoped_release nogil;
      RecoveryOptions o;
      o.tp_size = tp_size;
      r = recover(o);
    }
    pyb::dict d;
    d["lost"] = r.lost;
    d["old_size"] = r.old_size;
    d["new_size"] = r.new_size;
    d["new_rank"] = r.new_rank;
    d["attempts"] = r.attempts;
    d["seconds"] = r.seconds;
    d["left"] = r.left;
    d["leaving"] = r.leaving;
    return d;
  }, pyb::arg("tp_size") = 1,
     "Collective among the survivors after a RanksLostError: shrinks the world to "
     "them (tutti.world(), rank(), size() describe them after it) and releases every "
     "group over the old one (their ops raise AbortedError).  tp_size > 1 (a TP x DP "
     "mesh, TP groups of consecutive ranks): a TP group that lost a member leaves "
     "whole; its survivors get 'leaving': True and should end the process, the others "
     "keep their order and TP index (docs/elastic.md, \"Tensor parallel jobs\").  "
     "Returns {'lost': [world ranks], 'old_size', 'new_size', 'new_rank', 'attempts', "
     "'seconds', 'left': [world ranks that leave with their TP group], 'leaving'}.");
  pyb::class_<RecoveryScope>(m, "RecoveryScope",
                             "While one lives, a lost rank is raised as RanksLostError "
                             "even under tutti-run (TUTTI_EXIT_ON_COMM_FAILURE), for an "
                             "in-process recovery.")
      .def(pyb::init<>());
}

}  // namespace py
}  // namespace tutti
