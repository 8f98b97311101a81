// cuplug's XLA FFI handler: one typed handler that calls any cuplug backend's op on XLA's buffers.
//
// Built by cuplug.frameworks.jax against the installed jaxlib's headers (jax.ffi.include_dir()),
// header-only and ABI-versioned by XLA (the XLA_FFI_Api version travels with each call). The
// backend is named by attributes: its cuplug_backend_call entry point and instance handle (as
// integers, set by the Python side from a live Backend), the op, and the op's own attributes
// (names and kinds as text, values as an int64 and a float64 array, in the op table's order).
// XLA owns every buffer: inputs are read, results written, on XLA's stream (CUDA) or at once (CPU).
#include <cstdint>
#include <cstring>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <unordered_map>
#include <string_view>
#include <vector>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

// cuplug/backend.h, restated: this file is compiled without cuplug's include directory.
struct Dtype {
  uint8_t code, bits;
  uint16_t lanes;
};
struct Tensor {
  void* data;
  int32_t device_type, device_id, ndim;
  Dtype dtype;
  const int64_t* shape;
  const int64_t* strides;
  uint64_t byte_offset;
};
struct Attr {
  const char* name;
  int32_t kind;
  union {
    int64_t i;
    double f;
  } value;
};
using CallFn = int (*)(void*, const char*, const Tensor*, int, Tensor*, int, const Attr*, int, uint64_t);
using LastErrorFn = int (*)(void*, char*, int);

// The instances compiled calls may still name: token -> handle. A compiled function keeps its attributes
// for its life; cuplug.jax registers a token when it makes the ops and forgets it just before the backend
// instance is destroyed, so a later call is an error instead of a use of freed memory. Calls hold the lock
// shared, forgetting holds it alone: an instance is never destroyed under a running call.
std::shared_mutex g_live_lock;
std::unordered_map<int64_t, int64_t> g_live;

bool dtype_of(ffi::DataType t, Dtype* out) {
  switch (t) {  // DLPack codes: 0 int, 1 uint, 2 float, 4 bfloat
    case ffi::DataType::F16: *out = {2, 16, 1}; return true;
    case ffi::DataType::BF16: *out = {4, 16, 1}; return true;
    case ffi::DataType::F32: *out = {2, 32, 1}; return true;
    case ffi::DataType::F64: *out = {2, 64, 1}; return true;
    case ffi::DataType::S8: *out = {0, 8, 1}; return true;
    case ffi::DataType::U8: *out = {1, 8, 1}; return true;
    case ffi::DataType::S32: *out = {0, 32, 1}; return true;
    case ffi::DataType::S64: *out = {0, 64, 1}; return true;
    default: return false;
  }
}

template <typename Buffer>
ffi::Error describe(const Buffer& b, int32_t device_type, Tensor* t, std::vector<std::vector<int64_t>>* shapes) {
  if (!dtype_of(b.element_type(), &t->dtype)) return ffi::Error::InvalidArgument("cuplug: a buffer of a dtype cuplug does not know");
  auto dims = b.dimensions();
  shapes->emplace_back(dims.begin(), dims.end());
  t->data = b.untyped_data();
  t->device_type = device_type;
  t->device_id = 0;  // the backend checks the pointer's device itself
  t->ndim = static_cast<int32_t>(dims.size());
  t->shape = shapes->back().data();
  t->strides = nullptr;  // XLA's default layout is row-major
  t->byte_offset = 0;
  return ffi::Error::Success();
}

