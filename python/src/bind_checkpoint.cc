// Checkpoints: tutti.CheckpointManager over DLPack tensors and tutti
// Stateful objects.
//
// A checkpoint "component" is either a tutti Stateful (loss scaler,
// compressor, tensor-parallel layer: its on_state_loaded() runs after a
// load) or a dict name -> tensor / (tensor, shard dict).  Tensors are
// "<component>/<name>" in the checkpoint, as in C++.  Save and load release
// the GIL; an async save copies the state before save() returns.
#include "bindings.h"

#include <pybind11/stl.h>

#include <memory>
#include <mutex>
#include <set>

#include "convert.h"
#include "core/check.h"
#include "tutti/commit_tiers.h"
#include "tutti/checkpoint.h"

namespace tutti {
namespace py {
namespace {

// A dict component: views of Python tensors, alive for one call.
class DictComponent : public Stateful {
 public:
  StateDict state;
  StateDict state_dict() override { return state; }
};

struct Prepared {
  std::vector<PyTensor> keep;
  std::vector<std::shared_ptr<Stateful>> owners;
  Components components;
};

ShardInfo shard_from(const pyb::handle& d) {
  ShardInfo s;
  auto dict = pyb::reinterpret_borrow<pyb::dict>(d);
  if (dict.contains("global_shape"))
    s.global_shape = dict["global_shape"].cast<std::vector<int64_t>>();
  if (dict.contains("dim")) s.dim = dict["dim"].cast<int>();
  if (dict.contains("offset")) s.offset = dict["offset"].cast<int64_t>();
  if (dict.contains("group")) s.group = dict["group"].cast<std::string>();
  if (dict.contains("flat")) s.flat = dict["flat"].cast<bool>();
  if (dict.contains("per_rank")) s.per_rank = dict["per_rank"].cast<bool>();
  for (const auto& kv : dict) {
    const std::string k = pyb::str(kv.first);
    TUTTI_ARG_CHECK(k == "global_shape" || k == "dim" || k == "offset" || k == "group" ||
                        k == "flat" || k == "per_rank",
                    "checkpoint shard dict: unknown key '", k, "' (expected global_shape, "
                    "dim, offset, group, flat, per_rank)");
  }
  return s;
}

Prepared prepare(const pyb::handle& state) {
  TUTTI_ARG_CHECK(pyb::isinstance<pyb::dict>(state),
                  "checkpoint state must be a dict component name -> Stateful or "
                  "dict of tensors");
  Prepared p;
  for (const auto& item : pyb::reinterpret_borrow<pyb::dict>(state)) {
    const std::string comp = pyb::str(item.first);
    if (pyb::isinstance<Stateful>(item.second)) {
      auto s = item.second.cast<std::shared_ptr<Stateful>>();
      p.components.emplace_back(comp, s.get());
      p.owners.push_back(std::move(s));
      continue;
    }
    TUTTI_ARG_CHECK(pyb::isinstance<pyb::dict>(item.second), "checkpoint component '",
                    comp, "' must be a tutti Stateful or a dict name -> tensor");
    auto dc = std::make_shared<DictComponent>();
    for (const auto& t : pyb::reinterpret_borrow<pyb::dict>(item.second)) {
      NamedTensor nt;
      nt.name = pyb::str(t.first);
      const std::string label = comp + "/" + nt.name;
      pyb::handle value = t.second;
      if (pyb::isinstance<pyb::tuple>(value)) {
        auto pair = pyb::reinterpret_borrow<pyb::tuple>(value);
        TUTTI_ARG_CHECK(pair.size() == 2, "checkpoint tensor '", label,
                        "': expected a tensor or (tensor, shard dict)");
        nt.shard = shard_from(pair[1]);
        value = pair[0];
      }
      p.keep.push_back(import_array_like(value, label.c_str()));
      nt.tensor = p.keep.back().tensor;
      dc->state.push_back(std::move(nt));
    }
    p.components.emplace_back(comp, dc.get());
    p.owners.push_back(std::move(dc));
  }
  return p;
}

pyb::object json_loads(const std::string& s) {
  return pyb::module_::import("json").attr("loads")(s.empty() ? "{}" : s);
}

pyb::dict info_dict(const CheckpointInfo& i) {
  pyb::dict d;
  d["name"] = i.name;
  d["path"] = i.path;
  d["step"] = i.step;
  d["complete"] = i.complete;
  return d;
}

// Managers still open; closed (their saves waited for) before shutdown.
struct PyManagerBase {
  virtual ~PyManagerBase() = default;
  virtual void close() = 0;
};
std::mutex g_mu;
std::set<PyManagerBase*>& live() {
  static std::set<PyManagerBase*> s;
  return s;
}

// A CheckpointManager, or the elastic commits' CommitTiers (the same
// methods), owned by Python.
template <class M>
struct PyManager : PyManagerBase {
  std::unique_ptr<M> mgr;
  PyManager() {
    std::lock_guard<std::mutex> lock(g_mu);
    live().insert(this);
  }
  ~PyManager() override {
    close();
    std::lock_guard<std::mutex> lock(g_mu);
    live().erase(this);
  }
  M& get() {
    TUTTI_ARG_CHECK(mgr != nullptr, "the checkpoint manager is closed");
    return *mgr;
  }
  void close() override {
    std::unique_ptr<M> m = std::move(mgr);
    if (!m) return;
    if (PyGILState_Check()) {
      pyb::gil_scoped_release nogil;
      m.reset();
    } else {
      m.reset();
    }
  }
};
using PyCheckpointManager = PyManager<CheckpointManager>;
using PyCommitTiers = PyManager<elastic::CommitTiers>;

// save, wait, load, latest_step, list, dir, stats and close: the same on
// both kinds of manager (tutti.torch.checkpoint.save/load take either).
template <class M>
void def_manager_methods(pyb::class_<PyManager<M>>& c) {
  using P = PyManager<M>;
  c.def("save",
        [](P& self, int64_t step, pyb::handle state, pyb::object metadata) {
          Prepared p = prepare(state);
          const std::string meta =
              metadata.is_none()
                  ? std::string("{}")
                  : pyb::str(pyb::module_::import("json").attr("dumps")(metadata))
                        .cast<std::string>();
          M& mgr = self.get();
          pyb::gil_scoped_release nogil;
          mgr.save(step, p.components, meta);
        },
        pyb::arg("step"), pyb::arg("state"), pyb::arg("metadata") = pyb::none(),
        "Collective: saves `state` as checkpoint `step`.  Async managers return "
        "once the state is copied (the tensors may change afterwards).")
      .def("wait", [](P& self) {
        M& mgr = self.get();
        pyb::gil_scoped_release nogil;
        mgr.wait();
      }, "Blocks until the in-flight save is committed on every rank; raises its error.")
      .def_property_readonly("in_flight", [](P& self) { return self.get().in_flight(); })
      .def("load",
           [](P& self, pyb::handle state, int64_t step, std::vector<std::string> optional,
              bool resume) -> pyb::object {
             Prepared p = prepare(state);
             LoadOptions o;
             o.step = step;
             o.optional = std::move(optional);
             o.resume = resume;
             M& mgr = self.get();
             std::optional<LoadResult> r;
             {
               pyb::gil_scoped_release nogil;
               r = mgr.load(p.components, o);
             }
             if (!r) return pyb::none();
             pyb::dict d;
             d["step"] = r->step;
             d["name"] = r->name;
             d["metadata"] = json_loads(r->metadata_json);
             d["saved_world_size"] = r->saved_world_size;
             d["skipped"] = r->skipped;
             d["files_opened"] = r->files_opened;
             d["bytes_read"] = r->bytes_read;
             return std::move(d);
           },
           pyb::arg("state"), pyb::kw_only(), pyb::arg("step") = -1,
           pyb::arg("optional") = std::vector<std::string>{}, pyb::arg("resume") = true,
           "Collective: loads the newest checkpoint that verifies (or exactly "
           "`step`) into the state's tensors, resharding as needed.  Returns "
           "{step, name, metadata, saved_world_size, skipped, files_opened, "
           "bytes_read (this rank's reads)} or None when there "
           "is none.  `optional`: names or 'prefix/' that may be absent.  "
           "resume=False: a read-only load that changes nothing in the directory "
           "(newer checkpoints are not set aside as an abandoned timeline).")
      .def("latest_step", [](P& self) {
        M& mgr = self.get();
        pyb::gil_scoped_release nogil;
        return mgr.latest_step();
      },
           "Local: the newest complete checkpoint's step (not verified), or None.")
      .def("list", [](P& self) {
        M& mgr = self.get();
        std::vector<CheckpointInfo> all;
        {
          pyb::gil_scoped_release nogil;
          all = mgr.list();
        }
        pyb::list out;
        for (const auto& i : all) out.append(info_dict(i));
        return out;
      }, "Local: every checkpoint directory, oldest first.")
      .def_property_readonly("dir", [](P& self) { return self.get().dir(); })
      .def("last_save_stats", [](P& self) {
        const SaveStats s = self.get().last_save_stats();
        pyb::dict d;
        d["step"] = s.step;
        d["bytes"] = s.bytes;
        d["written_bytes"] = s.written_bytes;
        d["blocking_s"] = s.blocking_s;
        d["snapshot_s"] = s.snapshot_s;
        d["write_s"] = s.write_s;
        d["commit_s"] = s.commit_s;
        d["direct_io"] = s.direct_io;
        return d;
      })
      .def("close", &P::close,
           "Waits for an in-flight save and releases the manager (also at exit, "
           "before tutti.shutdown()).")
      .def("__enter__", [](pyb::object self) { return self; })
      .def("__exit__", [](P& self, pyb::args) {
        self.close();
        return false;
      });
}

}  // namespace

void bind_checkpoint(pyb::module_& m) {
  pyb::enum_<FreshStart>(m, "FreshStart",
                         "What a load that finds no complete checkpoint does where a "
                         "history is expected (docs/checkpoint.md, 'Fresh starts').")
      .value("FROM_SETTING", FreshStart::kFromSetting, "TUTTI_CKPT_FRESH_START")
      .value("AUTO", FreshStart::kAuto,
             "start fresh unless a history is expected (a 'latest' pointer, abandoned "
             "checkpoints, or a tutti-run restart into an unused directory)")
      .value("ALLOW", FreshStart::kAllow, "always start fresh (WARN when a history was expected)")
      .value("REFUSE", FreshStart::kRefuse, "never: the job must resume");
  pyb::class_<PyCheckpointManager> checkpoint_manager(
      m, "CheckpointManager",
      "Sharded, checksummed, atomically committed checkpoints (safetensors "
      "shards + manifest.json) with async saves and resharding loads.  "
      "Collective over `group`.  state: {component: Stateful or {name: tensor "
      "or (tensor, shard dict)}}; metadata: a JSON-serialisable dict.");
  checkpoint_manager.def(
      pyb::init([](std::shared_ptr<ProcessGroup> group, std::string dir, int keep_last,
                        bool async_save, double timeout, pyb::object mesh, bool direct_io,
                        int64_t stream, FreshStart fresh_start, unsigned file_mode,
                        unsigned dir_mode, const std::string& layout) {
             CheckpointOptions o;
             TUTTI_ARG_CHECK(layout.empty() || layout == "once" || layout == "per-rank",
                             "CheckpointManager: layout='", layout,
                             "' (expected 'once', 'per-rank' or '' for TUTTI_CKPT_LAYOUT)");
             o.layout = layout.empty() ? CheckpointLayout::kFromSetting
                        : layout == "once" ? CheckpointLayout::kOnce
                                           : CheckpointLayout::kPerRank;
             o.fresh_start = fresh_start;
             o.file_mode = file_mode;
             o.dir_mode = dir_mode;
             o.dir = std::move(dir);
             o.keep_last = keep_last;
             o.async = async_save;
             o.direct_io = direct_io;
             o.timeout_s = timeout;
             if (!mesh.is_none())
               o.mesh_json = pyb::str(pyb::module_::import("json").attr("dumps")(mesh));
             o.cuda_stream = as_stream(stream);
             auto p = std::make_unique<PyCheckpointManager>();
             pyb::gil_scoped_release nogil;
             p->mgr = std::make_unique<CheckpointManager>(std::move(group), o);
             return p;
           }),
           pyb::arg("group"), pyb::arg("dir") = "", pyb::kw_only(), pyb::arg("keep_last") = 0,
           pyb::arg("async_save") = true, pyb::arg("timeout") = 0.0,
           pyb::arg("mesh") = pyb::none(), pyb::arg("direct_io") = true,
           pyb::arg("stream") = 0, pyb::arg("fresh_start") = FreshStart::kFromSetting,
           pyb::arg("file_mode") = 0u, pyb::arg("dir_mode") = 0u,
           pyb::arg("layout") = "",
           "dir '' means TUTTI_CKPT_DIR; keep_last <= 0 means TUTTI_CKPT_KEEP; "
           "timeout <= 0 means TUTTI_CKPT_TIMEOUT.  direct_io: shard data written "
           "with O_DIRECT (buffered where the file system has none).  fresh_start: "
           "a FreshStart (FROM_SETTING: TUTTI_CKPT_FRESH_START).  file_mode / "
           "dir_mode: permissions of what tutti creates, less the umask (0: "
           "TUTTI_CKPT_FILE_MODE 0600 / TUTTI_CKPT_DIR_MODE 0700).  layout: "
           "'once' (replicated tensors written once across the job; manifest "
           "version 3), 'per-rank' (every rank writes every tensor it holds; "
           "version 2, what older tutti reads) or '' (TUTTI_CKPT_LAYOUT, default "
           "once).  Collective.");
  def_manager_methods(checkpoint_manager);

  pyb::class_<PyCommitTiers> commit_tiers(
      m, "_CommitTiers",
      "tutti.torch.elastic's commits: the memory tier, and the checkpoint directory "
      "when one is set (include/tutti/commit_tiers.h).  The methods of CheckpointManager.");
  commit_tiers.def(pyb::init([](std::shared_ptr<ProcessGroup> group, std::string durable_dir,
                                int keep_last, bool async_save, int durable_every, int memory) {
                     elastic::CommitTierOptions o;
                     o.durable_dir = std::move(durable_dir);
                     o.keep_last = keep_last;
                     o.async = async_save;
                     o.durable_every = durable_every;
                     o.memory = memory;
                     auto p = std::make_unique<PyCommitTiers>();
                     pyb::gil_scoped_release nogil;
                     p->mgr = std::make_unique<elastic::CommitTiers>(std::move(group), o);
                     return p;
                   }),
                   pyb::arg("group"), pyb::arg("durable_dir") = "", pyb::kw_only(),
                   pyb::arg("keep_last") = 0, pyb::arg("async_save") = false,
                   pyb::arg("durable_every") = 0, pyb::arg("memory") = -1,
                   "Collective.  durable_every <= 0: TUTTI_COMMIT_DURABLE_EVERY; memory "
                   "-1: TUTTI_COMMIT_MEMORY.")
      .def_property_readonly("memory_tier", [](PyCommitTiers& self) {
        return self.get().memory_tier();
      })
      .def_property_readonly("durable_dir", [](PyCommitTiers& self) {
        return self.get().durable_dir();
      })
      .def("reopen", [](PyCommitTiers& self, std::shared_ptr<ProcessGroup> group) {
        elastic::CommitTiers& t = self.get();
        pyb::gil_scoped_release nogil;
        t.reopen(std::move(group));
      }, pyb::arg("group"),
         "Collective: the managers again over `group` (after tutti.recover()).")
      .def("finish", [](PyCommitTiers& self) {
        elastic::CommitTiers& t = self.get();
        pyb::gil_scoped_release nogil;
        t.finish();
      }, "Collective: the job is done; the memory tier's commits are removed.");
  def_manager_methods(commit_tiers);

  m.def("list_checkpoints", [](const std::string& dir) {
    std::vector<CheckpointInfo> all;
    {
      pyb::gil_scoped_release nogil;
      all = list_checkpoints(dir);
    }
    pyb::list out;
    for (const auto& i : all) out.append(info_dict(i));
    return out;
  }, pyb::arg("dir"), "Local: the checkpoint directories under `dir`, oldest first.");
  m.def("verify_checkpoint", [](const std::string& path) {
    pyb::gil_scoped_release nogil;
    return verify_checkpoint(path);
  }, pyb::arg("path"),
     "Local: '' when the checkpoint directory is valid (manifest, sizes, "
     "checksums), else the first problem.");
  m.def("_close_checkpoint_managers", [] {
    std::vector<PyManagerBase*> all;
    {
      std::lock_guard<std::mutex> lock(g_mu);
      all.assign(live().begin(), live().end());
    }
    for (auto* p : all) p->close();
  });
}

}  // namespace py
}  // namespace tutti
