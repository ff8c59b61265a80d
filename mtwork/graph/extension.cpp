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
//
// An output's memory may be mtwork's instead of MLX's allocator's (`set_placer`): memory
// the emulator's worker process shares, which the kernel writes in place, with no copy.
// MLX gets it as an array's data whose deleter hands the block back (`freed`), by a
// token, under a mutex, from any thread, without Python. MLX holds memory it did not
// allocate in one of two ways (`adoption`): the CPU allocator's layout (a buffer's size
// in the 8 bytes before its data), checked on this MLX before it is relied on, else the
// allocator's `make_buffer` (Metal wraps page-aligned memory in a buffer without a
// copy); where neither holds, the output is MLX's memory.

#include <cstdint>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <tuple>
#include <utility>
#include <vector>

#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/tuple.h>
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
// mtwork's `place(call_id, nbytes)`: for each output, (address, capacity, token) of
// memory of its own, or (0, 0, 0) for MLX's.
nb::object* placer = nullptr;
std::mutex released_lock;
std::vector<int64_t> released_ids;
std::vector<int64_t> freed_tokens;

// How MLX's allocator can hold memory it did not allocate (see the top): the CPU
// allocator's layout, checked once; else `make_buffer`, asked for each block.
bool size_header_layout() {
  static const bool holds = [] {
    // A buffer of MLX's own (its cache may give one larger than asked): the data follows
    // a size_t, and the allocator reads the buffer's size there.
    auto probe = mx::allocator::malloc(64);
    auto buffer = probe.buffer();
    auto* start = static_cast<char*>(buffer.ptr());
    if (start == nullptr || buffer.raw_ptr() != start + sizeof(size_t)) return false;
    auto* size = reinterpret_cast<size_t*>(start);
    size_t was = *size;
    *size = was + 4096;
    bool reads_it = mx::allocator::allocator().size(buffer) == was + 4096;
    *size = was;
    return reads_it;
  }();
  return holds;
}

nb::tuple describe(const mx::array& a) {
  nb::list shape, strides;
  for (auto d : a.shape()) shape.append(d);
  for (auto s : a.strides()) strides.append(s);
  auto address = a.size() ? reinterpret_cast<uintptr_t>(a.data<char>()) : uintptr_t(0);
  return nb::make_tuple(address, nb::tuple(shape), nb::tuple(strides), a.dtype());
}

// Whether every input is computed already (made from data, or waited for): then no
// earlier work need be waited for, which spares a call a round trip through the
// stream's thread.
bool all_ready(const std::vector<mx::array>& inputs) {
  for (auto& in : inputs) {
    if (in.status() != mx::array::Status::available) return false;
  }
  return true;
}

void note_freed(int64_t token) {
  std::lock_guard<std::mutex> hold(released_lock);
  freed_tokens.push_back(token);
}

// `out`'s data as mtwork's memory at `address` (page-aligned, `capacity` bytes, with
// writable bytes before it); false when MLX cannot hold it (the output is then MLX's).
bool adopt(mx::array& out, uintptr_t address, size_t capacity, int64_t token) {
  auto* data = reinterpret_cast<char*>(address);
  if (size_header_layout()) {
    // The allocator reads an array's buffer size there (donation checks).
    *reinterpret_cast<size_t*>(data - sizeof(size_t)) = out.nbytes();
    mx::allocator::Buffer buffer(data - sizeof(size_t));
    out.set_data(mx::allocator::Data(buffer, [token](mx::allocator::Buffer) {
      note_freed(token);
    }));
    return true;
  }
  auto buffer = mx::allocator::make_buffer(data, capacity);
  if (buffer.ptr() == nullptr) {
    return false;
  }
  out.set_data(mx::allocator::Data(buffer, [token](mx::allocator::Buffer b) {
    mx::allocator::release(b);
    note_freed(token);
  }));
  return true;
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
    if (!all_ready(inputs)) {
      mx::synchronize(stream());
    }
    if (runner == nullptr) {
      throw std::runtime_error("[mtwork] no runner: import mtwork.graph to evaluate");
    }
    nb::gil_scoped_acquire gil;
    place(outputs);
    nb::list ins, outs;
    for (auto& in : inputs) ins.append(describe(in));
    for (auto& out : outputs) outs.append(describe(out));
    (*runner)(id_, ins, outs);  // a Python exception leaves as itself (nb::python_error)
  }

  void eval_gpu(const std::vector<mx::array>& inputs,
                std::vector<mx::array>& outputs) override {
    eval_cpu(inputs, outputs);  // unified memory: the CPU writes what the GPU reads
  }

  // Each output's memory: mtwork's where `placer` gives some MLX can hold, else MLX's.
  void place(std::vector<mx::array>& outputs) {
    using Placed = std::tuple<uintptr_t, size_t, int64_t>;
    std::vector<Placed> placed(outputs.size(), Placed{0, 0, 0});
    if (placer != nullptr) {
      nb::list sizes;
      for (auto& out : outputs) sizes.append(out.nbytes());
      placed = nb::cast<std::vector<Placed>>((*placer)(id_, sizes));
      if (placed.size() != outputs.size()) {
        throw std::runtime_error("[mtwork] the placer gave a wrong number of outputs");
      }
    }
    for (size_t i = 0; i < outputs.size(); ++i) {
      auto [address, capacity, token] = placed[i];
      if (address == 0 || !adopt(outputs[i], address, capacity, token)) {
        if (address != 0) note_freed(token);  // not used: mtwork takes it back
        outputs[i].set_data(mx::allocator::malloc(outputs[i].nbytes()));
      }
    }
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
  m.def("set_placer", [](nb::object f) { placer = new nb::object(std::move(f)); });
  // The operation runs on `stream` (a CPU stream), else on the CPU's default stream.
  m.def("apply",
        [](int64_t id, std::vector<mx::array> inputs,
           std::vector<std::vector<int>> shapes, std::vector<mx::Dtype> dtypes,
           std::optional<mx::Stream> stream) {
          std::vector<mx::Shape> out_shapes;
          for (auto& s : shapes) out_shapes.emplace_back(s.begin(), s.end());
          auto on = stream.value_or(mx::default_stream(mx::Device::cpu));
          if (on.device.type != mx::Device::cpu) {
            throw std::invalid_argument("[mtwork] operations run on a CPU stream");
          }
          auto op = std::make_shared<KernelCall>(on, id);
          return mx::array::make_arrays(std::move(out_shapes), dtypes, op, inputs);
        },
        nb::arg("id"), nb::arg("inputs"), nb::arg("shapes"), nb::arg("dtypes"),
        nb::arg("stream") = nb::none());
  m.def("released", []() {
    std::lock_guard<std::mutex> hold(released_lock);
    std::vector<int64_t> ids;
    ids.swap(released_ids);
    return ids;
  });
  // The tokens of placed memory MLX has let go of (or did not take).
  m.def("freed", []() {
    std::lock_guard<std::mutex> hold(released_lock);
    std::vector<int64_t> tokens;
    tokens.swap(freed_tokens);
    return tokens;
  });
  // How MLX holds placed memory here: "size_header", or "make_buffer" (asked per block).
  m.def("adoption", []() { return size_header_layout() ? "size_header" : "make_buffer"; });
  m.def("is_tracer", [](const mx::array& a) { return a.is_tracer(); });
}