ffi::Error call(uint64_t stream, int32_t device_type, ffi::RemainingArgs args, ffi::RemainingRets rets, int64_t fn,
                int64_t last_error, int64_t handle, int64_t token, std::string_view op, std::string_view attr_names,
                std::string_view attr_kinds, ffi::Span<const int64_t> attr_ints, ffi::Span<const double> attr_floats) {
  std::shared_lock<std::shared_mutex> live(g_live_lock);
  auto found = g_live.find(token);
  if (found == g_live.end() || found->second != handle)
    return ffi::Error(ffi::ErrorCode::kFailedPrecondition,
                      "cuplug: the backend these ops were made for is closed; register its ops again "
                      "(cuplug.jax.register) on an open backend and trace the function again");
  std::vector<std::vector<int64_t>> shapes;
  shapes.reserve(args.size() + rets.size());  // the descriptors point into these: no reallocation
  std::vector<Tensor> in(args.size()), out(rets.size());
  for (size_t i = 0; i < args.size(); ++i) {
    auto b = args.get<ffi::AnyBuffer>(i);
    if (b.has_error()) return b.error();
    if (auto e = describe(*b, device_type, &in[i], &shapes); e.failure()) return e;
  }
  for (size_t i = 0; i < rets.size(); ++i) {
    auto b = rets.get<ffi::AnyBuffer>(i);
    if (b.has_error()) return b.error();
    if (auto e = describe(**b, device_type, &out[i], &shapes); e.failure()) return e;
  }
  // "alpha,beta" and "ff": the op's attributes in its table's order, each value taken from its kind's array
  std::vector<std::string> names;
  for (size_t start = 0; start <= attr_names.size() && !attr_kinds.empty();) {
    size_t comma = attr_names.find(',', start);
    names.emplace_back(attr_names.substr(start, comma == std::string_view::npos ? std::string_view::npos : comma - start));
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  if (names.size() != attr_kinds.size()) return ffi::Error::InvalidArgument("cuplug: attribute names and kinds differ in count");
  std::vector<Attr> attrs(names.size());
  size_t ni = 0, nf = 0;
  for (size_t k = 0; k < names.size(); ++k) {
    attrs[k].name = names[k].c_str();
    if (attr_kinds[k] == 'i') {
      if (ni >= attr_ints.size()) return ffi::Error::InvalidArgument("cuplug: too few int64 attribute values");
      attrs[k].kind = 0, attrs[k].value.i = attr_ints[ni++];
    } else {
      if (nf >= attr_floats.size()) return ffi::Error::InvalidArgument("cuplug: too few float64 attribute values");
      attrs[k].kind = 1, attrs[k].value.f = attr_floats[nf++];
    }
  }
  std::string op_name(op);
  void* h = reinterpret_cast<void*>(static_cast<uintptr_t>(handle));
  int rc = reinterpret_cast<CallFn>(static_cast<uintptr_t>(fn))(h, op_name.c_str(), in.data(), (int)in.size(), out.data(),
                                                                (int)out.size(), attrs.data(), (int)attrs.size(), stream);
  if (rc == 0) return ffi::Error::Success();
  char text[1024] = "";
  if (last_error != 0) reinterpret_cast<LastErrorFn>(static_cast<uintptr_t>(last_error))(h, text, sizeof text);
  return ffi::Error(ffi::ErrorCode::kInternal, std::string("cuplug: ") + op_name + " (status " + std::to_string(rc) + "): " + text);
}

ffi::Error call_host(ffi::RemainingArgs args, ffi::RemainingRets rets, int64_t fn, int64_t last_error, int64_t handle,
                     int64_t token, std::string_view op, std::string_view names, std::string_view kinds,
                     ffi::Span<const int64_t> ints, ffi::Span<const double> floats) {
  return call(0, 1 /* CPU */, args, rets, fn, last_error, handle, token, op, names, kinds, ints, floats);
}

ffi::Error call_cuda(void* stream, ffi::RemainingArgs args, ffi::RemainingRets rets, int64_t fn, int64_t last_error,
                     int64_t handle, int64_t token, std::string_view op, std::string_view names,
                     std::string_view kinds, ffi::Span<const int64_t> ints, ffi::Span<const double> floats) {
  // XLA's stream; 0 would mean the instance's own to the backend, so the legacy stream (1) stands in for NULL
  uint64_t s = stream ? static_cast<uint64_t>(reinterpret_cast<uintptr_t>(stream)) : 1;
  return call(s, 2 /* CUDA */, args, rets, fn, last_error, handle, token, op, names, kinds, ints, floats);
}

}  // namespace

// handle != 0: the instance behind token is open; 0: it is about to be destroyed (waits for running calls).
extern "C" __attribute__((visibility("default"))) void cuplug_xla_track(int64_t token, int64_t handle) {
  std::unique_lock<std::shared_mutex> hold(g_live_lock);
  if (handle != 0)
    g_live[token] = handle;
  else
    g_live.erase(token);
}

#define CUPLUG_FFI_ATTRS                                                                                    \
  .Attr<int64_t>("fn").Attr<int64_t>("last_error").Attr<int64_t>("handle").Attr<int64_t>("token")      \
      .Attr<std::string_view>("op")                                                                     \
      .Attr<std::string_view>("attr_names").Attr<std::string_view>("attr_kinds")                       \
      .Attr<ffi::Span<const int64_t>>("attr_ints").Attr<ffi::Span<const double>>("attr_floats")

XLA_FFI_DEFINE_HANDLER_SYMBOL(cuplug_xla_call_host, call_host,
                              ffi::Ffi::Bind().RemainingArgs().RemainingRets() CUPLUG_FFI_ATTRS);
XLA_FFI_DEFINE_HANDLER_SYMBOL(cuplug_xla_call_cuda, call_cuda,
                              ffi::Ffi::Bind().Ctx<ffi::PlatformStream<void*>>().RemainingArgs().RemainingRets()
                                  CUPLUG_FFI_ATTRS);
