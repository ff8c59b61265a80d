// mtwork's kernels as operations of MLX's graph: one MLX `Primitive` whose evaluation
// hands the dispatch to mtwork (Python), built against the installed MLX's headers and
// library as MLX's documentation builds an extension (nanobind, MLX's domain, so that
// `mx.array` objects cross as MLX's own arrays).
//
// A call makes the outputs of one primitive node; nothing runs until MLX evaluates them
// (`mx.eval`, a conversion to numpy, `mx.compile`'s replay, `mx.async_eval`). The node
// names the call by an id that mtwork keeps a record for; the record goes when the last
// node of the call goes (`released`), which may happen on any thread: the destructor only
// notes the id, under a mutex, and never touches Python.
//
// Evaluation runs on the thread that evaluates (MLX calls `eval_cpu` there) and does
// the kernel's work at once: `mx.eval` keeps the GIL while it waits, so work queued on
// MLX's stream thread could never take the GIL to run mtwork. The streams' earlier work,
// which computes the inputs, is waited for first. (`mx.async_eval` therefore returns
// once these kernels have run.)

#include <cstdint>
#include <mutex>
#include <stdexcept>
#include <vector>

#include <nanobind/nanobind.h>
#include <nanobind/stl/vector.h>

#include "mlx/allocator.h"
#include "mlx/array.h"
#include "mlx/device.h"
#include "mlx/primitives.h"
#include "mlx/stream.h"

namespace nb = nanobind;
namespace mx = mlx::core;

namespace {

// mtwork's `run(call_id, inputs, outputs)`: set once and never freed (a static object's
// destructor would run after the interpreter is gone).
nb::object* runner = nullptr;
std::mutex released_lock;
std::vector<int64_t> released_ids;

nb::tuple describe(const mx::array& a) {
  nb::list shape, strides;
  for (auto d : a.shape()) shape.append(d);
  for (auto s : a.strides()) strides.append(s);
  auto address = a.size() ? reinterpret_cast<uintptr_t>(a.data<char>()) : uintptr_t(0);
  return nb::make_tuple(address, nb::tuple(shape), nb::tuple(strides), a.dtype());
}

class KernelCall : public mx::Primitive {
 public:
  KernelCall(mx::Stream stream, int64_t id) : mx::Primitive(stream), id_(id) {}

  ~KernelCall() override {
    std::lock_guard<std::mutex> hold(released_lock);
    released_ids.push_back(id_);
  }

  void eval_cpu(const std::vector<mx::array>& inputs,
                std::vector<mx::array>& outputs) override {
    // The inputs are computed by work queued before this one. Inputs made on the GPU
    // (a Mac) reach this stream through a fence that the GPU's command buffer signals
    // when it is committed, which MLX does after this returns: commit it first.
    if (mx::is_available(mx::Device::gpu)) {
      mx::synchronize(mx::default_stream(mx::Device::gpu));
    }
    mx::synchronize(stream());
    for (auto& out : outputs) {
      out.set_data(mx::allocator::malloc(out.nbytes()));
    }
    if (runner == nullptr) {
      throw std::runtime_error("[mtwork] no runner: import mtwork.graph to evaluate");
    }
    nb::gil_scoped_acquire gil;
    nb::list ins, outs;
    for (auto& in : inputs) ins.append(describe(in));
    for (auto& out : outputs) outs.append(describe(out));
    (*runner)(id_, ins, outs);  // a Python exception leaves as itself (nb::python_error)
  }

  void eval_gpu(const std::vector<mx::array>& inputs,
                std::vector<mx::array>& outputs) override {
    eval_cpu(inputs, outputs);  // unified memory: the CPU writes what the GPU reads
  }

  // MLX's custom kernels call their primitive so: errors of transformations read alike.
  const char* name() const override {
    return "CustomKernel";
  }

 private:
  int64_t id_;
};

}  // namespace

NB_MODULE(_mtwork_graph, m) {
  m.def("set_runner", [](nb::object f) { runner = new nb::object(std::move(f)); });
  m.def("apply",
        [](int64_t id, std::vector<mx::array> inputs,
           std::vector<std::vector<int>> shapes, std::vector<mx::Dtype> dtypes) {
          std::vector<mx::Shape> out_shapes;
          for (auto& s : shapes) out_shapes.emplace_back(s.begin(), s.end());
          auto op = std::make_shared<KernelCall>(mx::default_stream(mx::Device::cpu), id);
          return mx::array::make_arrays(std::move(out_shapes), dtypes, op, inputs);
        });
  m.def("released", []() {
    std::lock_guard<std::mutex> hold(released_lock);
    std::vector<int64_t> ids;
    ids.swap(released_ids);
    return ids;
  });
  m.def("is_tracer", [](const mx::array& a) { return a.is_tracer(); });
}
