// Views of tutti-owned memory (TensorView) and the Stateful protocol that
// every C++ component with checkpointed state shares: state_dict() (numpy
// copies), load_state_dict() and state_views() (zero-copy).
#include <pybind11/stl.h>

#include "bindings.h"
#include "convert.h"
#include "tutti/state.h"

namespace tutti {
namespace py {

void bind_state(pyb::module_& m) {
  pyb::class_<TensorView>(m, "TensorView",
                          "A tensor owned by tutti (a layer's weight, a loss "
                          "scaler's state), exported zero-copy through DLPack: "
                          "torch.from_dlpack(view), numpy.from_dlpack(view).")
      .def("__dlpack__",
           [](const TensorView& v, pyb::args, pyb::kwargs) {
             return export_tensor(v.tensor, v.owner);
           },
           "DLPack capsule over the same memory (keeps the owner alive).")
      .def("__dlpack_device__",
           [](const TensorView& v) {
             return v.tensor.is_cuda() ? pyb::make_tuple(2, v.tensor.device().index)
                                       : pyb::make_tuple(1, 0);
           })
      .def_property_readonly("shape", [](const TensorView& v) {
        return pyb::tuple(pyb::cast(v.tensor.shape().vec()));
      })
      .def_property_readonly("dtype", [](const TensorView& v) {
        return std::string(dtype_name(v.tensor.dtype()));
      })
      .def_property_readonly("device", [](const TensorView& v) {
        return v.tensor.device().str();
      })
      .def_property_readonly("numel", [](const TensorView& v) { return v.tensor.numel(); })
      .def_property_readonly("data_ptr", [](const TensorView& v) {
        return reinterpret_cast<uintptr_t>(v.tensor.data());
      }, "Address of the first element (zero-copy checks).")
      .def("numpy", [](const TensorView& v) { return to_numpy(v.tensor); },
           "A numpy COPY (bfloat16 becomes float32; CUDA memory is copied).")
      .def("__repr__", [](const TensorView& v) {
        return "<tutti.TensorView " + v.tensor.str() + ">";
      });

  pyb::class_<Stateful, std::shared_ptr<Stateful>>(
      m, "Stateful",
      "Base of tutti objects whose state checkpoints carry (loss scaler, "
      "compressors, tensor-parallel layers).")
      .def("state_dict", [](Stateful& s) { return state_to_numpy(s.state_dict()); },
           "The state as {name: numpy array}, COPIES (bfloat16 as float32).")
      .def("load_state_dict",
           [](std::shared_ptr<Stateful> s, pyb::handle values, bool strict) {
             load_state(s->state_dict(), values, strict,
                        pyb::str(pyb::type::handle_of(pyb::cast(s)).attr("__name__")));
             pyb::gil_scoped_release nogil;
             s->on_state_loaded();
           },
           pyb::arg("state_dict"), pyb::arg("strict") = true,
           "Writes a state_dict() (numpy, torch or lists) back and validates it.")
      .def("state_views",
           [](std::shared_ptr<Stateful> s) {
             return state_views(s->state_dict(), s);
           },
           "The state as {name: TensorView}, zero-copy views of the live memory.")
      .def("state_shards",
           [](Stateful& s) {
             pyb::dict out;
             for (const auto& nt : s.state_dict())
               out[pyb::str(nt.name)] = shard_to_dict(nt.shard);
             return out;
           },
           "How each state tensor is sharded: {name: {global_shape, dim, offset, group, flat}}.");
}

}  // namespace py
}  // namespace tutti
