/* Issue 30: what making one PyTorch output costs from C, two ways, in ns per output (CPU tensors; the CUDA
 * caching allocator adds the same at::empty work to both): torch.empty_like called through the C API (what
 * fastcall.c does) against DLPack's exchange allocator (managed_tensor_allocator, then
 * managed_tensor_to_py_object_no_sync: at::empty, toDLPack, fromDLPack), beside one dltensor_from_py_object read.
 *   build: cc -O2 -shared -fPIC -I$(python -c "import sysconfig;print(sysconfig.get_paths()['include'])") \
 *            bench/alloc_paths.c -o /tmp/_alloc_paths$(python -c "import sysconfig;print(sysconfig.get_config_var('EXT_SUFFIX'))")
 *   run:   PYTHONPATH=/tmp python bench/alloc_paths.py */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <time.h>
typedef struct { uint8_t code, bits; uint16_t lanes; } DLDataType;
typedef struct { int32_t device_type, device_id; } DLDevice;
typedef struct { void* data; DLDevice device; int32_t ndim; DLDataType dtype; int64_t* shape; int64_t* strides; uint64_t byte_offset; } DLTensor;
typedef struct { uint32_t major, minor; } DLPackVersion;
typedef struct DLMTV { DLPackVersion version; void* manager_ctx; void (*deleter)(struct DLMTV*); uint64_t flags; DLTensor dl_tensor; } DLMTV;
typedef struct hdr { uint32_t major, minor; struct hdr* prev; } hdr;
typedef struct {
  hdr header;
  int (*alloc)(DLTensor*, DLMTV**, void*, void (*)(void*, const char*, const char*));
  void* from_py;
  int (*to_py)(DLMTV*, void**);
  int (*dltensor_from_py)(void*, DLTensor*);
  void* stream;
} api_t;
static double now(void){ struct timespec t; clock_gettime(CLOCK_MONOTONIC,&t); return t.tv_sec*1e9+t.tv_nsec; }
static void seterr(void* c, const char* k, const char* m){ (void)c; PyErr_Format(PyExc_RuntimeError, "%s: %s", k, m); }
static PyObject* bench(PyObject* self, PyObject* args) {
  PyObject *x, *empty_like, *capsule; long n;
  if (!PyArg_ParseTuple(args, "OOOl", &x, &empty_like, &capsule, &n)) return NULL;
  api_t* api = PyCapsule_GetPointer(capsule, "dlpack_exchange_api");
  if (!api) return NULL;
  double t0 = now();
  for (long i = 0; i < n; i++) { PyObject* r = PyObject_CallFunctionObjArgs(empty_like, x, NULL); if (!r) return NULL; Py_DECREF(r); }
  double t1 = now();
  DLTensor proto; if (api->dltensor_from_py(x, &proto)) return NULL;
  int64_t shape[8]; for (int k=0;k<proto.ndim;k++) shape[k]=proto.shape[k];
  proto.shape = shape; proto.strides = NULL; proto.data = NULL;
  for (long i = 0; i < n; i++) {
    DLMTV* mt = NULL; if (api->alloc(&proto, &mt, NULL, seterr)) return NULL;
    void* o = NULL; if (api->to_py(mt, &o)) return NULL; Py_DECREF((PyObject*)o);
  }
  double t2 = now();
  for (long i = 0; i < n; i++) { DLTensor t; if (api->dltensor_from_py(x, &t)) return NULL; }
  double t3 = now();
  return Py_BuildValue("ddd", (t1-t0)/n, (t2-t1)/n, (t3-t2)/n);
}
static PyMethodDef M[] = {{"bench", bench, METH_VARARGS, ""}, {0}};
static struct PyModuleDef D = {PyModuleDef_HEAD_INIT, "_alloc_paths", 0, -1, M};
PyMODINIT_FUNC PyInit__alloc_paths(void){ return PyModule_Create(&D); }
