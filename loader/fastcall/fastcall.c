/*
 * cuplug.runtime._fastcall: Backend.run's prepared call, in C.
 *
 * Backend.run (runtime/api.py) is the whole path: it imports and checks every operand, words every
 * error and prepares a call (runtime/plan.py) per (op, operand specs, attributes given). This module
 * repeats such a prepared call for the operands whose accessors it can read without running anyone's
 * Python: exact torch.Tensor / torch.nn.Parameter, exact numpy.ndarray, and cuplug's own resident
 * Tensor. Every check that can change between two calls with one key is made again here, on every
 * call (span, contiguity, layout, lazy views, read-only and requires-grad outputs, overlap, a freed
 * or closed tensor, a closed or forked instance); anything this module does not accept, or any doubt
 * (an unknown kind, a key never learned, a busy lock, a failing accessor), goes to Backend.run, which
 * raises the error this module never words. So the fast path accepts a subset of what the whole path
 * accepts, and gives the same results for it (tests/test_fastcall.py checks both).
 *
 * A call is learned after Backend.run has made it once: `learn()` reads the operands again with this
 * module's readers, checks that they say what the whole path's plan says, and keeps a FastPlan (the
 * C descriptors' templates, the attribute slots, how to allocate outputs) under a 64-bit key hash.
 *
 * The Limited API of CPython 3.11 (abi3): one build serves every CPython >= 3.11; elsewhere (PyPy, a
 * free-threaded build, 3.10) the module is not imported and Backend.run serves alone.
 */
#ifndef Py_LIMITED_API
#define Py_LIMITED_API 0x030B0000
#endif
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "cuplug/backend.h"

#define MAX_OPERANDS 16   /* inputs, and outputs, of one fast call: more go through Backend.run */
#define MAX_ATTRS 16      /* attributes of one op a fast call may carry */
#define MAX_NDIM 32       /* CUPLUG_MAX_NDIM */
#define MAX_DTYPES 32
#define MAX_PLANS 512     /* per Backend; the table starts over when full, as Backend._plans does */
#define ADDRESS_END (1ULL << 56) /* no user address at or past it (runtime/operands.py ADDRESS_END) */
#define NO_STREAM UINT64_MAX     /* "no launch stream chosen": the instance's */

typedef int (*call_fn)(void*, const char*, const cuplug_tensor*, int, cuplug_tensor*, int, const cuplug_attr*,
                       int, uint64_t);

enum kind { K_NONE = 0, K_TORCH = 1, K_NDARRAY = 2, K_RESIDENT = 3, K_CUPY = 4 };

/* ---- what Python teaches the module once (dtypes, the frameworks' types): process-wide ---- */

static struct {
    int n;
    uint8_t code[MAX_DTYPES], bits[MAX_DTYPES];
    int itemsize[MAX_DTYPES];
    PyObject* objs[MAX_DTYPES]; /* cuplug's DType objects, row i of contract.dtypes.TABLE */
} dtypes;

static PyObject* formats;          /* dict: buffer format str -> dtype row (int) */
static PyObject* ndarray_type;     /* numpy.ndarray, once NumPy is imported by anyone */
static PyObject* torch_types[2];   /* torch.Tensor, torch.nn.Parameter */
static PyObject* torch_strided;    /* torch.strided */
static PyObject* torch_dtype_objs[MAX_DTYPES];
static int torch_dtype_rows[MAX_DTYPES];
static int n_torch_dtypes;
static PyObject* torch_raw_stream; /* torch._C._cuda_getCurrentRawStream */
static PyObject* torch_mode_on;    /* torch._C._is_torch_function_mode_enabled: a mode runs code in the accessors */
/* PyTorch's own accessors, from its C base class (operands.TorchReader): never an instance's attribute */
enum { G_LAYOUT, G_IS_NESTED, G_DTYPE, G_REQUIRES_GRAD, G_IS_CUDA, G_IS_CPU, G_SHAPE, N_GETSETS };
enum { M_IS_NEG, M_IS_CONTIGUOUS, M_GET_DEVICE, M_DATA_PTR, N_METHODS };
static PyObject* torch_getsets[N_GETSETS];
static PyObject* torch_methods[N_METHODS];
static descrgetfunc getset_get; /* tp_descr_get of PyTorch's getset descriptors */
static PyObject* resident_type;    /* cuplug.runtime.api.Tensor */
static PyObject* cupy_type;        /* cupy.ndarray, once CuPy is imported by anyone */
static PyObject* cupy_stream_now;  /* cupy.cuda.get_current_stream */

/* DLPack's C exchange API (dlpack.h >= 1.2, DLPackExchangeAPI), as PyTorch offers it on torch.Tensor's type
 * (__dlpack_c_exchange_api__): one C call fills a non-owning DLTensor of a tensor (pointer, device, dtype,
 * shape, strides) and one gives the framework's current stream, with no Python object made and no Python code
 * run (no __torch_function__: PyTorch's own C++). The accessors below stay for what DLPack does not say (layout,
 * the negative bit, requires-grad) and serve alone where a PyTorch has no such table. The structs are DLPack's,
 * field for field (cuplug_tensor is its DLTensor). */
typedef struct dlpack_api_header {
    uint32_t major, minor;
    struct dlpack_api_header* prev_api;
} dlpack_api_header;
typedef struct {
    dlpack_api_header header;
    void* managed_tensor_allocator;
    void* managed_tensor_from_py_object_no_sync;
    void* managed_tensor_to_py_object_no_sync;
    int (*dltensor_from_py_object_no_sync)(void* py_object, cuplug_tensor* out);
    int (*current_work_stream)(int device_type, int32_t device_id, void** out_stream);
} dlpack_exchange_api;
static const dlpack_exchange_api* torch_exchange; /* NULL: read through the accessors alone */
static PyObject* torch_exchange_owner;            /* the capsule the table came from, held */
static int dl_rows[256][65];                       /* (DLPack type code, bits) -> dtype row + 1 (0: none) */

static PyObject *s_backend, *s_life, *s_fast, *s_out, *s_stream,
    *s_acquire, *s_release, *s_closed, *s_handle, *s_forked_from, *s_check, *s_item, *s_lock, *s_data, *s_ptr,
    *s_device_id, *s_shape, *s_strides, *s_dtype, *s_char;

/* ---- one operand as read ---- */

typedef struct {
    int kind, dt, dev_type, dev_id, ndim, has_view;
    int64_t shape[MAX_NDIM];
    uint64_t addr, nbytes;
    PyObject* obj; /* borrowed: the caller's arguments hold it */
    Py_buffer view;
} operand;

static PyObject* attr(PyObject* obj, PyObject* name) { return PyObject_GetAttr(obj, name); }


static PyObject* tget(int i, PyObject* x) { return getset_get(torch_getsets[i], x, (PyObject*)Py_TYPE(x)); }
static PyObject* tcall(int i, PyObject* x) { return PyObject_CallFunctionObjArgs(torch_methods[i], x, NULL); }

static int tget_is(int i, PyObject* x, PyObject* want) {
    PyObject* r = tget(i, x);
    int ok = r == want;
    Py_XDECREF(r);
    return ok;
}

static int tcall_is(int i, PyObject* x, PyObject* want) {
    PyObject* r = tcall(i, x);
    int ok = r == want;
    Py_XDECREF(r);
    return ok;
}

/* nbytes = itemsize * prod(shape), refused (0) past ADDRESS_END, as operands.byte_size refuses it. */
static int byte_size(operand* o) {
    uint64_t n = (uint64_t)dtypes.itemsize[o->dt];
    for (int i = 0; i < o->ndim; i++) {
        uint64_t d = (uint64_t)o->shape[i];
        if (d && n > (ADDRESS_END - 1) / d) return 0;
        n *= d;
    }
    if (n >= ADDRESS_END) return 0;
    o->nbytes = n;
    return 1;
}

/* Whether any of n operands is of this kind (K_CUPY, K_RESIDENT). */
static int has_kind(const operand* ops, int n, int kind) {
    for (int i = 0; i < n; i++)
        if (ops[i].kind == kind) return 1;
    return 0;
}

/* operands.check_span: the bytes inside the user address space, never NULL when there are any. */
static int span_ok(const operand* o) {
    if (o->addr >= ADDRESS_END || o->addr + o->nbytes > ADDRESS_END) return 0;
    return !(o->addr == 0 && o->nbytes);
}

static int shape_from_tuple(PyObject* t, operand* o) {
    Py_ssize_t n = PyTuple_Size(t);
    if (n < 0 || n > MAX_NDIM) return 0;
    o->ndim = (int)n;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject* d = PyTuple_GetItem(t, i);
        if (!d || !PyLong_CheckExact(d)) return 0;
        long long v = PyLong_AsLongLong(d);
        if (v < 0) return 0; /* (and -1 with an error) */
        o->shape[i] = v;
    }
    return 1;
}

/* operands.from_torch, for exact torch.Tensor / Parameter: 1 when every check passes. PyTorch's accessors are
 * its C base class's (set_torch): no instance attribute answers, and no Python code of anyone's runs. */
/* What no DLTensor says, asked of PyTorch's accessors by both readers: a strided layout, no lazily negated view
 * (torch._neg_view, of any dtype), and for an output, no requires-grad. */
static int torch_flags_ok(PyObject* x, int writable) {
    PyObject* v = tget(G_LAYOUT, x);
    int strided = v && v == torch_strided;
    Py_XDECREF(v);
    return strided && tcall_is(M_IS_NEG, x, Py_False) && (!writable || tget_is(G_REQUIRES_GRAD, x, Py_False));
}

static int read_torch(PyObject* x, int writable, operand* o) {
    o->kind = K_TORCH;
    if (!torch_flags_ok(x, writable) || !tget_is(G_IS_NESTED, x, Py_False)) goto fail;
    PyObject* v = tget(G_DTYPE, x);
    o->dt = -1;
    for (int i = 0; v && i < n_torch_dtypes; i++)
        if (torch_dtype_objs[i] == v) o->dt = torch_dtype_rows[i];
    Py_XDECREF(v);
    /* (The conjugate bit needs no look: no dtype here is complex, and the conjugate of a real number is itself:
     * PyTorch's conj() of a real tensor returns the tensor unflagged.) */
    if (o->dt < 0 || !tcall_is(M_IS_CONTIGUOUS, x, Py_True)) goto fail;
    v = tget(G_IS_CUDA, x);
    if (v == Py_True) {
        Py_DECREF(v);
        PyObject* idx = tcall(M_GET_DEVICE, x);
        long long i = idx && PyLong_CheckExact(idx) ? PyLong_AsLongLong(idx) : -1;
        Py_XDECREF(idx);
        if (i < 0 || i >= (1LL << 31)) goto fail;
        o->dev_type = CUPLUG_DEVICE_CUDA, o->dev_id = (int)i;
    } else {
        Py_XDECREF(v);
        if (v != Py_False || !tget_is(G_IS_CPU, x, Py_True)) goto fail;
        o->dev_type = CUPLUG_DEVICE_CPU, o->dev_id = 0;
    }
    v = tget(G_SHAPE, x);
    int shaped = v && PyTuple_Check(v) && shape_from_tuple(v, o);
    Py_XDECREF(v);
    if (!shaped || !byte_size(o)) goto fail;
    v = tcall(M_DATA_PTR, x);
    if (!v || !PyLong_CheckExact(v)) {
        Py_XDECREF(v);
        goto fail;
    }
    o->addr = PyLong_AsUnsignedLongLong(v);
    Py_DECREF(v);
    if (PyErr_Occurred() || !span_ok(o)) goto fail;
    return 1;
fail:
    PyErr_Clear();
    return 0;
}

/* C-contiguous as PyTorch's is_contiguous() says it: extents of 1 may have any stride, and an empty tensor is. */
static int dl_contiguous(const cuplug_tensor* t) {
    if (!t->strides) return 1;
    int64_t want = 1;
    for (int i = t->ndim - 1; i >= 0; i--) {
        if (t->shape[i] == 0) return 1;
        if (t->shape[i] != 1 && t->strides[i] != want) return 0;
        want *= t->shape[i];
    }
    return 1;
}

/* `writable` of an output the dispatcher has just made with torch.empty / torch.empty_like (the makers the whole
 * path used): strided, no negative bit, no grad by construction, so read through DLPack's exchange table the three
 * accessors that say so are not asked (read_torch, without the table, still asks them). */
#define MADE_HERE 2

/* read_torch through DLPack's exchange table: the DLTensor gives pointer, device, dtype, shape and strides in one
 * C call (a sparse or nested tensor has no strides or sizes: it fails, and the whole path words why); the
 * accessors add the layout, the negative bit and (for an output) requires-grad. */
static int read_torch_exchange(PyObject* x, int writable, operand* o) {
    o->kind = K_TORCH;
    cuplug_tensor t;
    memset(&t, 0, sizeof t);
    if (torch_exchange->dltensor_from_py_object_no_sync(x, &t) != 0) goto fail;
    if (t.ndim < 0 || t.ndim > MAX_NDIM || t.byte_offset != 0 || t.dtype.lanes != 1 || (t.ndim && !t.shape)) goto fail;
    o->dt = dl_rows[t.dtype.code & 0xff][t.dtype.bits <= 64 ? t.dtype.bits : 0] - 1;
    if (o->dt < 0 || !dl_contiguous(&t)) goto fail;
    if (t.device_type == CUPLUG_DEVICE_CUDA && t.device_id >= 0)
        o->dev_type = CUPLUG_DEVICE_CUDA, o->dev_id = t.device_id;
    else if (t.device_type == CUPLUG_DEVICE_CPU)
        o->dev_type = CUPLUG_DEVICE_CPU, o->dev_id = 0;
    else
        goto fail;
    o->ndim = t.ndim;
    for (int i = 0; i < t.ndim; i++) {
        if (t.shape[i] < 0) goto fail;
        o->shape[i] = t.shape[i];
    }
    if (!byte_size(o)) goto fail;
    o->addr = (uint64_t)(uintptr_t)t.data;
    if (!span_ok(o) || (writable != MADE_HERE && !torch_flags_ok(x, writable))) goto fail;
    return 1;
fail:
    PyErr_Clear();
    return 0;
}

/* operands.from_memoryview, for exact numpy.ndarray: the export itself gives the pointer. */
static int read_ndarray(PyObject* x, int writable, operand* o) {
    o->kind = K_NDARRAY;
    int flags = PyBUF_FORMAT | PyBUF_STRIDES | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(x, &o->view, flags) != 0) {
        PyErr_Clear();
        return 0;
    }
    o->has_view = 1;
    Py_buffer* b = &o->view;
    if (!b->format || b->ndim < 0 || b->ndim > MAX_NDIM || !PyBuffer_IsContiguous(b, 'C')) return 0;
    if (writable && b->readonly) return 0;
    PyObject* row = PyDict_GetItemString(formats, b->format); /* borrowed; no error raised */
    if (!row) return 0;
    o->dt = (int)PyLong_AsLong(row);
    if (o->dt < 0 || o->dt >= dtypes.n || dtypes.itemsize[o->dt] != b->itemsize) return 0;
    o->ndim = b->ndim;
    for (int i = 0; i < b->ndim; i++) {
        if (!b->shape || b->shape[i] < 0) return 0;
        o->shape[i] = b->shape[i];
    }
    if (!byte_size(o) || o->nbytes != (uint64_t)b->len) return 0;
    o->dev_type = CUPLUG_DEVICE_CPU, o->dev_id = 0;
    o->addr = o->nbytes ? (uint64_t)(uintptr_t)b->buf : 0; /* an empty export's pointer is never read */
    return span_ok(o);
}

/* operands.from_cai for exact cupy.ndarray, without the interface's dict: its MemoryPointer's address and device,
 * its shape, and its dtype's character (NumPy's, the buffer format's for every dtype the table has); C-contiguous
 * by its byte strides (a dimension of size 1 may have any stride, as CuPy's flags say). CuPy has no read-only
 * arrays. Anything else (a view with gaps, a dtype the table lacks) goes to the whole path. */
static int read_cupy(PyObject* x, operand* o) {
    o->kind = K_CUPY;
    int ok = 0;
    PyObject *mp = NULL, *ptr = NULL, *dev = NULL, *shape = NULL, *strides = NULL, *dtype = NULL, *ch = NULL;
    /* each attribute only while no error is set: the first that fails ends the read */
    if (!(mp = attr(x, s_data)) || !(ptr = attr(mp, s_ptr)) || !(dev = attr(mp, s_device_id)) ||
        !(shape = attr(x, s_shape)) || !(strides = attr(x, s_strides)) || !(dtype = attr(x, s_dtype)) ||
        !(ch = attr(dtype, s_char)))
        goto done;
    if (!PyLong_CheckExact(ptr) || !PyLong_CheckExact(dev) || !PyUnicode_CheckExact(ch) ||
        !PyTuple_CheckExact(strides))
        goto done;
    PyObject* row = PyDict_GetItemWithError(formats, ch); /* borrowed */
    if (!row) goto done;
    o->dt = (int)PyLong_AsLong(row);
    if (o->dt < 0 || o->dt >= dtypes.n || !shape_from_tuple(shape, o) || PyTuple_Size(strides) != o->ndim) goto done;
    long long expect = dtypes.itemsize[o->dt];
    int empty = 0; /* CuPy's strides of an array with an extent 0 skip that extent ((3, 0) float32: (4, 4)) */
    for (int i = 0; i < o->ndim; i++) empty |= o->shape[i] == 0;
    for (int i = o->ndim - 1; i >= 0 && !empty; i--) { /* C-contiguous as dl_contiguous says it */
        long long stride = PyLong_AsLongLong(PyTuple_GetItem(strides, i));
        if (PyErr_Occurred() || (o->shape[i] != 1 && stride != expect)) goto done;
        expect *= o->shape[i];
    }
    if (!byte_size(o)) goto done;
    o->dev_type = CUPLUG_DEVICE_CUDA;
    o->dev_id = (int)PyLong_AsLong(dev);
    unsigned long long addr = PyLong_AsUnsignedLongLong(ptr);
    if (PyErr_Occurred() || o->dev_id < 0) goto done;
    o->addr = o->nbytes ? (uint64_t)addr : 0; /* an empty array's pointer is never read */
    ok = span_ok(o);
done:
    Py_XDECREF(mp), Py_XDECREF(ptr), Py_XDECREF(dev), Py_XDECREF(shape), Py_XDECREF(strides), Py_XDECREF(dtype);
    Py_XDECREF(ch);
    if (!ok) PyErr_Clear();
    return ok;
}

/* A resident tensor's memory still lives: its `_life` list (shared with its finalizer) says None. */
static int resident_alive(PyObject* x) {
    PyObject* life = attr(x, s_life);
    int alive = life && PyList_CheckExact(life) && PyList_Size(life) == 1 && PyList_GetItem(life, 0) == Py_None;
    Py_XDECREF(life);
    if (!alive) PyErr_Clear();
    return alive;
}

/* Tensor._arg: a live resident tensor of this backend, described once by Python (`_fast`). */
static int read_resident(PyObject* x, PyObject* backend, operand* o) {
    o->kind = K_RESIDENT;
    PyObject* b = attr(x, s_backend);
    int mine = b && b == backend;
    Py_XDECREF(b);
    if (!mine || !resident_alive(x)) goto fail;
    PyObject* f = attr(x, s_fast); /* (addr, dtype row, device type, device id, shape) */
    int ok = f && PyTuple_CheckExact(f) && PyTuple_Size(f) == 5;
    if (ok) {
        o->addr = PyLong_AsUnsignedLongLong(PyTuple_GetItem(f, 0));
        o->dt = (int)PyLong_AsLong(PyTuple_GetItem(f, 1));
        o->dev_type = (int)PyLong_AsLong(PyTuple_GetItem(f, 2));
        o->dev_id = (int)PyLong_AsLong(PyTuple_GetItem(f, 3));
        ok = !PyErr_Occurred() && o->dt >= 0 && o->dt < dtypes.n && shape_from_tuple(PyTuple_GetItem(f, 4), o) &&
             byte_size(o) && span_ok(o);
    }
    Py_XDECREF(f);
    if (ok) return 1;
fail:
    PyErr_Clear();
    return 0;
}

static int read_operand(PyObject* x, int writable, PyObject* backend, operand* o) {
    memset(o, 0, offsetof(operand, view));
    o->obj = x;
    PyObject* t = (PyObject*)Py_TYPE(x);
    if (t == ndarray_type && ndarray_type) return read_ndarray(x, writable, o);
    if ((t == torch_types[0] || t == torch_types[1]) && t)
        return torch_exchange ? read_torch_exchange(x, writable, o) : read_torch(x, writable, o);
    if (t == resident_type && resident_type) return read_resident(x, backend, o);
    if (t == cupy_type && cupy_type) return read_cupy(x, o);
    return 0;
}

static void release_operands(operand* ops, int n) {
    for (int i = 0; i < n; i++)
        if (ops[i].has_view) {
            PyBuffer_Release(&ops[i].view);
            ops[i].has_view = 0;
        }
}

/* ---- FastPlan: one learned call ---- */

typedef struct {
    PyObject* name;      /* str, as the caller spells it */
    int slot;            /* in the attribute template */
    int is_float, sized; /* a sized attribute keys the plan by value: it must equal the template's */
} given_attr;

typedef struct {
    PyObject_HEAD
    uint64_t key;
    PyObject* op;        /* str */
    PyObject* op_bytes;  /* bytes: what C receives */
    int n_in, n_out, out_given, elementwise, n_attrs, n_given;
    operand spec[2 * MAX_OPERANDS]; /* kind, dtype, device, shape of each input then output (no addresses) */
    cuplug_tensor tmpl[2 * MAX_OPERANDS];
    int64_t shapes[2 * MAX_OPERANDS][MAX_NDIM];
    cuplug_attr attrs[MAX_ATTRS];
    PyObject* attr_names; /* bytes objects the template's names point into */
    given_attr given[MAX_ATTRS];
    PyObject* makers;     /* tuple of (callable, args, kwargs) per output, or None (out= given) */
    int scalar[MAX_OPERANDS]; /* the output is returned as a Python number (.item()) */
} FastPlan;

static PyTypeObject* FastPlan_Type;

static void FastPlan_dealloc(PyObject* self) {
    FastPlan* p = (FastPlan*)self;
    Py_XDECREF(p->op);
    Py_XDECREF(p->op_bytes);
    Py_XDECREF(p->attr_names);
    Py_XDECREF(p->makers);
    for (int i = 0; i < p->n_given; i++) Py_XDECREF(p->given[i].name);
    PyTypeObject* tp = Py_TYPE(self);
    freefunc free = (freefunc)PyType_GetSlot(tp, Py_tp_free);
    free(self);
    Py_DECREF(tp);
}

static PyType_Slot FastPlan_slots[] = {
    {Py_tp_dealloc, FastPlan_dealloc},
    {Py_tp_doc, "A call learned by Dispatcher.learn (opaque)."},
    {0, NULL},
};
static PyType_Spec FastPlan_spec = {"cuplug.runtime._fastcall.FastPlan", sizeof(FastPlan), 0, Py_TPFLAGS_DEFAULT,
                                    FastPlan_slots};

/* FNV-1a over the key's words: the op, each operand's kind/dtype/device/shape, the attributes given. */
static uint64_t mix(uint64_t h, uint64_t v) {
    for (int i = 0; i < 8; i++) {
        h ^= (v >> (8 * i)) & 0xff;
        h *= 1099511628211ULL;
    }
    return h;
}

static uint64_t operand_key(uint64_t h, const operand* o) {
    h = mix(h, (uint64_t)o->kind | (uint64_t)o->dt << 8 | (uint64_t)o->dev_type << 16 | (uint64_t)o->ndim << 24);
    h = mix(h, (uint64_t)o->dev_id);
    for (int i = 0; i < o->ndim; i++) h = mix(h, (uint64_t)o->shape[i]);
    return h;
}

/* What the whole path's plan says of an operand (no kind: an allocated output's is its maker's). */
static int spec_agrees(const operand* read, const operand* said) {
    return read->dt == said->dt && read->dev_type == said->dev_type && read->dev_id == said->dev_id &&
           read->ndim == said->ndim && memcmp(read->shape, said->shape, sizeof(int64_t) * read->ndim) == 0;
}

static int same_spec(const operand* a, const operand* b) { return a->kind == b->kind && spec_agrees(a, b); }

/* ---- the call's attributes, as Attr.value_of's fast cases convert them ---- */

typedef struct {
    PyObject* name; /* borrowed from kwargs */
    PyObject* value;
} kwattr;

static int attr_value(PyObject* v, int is_float, cuplug_attr* out) {
    if (is_float) {
        if (PyFloat_CheckExact(v)) out->value.f = PyFloat_AsDouble(v);
        else if (PyLong_CheckExact(v)) {
            out->value.f = PyLong_AsDouble(v); /* float(v); OverflowError for a huge int */
            if (PyErr_Occurred()) {
                PyErr_Clear();
                return 0;
            }
        } else
            return 0;
        return 1;
    }
    if (!PyLong_CheckExact(v)) return 0;
    int overflow = 0;
    long long i = PyLong_AsLongLongAndOverflow(v, &overflow);
    if (overflow || (i == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        return 0;
    }
    out->value.i = i;
    return 1;
}

static uint64_t attrs_key(uint64_t h, const kwattr* kw, int n) {
    for (int i = 0; i < n; i++) h = mix(h, (uint64_t)PyObject_Hash(kw[i].name));
    return h;
}

/* ---- the Dispatcher: Backend.run's fast path for one Backend ---- */

typedef struct {
    PyObject_HEAD
    PyObject* backend_ref; /* weakref: a Backend holds its Dispatcher, never the reverse */
    PyObject* slow;        /* Backend.run, unbound: the whole path */
    PyObject* core;        /* runtime.api._Core: lock, handle, closed, forked_from */
    call_fn call;
    int cuda, device_index;
    PyObject* plans; /* dict: key (int) -> FastPlan */
    unsigned long long fast_calls, slow_calls;
} Dispatcher;

static PyTypeObject* Dispatcher_Type;

static PyObject* go_slow(Dispatcher* d, PyObject* args, PyObject* kwargs) {
    d->slow_calls++;
    PyObject* backend = PyWeakref_GetObject(d->backend_ref); /* borrowed */
    if (!backend) return NULL;
    if (backend == Py_None) {
        PyErr_SetString(PyExc_ReferenceError, "this Backend is gone");
        return NULL;
    }
    Py_ssize_t n = PyTuple_Size(args);
    PyObject* full = PyTuple_New(n + 1);
    if (!full) return NULL;
    Py_INCREF(backend);
    PyTuple_SetItem(full, 0, backend);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject* a = PyTuple_GetItem(args, i);
        Py_INCREF(a);
        PyTuple_SetItem(full, i + 1, a);
    }
    PyObject* r = PyObject_Call(d->slow, full, kwargs);
    Py_DECREF(full);
    return r;
}

typedef struct {
    PyObject* op;
    Py_ssize_t n_in, n_out;
    PyObject* out;     /* borrowed, or NULL */
    PyObject* stream;  /* borrowed, or NULL */
    kwattr kw[MAX_ATTRS];
    int n_kw;
    PyObject* outs[MAX_OPERANDS]; /* the out= objects, held by out (or out_list for a list, a snapshot) */
    PyObject* out_list;           /* owned: a tuple of an out= list's items, taken before anything is read */
    operand ops[2 * MAX_OPERANDS];
    uint64_t launch; /* NO_STREAM: the instance's */
    uint64_t key;
} call_state;

/* Splits a call into op, operands, out=, stream= and attributes; 0 when it is none the fast path takes. */
static int parse_call(PyObject* args, PyObject* kwargs, call_state* c) {
    c->out_list = NULL;
    Py_ssize_t n = PyTuple_Size(args);
    if (n < 1 || n - 1 > MAX_OPERANDS) return 0;
    c->op = PyTuple_GetItem(args, 0);
    if (!PyUnicode_CheckExact(c->op)) return 0;
    c->n_in = n - 1;
    c->out = c->stream = NULL;
    c->n_kw = 0;
    if (kwargs) {
        Py_ssize_t pos = 0;
        PyObject *k, *v;
        while (PyDict_Next(kwargs, &pos, &k, &v)) {
            if (!PyUnicode_CheckExact(k)) return 0;
            if (PyUnicode_Compare(k, s_out) == 0) c->out = v == Py_None ? NULL : v;
            else if (PyUnicode_Compare(k, s_stream) == 0) c->stream = v == Py_None ? NULL : v;
            else {
                if (c->n_kw == MAX_ATTRS) return 0;
                c->kw[c->n_kw].name = k, c->kw[c->n_kw].value = v;
                c->n_kw++;
            }
        }
    }
    c->n_out = 0;
    if (c->out) {
        if (PyTuple_CheckExact(c->out) || PyList_CheckExact(c->out)) {
            /* a list's items are held by a tuple of our own: code that ran while an operand is read could not
             * empty the list under us (the whole path takes list(out) first too) */
            PyObject* items = PyTuple_CheckExact(c->out) ? c->out : (c->out_list = PySequence_Tuple(c->out));
            if (!items) {
                PyErr_Clear();
                return 0;
            }
            c->n_out = PyTuple_Size(items);
            if (c->n_out < 1 || c->n_out > MAX_OPERANDS) return 0;
            for (Py_ssize_t i = 0; i < c->n_out; i++) c->outs[i] = PyTuple_GetItem(items, i);
        } else {
            c->n_out = 1;
            c->outs[0] = c->out;
        }
    }
    if (c->stream) { /* an integer handle: as stream_handle() takes it; other stream objects: the whole path */
        if (!PyLong_CheckExact(c->stream)) return 0;
        unsigned long long h = PyLong_AsUnsignedLongLong(c->stream);
        if (PyErr_Occurred() || h >= ADDRESS_END) {
            PyErr_Clear();
            return 0;
        }
        c->launch = h;
    } else
        c->launch = NO_STREAM;
    return 1;
}

/* Reads every operand (0: one the fast path does not take; the views read so far are released). */
static int read_operands(Dispatcher* d, call_state* c, PyObject* args) {
    PyObject* backend = PyWeakref_GetObject(d->backend_ref);
    if (!backend || backend == Py_None) {
        PyErr_Clear();
        return 0;
    }
    if (torch_mode_on) { /* a TorchFunctionMode would answer PyTorch's accessors with its own code: the whole path */
        int torch_seen = 0;
        for (Py_ssize_t k = 0; k < c->n_in && !torch_seen; k++) {
            PyObject* t = (PyObject*)Py_TYPE(PyTuple_GetItem(args, k + 1));
            torch_seen = t == torch_types[0] || t == torch_types[1];
        }
        for (int k = 0; k < c->n_out && !torch_seen; k++) {
            PyObject* t = (PyObject*)Py_TYPE(c->outs[k]);
            torch_seen = t == torch_types[0] || t == torch_types[1];
        }
        if (torch_seen) {
            PyObject* on = PyObject_CallNoArgs(torch_mode_on);
            int off = on == Py_False;
            Py_XDECREF(on);
            if (!off) {
                PyErr_Clear();
                return 0;
            }
        }
    }
    int i = 0;
    for (; i < c->n_in; i++)
        if (!read_operand(PyTuple_GetItem(args, i + 1), 0, backend, &c->ops[i])) goto fail;
    for (int j = 0; j < c->n_out; j++, i++)
        if (!read_operand(c->outs[j], 1, backend, &c->ops[i])) goto fail;
    return 1;
fail:
    release_operands(c->ops, i + 1);
    return 0;
}

/* CuPy's current stream (cupy.cuda.get_current_stream().ptr), as streams.framework_stream reads it. */
static int cupy_launch(call_state* c) {
    PyObject* stream = cupy_stream_now ? PyObject_CallNoArgs(cupy_stream_now) : NULL;
    PyObject* ptr = stream ? attr(stream, s_ptr) : NULL;
    int ok = ptr && PyLong_CheckExact(ptr);
    unsigned long long h = ok ? PyLong_AsUnsignedLongLong(ptr) : 0;
    Py_XDECREF(stream), Py_XDECREF(ptr);
    if (!ok || PyErr_Occurred() || h >= ADDRESS_END) {
        PyErr_Clear();
        return 0;
    }
    c->launch = h;
    return 1;
}

/* Backend._framework_launch: the current stream of the first PyTorch CUDA tensor or CuPy array among the operands.
 * A CuPy array is taken only when the launch is on CuPy's current stream, the stream its work is ordered on: with
 * stream= or a PyTorch tensor first, the whole path imports it by DLPack, whose handshake makes the launch stream
 * wait for CuPy's (0: the whole path). */
static int framework_launch(Dispatcher* d, call_state* c) {
    int cupy = has_kind(c->ops, (int)(c->n_in + c->n_out), K_CUPY);
    if (c->launch != NO_STREAM || !d->cuda) return !cupy;
    for (int i = 0; i < c->n_in + c->n_out; i++) {
        if (c->ops[i].kind == K_CUPY) return cupy_launch(c);
        if (c->ops[i].kind == K_TORCH && c->ops[i].dev_type == CUPLUG_DEVICE_CUDA) {
            if (cupy) return 0; /* CuPy's after a PyTorch tensor: the whole path's handshake orders them */
            if (torch_exchange) { /* PyTorch's current stream of the device, from C++ */
                void* stream = NULL;
                if (torch_exchange->current_work_stream(CUPLUG_DEVICE_CUDA, d->device_index, &stream) != 0 ||
                    (uint64_t)(uintptr_t)stream >= ADDRESS_END) {
                    PyErr_Clear();
                    return 0;
                }
                c->launch = (uint64_t)(uintptr_t)stream;
                return 1;
            }
            if (!torch_raw_stream) return 0;
            PyObject* idx = PyLong_FromLong(d->device_index);
            PyObject* s = idx ? PyObject_CallFunctionObjArgs(torch_raw_stream, idx, NULL) : NULL;
            Py_XDECREF(idx);
            int ok = s && PyLong_CheckExact(s);
            unsigned long long h = ok ? PyLong_AsUnsignedLongLong(s) : 0;
            Py_XDECREF(s);
            if (!ok || PyErr_Occurred() || h >= ADDRESS_END) {
                PyErr_Clear();
                return 0;
            }
            c->launch = h;
            return 1;
        }
    }
    return 1;
}

static uint64_t call_key(call_state* c, PyObject* op_hash_src) {
    uint64_t h = mix(1469598103934665603ULL, (uint64_t)PyObject_Hash(op_hash_src));
    h = mix(h, (uint64_t)c->n_in | (uint64_t)c->n_out << 16);
    for (int i = 0; i < c->n_in + c->n_out; i++) h = operand_key(h, &c->ops[i]);
    return attrs_key(h, c->kw, c->n_kw);
}

/* The learned plan of this call, its attributes written into `attrs` (NULL: none). */
static FastPlan* find_plan(Dispatcher* d, call_state* c, cuplug_attr* attrs) {
    c->key = call_key(c, c->op);
    PyObject* k = PyLong_FromUnsignedLongLong(c->key);
    if (!k) return NULL;
    PyObject* found = PyDict_GetItemWithError(d->plans, k);
    Py_DECREF(k);
    if (!found) return NULL;
    FastPlan* p = (FastPlan*)found;
    if (p->n_in != c->n_in || p->n_out != (c->out ? c->n_out : p->n_out) || p->out_given != (c->out != NULL) ||
        p->n_given != c->n_kw || PyUnicode_Compare(p->op, c->op) != 0)
        return NULL;
    for (int i = 0; i < c->n_in + (c->out ? c->n_out : 0); i++)
        if (!same_spec(&p->spec[i], &c->ops[i])) return NULL;
    memcpy(attrs, p->attrs, sizeof(cuplug_attr) * p->n_attrs);
    for (int i = 0; i < c->n_kw; i++) {
        given_attr* g = &p->given[i];
        if (PyUnicode_Compare(g->name, c->kw[i].name) != 0) return NULL;
        cuplug_attr v;
        if (!attr_value(c->kw[i].value, g->is_float, &v)) return NULL;
        if (g->sized && (g->is_float ? v.value.f != p->attrs[g->slot].value.f : v.value.i != p->attrs[g->slot].value.i))
            return NULL;
        attrs[g->slot].value = v.value;
    }
    if (PyErr_Occurred()) PyErr_Clear();
    return p;
}

/* _refuse_overlap: 1 when no out= array shares memory with an input or another output (but the exact
 * in-place write of an elementwise op). */
static int no_overlap(FastPlan* p, call_state* c) {
    for (int k = 0; k < c->n_out; k++) {
        operand* o = &c->ops[c->n_in + k];
        uint64_t lo = o->addr, hi = o->addr + o->nbytes;
        if (lo == hi) continue;
        for (int j = 0; j < c->n_in + c->n_out; j++) {
            operand* a = &c->ops[j];
            if (j == c->n_in + k || !a->nbytes || a->addr >= hi || lo >= a->addr + a->nbytes) continue;
            if (j < c->n_in && p->elementwise && a->addr == lo && a->nbytes == o->nbytes && a->dt == o->dt &&
                a->ndim == o->ndim && memcmp(a->shape, o->shape, sizeof(int64_t) * a->ndim) == 0)
                continue;
            return 0;
        }
    }
    return 1;
}

/* Outputs from the caller's allocator (the makers Python taught), read as operands. */
static int make_outputs(Dispatcher* d, FastPlan* p, call_state* c, PyObject** made) {
    PyObject* backend = PyWeakref_GetObject(d->backend_ref);
    for (int j = 0; j < p->n_out; j++) made[j] = NULL;
    for (int j = 0; j < p->n_out; j++) {
        PyObject* m = PyTuple_GetItem(p->makers, j);
        PyObject* args = PyTuple_GetItem(m, 1);
        if (PyLong_CheckExact(args)) { /* (torch.empty_like, k, None): made like input k, a PyTorch tensor */
            long k = PyLong_AsLong(args);
            if (k < 0 || k >= c->n_in || c->ops[k].kind != K_TORCH) {
                PyErr_Clear();
                return 0;
            }
            made[j] = PyObject_CallFunctionObjArgs(PyTuple_GetItem(m, 0), c->ops[k].obj, NULL);
        } else
            made[j] = PyObject_Call(PyTuple_GetItem(m, 0), args, PyTuple_GetItem(m, 2));
        if (!made[j]) { /* the allocator's own error (out of memory): raised as it is. But cupy.empty allocates
                         * on CuPy's current device, which need not be the plan's: the whole path, allocating on
                         * the input's device, says what is true there (an Exception only: never a Ctrl-C) */
            if (!has_kind(p->spec, p->n_in, K_CUPY) || !PyErr_ExceptionMatches(PyExc_Exception)) return -1;
            PyErr_Clear();
            return 0;
        }
        operand* o = &c->ops[c->n_in + j];
        if (!read_operand(made[j], MADE_HERE, backend, o) || !spec_agrees(o, &p->spec[c->n_in + j])) {
            release_operands(o, 1);
            return 0;
        }
        c->n_out = j + 1;
    }
    return 1;
}

static void drop_made(PyObject** made, int n) {
    for (int j = 0; j < n; j++) Py_XDECREF(made[j]);
}

/* Whether the instance can take a call now (Backend._live_handle): open, not forked, each resident tensor still
 * live; its handle, or NULL. Reads attributes of slotted or plain objects only: no Python code runs. */
static void* live_handle(Dispatcher* d, call_state* c, int n_ops) {
    PyObject* closed = attr(d->core, s_closed);
    PyObject* handle = attr(d->core, s_handle);
    PyObject* forked = attr(d->core, s_forked_from);
    int ok = closed == Py_False && handle && PyLong_CheckExact(handle) && forked == Py_None;
    void* h = ok ? PyLong_AsVoidPtr(handle) : NULL;
    Py_XDECREF(closed);
    Py_XDECREF(handle);
    Py_XDECREF(forked);
    for (int i = 0; h && i < n_ops; i++)
        if (c->ops[i].kind == K_RESIDENT && !resident_alive(c->ops[i].obj)) h = NULL;
    if (!h) PyErr_Clear();
    return h;
}

/* A call that holds the GIL from the check above through its end needs no lock: close(), free() and a fork
 * change the state above under the GIL before they touch the C instance, and the backend serializes its own
 * calls (backend.h). Device work is a launch (microseconds); host work is, up to this many bytes. Larger host
 * calls release the GIL, and then take the instance's lock, as Backend.run does. */
#define HOLD_GIL_HOST_BYTES (256u << 10)

static int needs_lock(call_state* c, int n_ops) {
    uint64_t host = 0;
    for (int i = 0; i < n_ops; i++)
        if (c->ops[i].dev_type != CUPLUG_DEVICE_CUDA) host += c->ops[i].nbytes;
    return host > HOLD_GIL_HOST_BYTES;
}

/* The backend's failure, worded by Backend._check (the instance's last error, read under the GIL). */
static void raise_failure(Dispatcher* d, FastPlan* p, int rc) {
    PyObject* backend = PyWeakref_GetObject(d->backend_ref);
    PyObject* code = PyLong_FromLong(rc);
    PyObject* r = code && backend && backend != Py_None ? PyObject_CallMethodObjArgs(backend, s_check, code, p->op, NULL)
                                                        : NULL;
    Py_XDECREF(code);
    Py_XDECREF(r);
    if (!PyErr_Occurred())
        PyErr_Format(PyExc_RuntimeError, "cuplug: %U failed with status %d and raised nothing", p->op, rc);
}

/* The call itself. 1: done; 0: not here (the whole path then); -1: the backend failed, the exception is set. */
static int call_now(Dispatcher* d, FastPlan* p, call_state* c, cuplug_attr* attrs) {
    int n_ops = (int)(c->n_in + c->n_out), locked = needs_lock(c, n_ops);
    PyObject* lock = NULL;
    if (locked) { /* taken without waiting: a busy lock sends the call to the whole path, which waits */
        lock = attr(d->core, s_lock);
        PyObject* got = lock ? PyObject_CallMethodObjArgs(lock, s_acquire, Py_False, NULL) : NULL;
        int ok = got == Py_True;
        Py_XDECREF(got);
        if (!ok) {
            PyErr_Clear();
            Py_XDECREF(lock);
            return 0;
        }
    }
    int state = 0;
    void* h = live_handle(d, c, n_ops);
    if (h) {
        cuplug_tensor t[2 * MAX_OPERANDS];
        memcpy(t, p->tmpl, sizeof(cuplug_tensor) * n_ops);
        for (int i = 0; i < n_ops; i++) t[i].data = (void*)(uintptr_t)c->ops[i].addr;
        const char* op = PyBytes_AsString(p->op_bytes);
        /* 0 = the instance's stream; a framework's stream 0 is cudaStreamLegacy (1) to the C side */
        uint64_t stream = c->launch == NO_STREAM ? 0 : (c->launch == 0 ? 1 : c->launch);
        int n_in = (int)c->n_in, n_out = (int)c->n_out, n_attrs = p->n_attrs, rc;
        call_fn fn = d->call;
        if (locked) {
            Py_BEGIN_ALLOW_THREADS
            rc = fn(h, op, t, n_in, t + n_in, n_out, attrs, n_attrs, stream);
            Py_END_ALLOW_THREADS
        } else
            rc = fn(h, op, t, n_in, t + n_in, n_out, attrs, n_attrs, stream);
        state = 1;
        if (rc) {
            raise_failure(d, p, rc);
            state = -1;
        }
    }
    if (locked) {
        PyObject *et = NULL, *ev = NULL, *tb = NULL;
        if (state < 0) PyErr_Fetch(&et, &ev, &tb);
        PyObject* rel = PyObject_CallMethodObjArgs(lock, s_release, NULL);
        Py_DECREF(lock);
        if (state < 0) {
            Py_XDECREF(rel);
            PyErr_Restore(et, ev, tb);
        } else if (!rel)
            return -1;
        else
            Py_DECREF(rel);
    }
    return state;
}

/* What run() returns for out=: the out array, or a tuple of them. */
static PyObject* given_outputs(call_state* c) {
    if (c->n_out == 1) {
        Py_INCREF(c->outs[0]);
        return c->outs[0];
    }
    PyObject* items = c->out_list ? c->out_list : c->out; /* a list's snapshot: what was written */
    Py_INCREF(items);
    return items;
}

/* Allocated outputs: .item() of a scalar one (a host call's Python number), one or a tuple of them. */
static PyObject* made_outputs(FastPlan* p, PyObject** made, int n) {
    for (int j = 0; j < n; j++)
        if (p->scalar[j]) {
            PyObject* v = PyObject_CallMethodObjArgs(made[j], s_item, NULL);
            if (!v) {
                drop_made(made, n);
                return NULL;
            }
            Py_DECREF(made[j]);
            made[j] = v;
        }
    if (n == 1) return made[0];
    PyObject* r = PyTuple_New(n);
    if (!r) {
        drop_made(made, n);
        return NULL;
    }
    for (int j = 0; j < n; j++) PyTuple_SetItem(r, j, made[j]);
    return r;
}

static PyObject* dispatch(Dispatcher* d, call_state* c, PyObject* args, PyObject* kwargs);

static PyObject* Dispatcher_call(PyObject* self, PyObject* args, PyObject* kwargs) {
    call_state c;
    PyObject* r = dispatch((Dispatcher*)self, &c, args, kwargs);
    Py_XDECREF(c.out_list);
    return r;
}

static PyObject* dispatch(Dispatcher* d, call_state* cs, PyObject* args, PyObject* kwargs) {
#define c (*cs)
    if (!parse_call(args, kwargs, &c) || !read_operands(d, &c, args)) return go_slow(d, args, kwargs);
    int n_read = (int)(c.n_in + c.n_out);
    cuplug_attr attrs[MAX_ATTRS];
    FastPlan* p = NULL;
    int resident = has_kind(c.ops, n_read, K_RESIDENT);
    if (!framework_launch(d, &c) || !(p = find_plan(d, &c, attrs)) || (resident && c.launch != NO_STREAM) ||
        (c.out && !no_overlap(p, &c))) {
        PyErr_Clear();
        release_operands(c.ops, n_read);
        return go_slow(d, args, kwargs);
    }
    Py_INCREF((PyObject*)p); /* a learn() on another thread may start the table over while the GIL is released */
    PyObject* made[MAX_OPERANDS];
    int n_made = 0;
    if (!c.out) {
        n_made = p->n_out;
        int r = make_outputs(d, p, &c, made);
        if (r <= 0) {
            release_operands(c.ops, (int)(c.n_in + c.n_out));
            drop_made(made, n_made);
            Py_DECREF((PyObject*)p);
            return r < 0 ? NULL : go_slow(d, args, kwargs);
        }
    }
    int state = call_now(d, p, &c, attrs);
    release_operands(c.ops, (int)(c.n_in + c.n_out));
    if (state <= 0) {
        drop_made(made, n_made);
        Py_DECREF((PyObject*)p);
        return state < 0 ? NULL : go_slow(d, args, kwargs);
    }
    d->fast_calls++;
    PyObject* result = c.out ? given_outputs(&c) : made_outputs(p, made, n_made);
    Py_DECREF((PyObject*)p);
    return result;
#undef c
}

/* ---- learn: a call Backend.run has just made, kept for the fast path ---- */

static int spec_from_py(PyObject* row, operand* o) { /* (dtype row, device type, device id, shape) */
    if (!PyTuple_CheckExact(row) || PyTuple_Size(row) != 4) return 0;
    o->dt = (int)PyLong_AsLong(PyTuple_GetItem(row, 0));
    o->dev_type = (int)PyLong_AsLong(PyTuple_GetItem(row, 1));
    o->dev_id = (int)PyLong_AsLong(PyTuple_GetItem(row, 2));
    PyObject* shape = PyTuple_GetItem(row, 3);
    if (PyErr_Occurred() || o->dt < 0 || o->dt >= dtypes.n || !shape || !PyTuple_CheckExact(shape)) return 0;
    return shape_from_tuple(shape, o);
}

static PyObject* learn_fail(call_state* c, int n, FastPlan* p) {
    release_operands(c->ops, n);
    Py_CLEAR(c->out_list);
    Py_XDECREF((PyObject*)p);
    if (PyErr_Occurred()) return NULL;
    Py_RETURN_FALSE;
}

/* learn(args, kwargs, facts): facts = (op bytes, elementwise, input specs, output specs, attribute rows,
 * given attributes, makers or None, scalar flags); see runtime/fastpath.py. True when kept. */
static PyObject* learn(Dispatcher* d, call_state* cs, PyObject* a);

static PyObject* Dispatcher_learn(PyObject* self, PyObject* a) {
    call_state c;
    c.out_list = NULL;
    PyObject* r = learn((Dispatcher*)self, &c, a);
    Py_CLEAR(c.out_list);
    return r;
}

static PyObject* learn(Dispatcher* d, call_state* cs, PyObject* a) {
#define c (*cs)
    PyObject *args, *kwargs, *facts;
    if (!PyArg_ParseTuple(a, "O!OO!", &PyTuple_Type, &args, &kwargs, &PyTuple_Type, &facts)) return NULL;
    if (kwargs == Py_None) kwargs = NULL;
    else if (!PyDict_Check(kwargs)) {
        PyErr_SetString(PyExc_TypeError, "learn: kwargs must be a dict or None");
        return NULL;
    }
    PyObject *op_bytes, *elementwise, *in_specs, *out_specs, *attr_rows, *given, *makers, *scalars;
    if (!PyArg_ParseTuple(facts, "O!OO!O!O!O!OO!", &PyBytes_Type, &op_bytes, &elementwise, &PyTuple_Type, &in_specs,
                          &PyTuple_Type, &out_specs, &PyTuple_Type, &attr_rows, &PyTuple_Type, &given, &makers,
                          &PyTuple_Type, &scalars))
        return NULL;
    if (!parse_call(args, kwargs, &c)) Py_RETURN_FALSE;
    Py_ssize_t name_len = 0;
    const char* name = PyUnicode_AsUTF8AndSize(c.op, &name_len);  /* the facts are of this very op */
    if (!name || name_len != PyBytes_Size(op_bytes) || memcmp(name, PyBytes_AsString(op_bytes), (size_t)name_len)) {
        PyErr_Clear();
        Py_RETURN_FALSE;
    }
    if (!read_operands(d, &c, args)) Py_RETURN_FALSE;
    int n_read = (int)(c.n_in + c.n_out);
    if (!framework_launch(d, &c)) return learn_fail(&c, n_read, NULL);
    for (int i = 0; i < n_read; i++) /* a resident operand on a caller's stream: the whole path orders it */
        if (c.ops[i].kind == K_RESIDENT && c.launch != NO_STREAM) return learn_fail(&c, n_read, NULL);
    cuplug_attr known[MAX_ATTRS];
    if (find_plan(d, &c, known)) { /* already kept (Backend.run called directly) */
        release_operands(c.ops, n_read);
        Py_RETURN_TRUE;
    }
    PyErr_Clear();
    Py_ssize_t n_out = PyTuple_Size(out_specs);
    if (PyTuple_Size(in_specs) != c.n_in || n_out < 1 || n_out > MAX_OPERANDS ||
        (c.out && n_out != c.n_out) || (!c.out && (makers == Py_None || !PyTuple_CheckExact(makers) ||
                                                   PyTuple_Size(makers) != n_out)) ||
        PyTuple_Size(scalars) != n_out || PyTuple_Size(attr_rows) > MAX_ATTRS || PyTuple_Size(given) != c.n_kw) {
        PyErr_Clear();
        return learn_fail(&c, n_read, NULL);
    }
    FastPlan* p = PyObject_New(FastPlan, FastPlan_Type);
    if (!p) return learn_fail(&c, n_read, NULL);
    memset((char*)p + offsetof(FastPlan, key), 0, sizeof(FastPlan) - offsetof(FastPlan, key));
    p->op = c.op, Py_INCREF(c.op);
    p->op_bytes = op_bytes, Py_INCREF(op_bytes);
    p->n_in = (int)c.n_in, p->n_out = (int)n_out, p->out_given = c.out != NULL;
    p->elementwise = PyObject_IsTrue(elementwise) == 1;
    for (int i = 0; i < c.n_in + n_out; i++) {
        operand said;
        PyObject* row = i < c.n_in ? PyTuple_GetItem(in_specs, i) : PyTuple_GetItem(out_specs, i - c.n_in);
        if (!spec_from_py(row, &said)) return learn_fail(&c, n_read, p);
        if (i < n_read) { /* what this module reads must be what the whole path's plan says */
            if (!spec_agrees(&c.ops[i], &said)) return learn_fail(&c, n_read, p);
            p->spec[i] = c.ops[i];
            p->spec[i].has_view = 0, p->spec[i].obj = NULL, p->spec[i].addr = 0;
        } else /* an allocated output: its kind is what its maker gives (checked at each call) */
            p->spec[i] = said, p->spec[i].kind = K_NONE;
        cuplug_tensor* t = &p->tmpl[i];
        t->device_type = said.dev_type, t->device_id = said.dev_id, t->ndim = said.ndim;
        t->dtype.code = dtypes.code[said.dt], t->dtype.bits = dtypes.bits[said.dt], t->dtype.lanes = 1;
        memcpy(p->shapes[i], said.shape, sizeof(int64_t) * said.ndim);
        t->shape = p->shapes[i];
        t->strides = NULL, t->byte_offset = 0;
        p->scalar[i < c.n_in ? 0 : i - c.n_in] |= i >= c.n_in && PyObject_IsTrue(PyTuple_GetItem(scalars, i - c.n_in)) == 1;
    }
    p->n_attrs = (int)PyTuple_Size(attr_rows);
    p->attr_names = PyTuple_New(p->n_attrs);
    if (!p->attr_names) return learn_fail(&c, n_read, p);
    for (int i = 0; i < p->n_attrs; i++) { /* (name bytes, is_float, value) */
        PyObject* row = PyTuple_GetItem(attr_rows, i);
        PyObject *name, *value;
        int is_float;
        if (!PyTuple_CheckExact(row) || !PyArg_ParseTuple(row, "O!pO", &PyBytes_Type, &name, &is_float, &value))
            return learn_fail(&c, n_read, p);
        Py_INCREF(name);
        PyTuple_SetItem(p->attr_names, i, name);
        p->attrs[i].name = PyBytes_AsString(name);
        p->attrs[i].kind = is_float ? CUPLUG_ATTR_FLOAT64 : CUPLUG_ATTR_INT64;
        if (is_float) p->attrs[i].value.f = PyFloat_AsDouble(value);
        else p->attrs[i].value.i = PyLong_AsLongLong(value);
        if (PyErr_Occurred()) return learn_fail(&c, n_read, p);
    }
    for (int i = 0; i < c.n_kw; i++) { /* (name str, slot, is_float, sized), in the call's order */
        PyObject* row = PyTuple_GetItem(given, i);
        PyObject* name;
        given_attr* g = &p->given[i];
        if (!PyTuple_CheckExact(row) || !PyArg_ParseTuple(row, "O!ipp", &PyUnicode_Type, &name, &g->slot, &g->is_float,
                                                          &g->sized))
            return learn_fail(&c, n_read, p);
        g->name = name, Py_INCREF(name);
        p->n_given = i + 1;
        cuplug_attr v;
        if (g->slot < 0 || g->slot >= p->n_attrs || PyUnicode_Compare(name, c.kw[i].name) != 0 ||
            !attr_value(c.kw[i].value, g->is_float, &v) || (g->is_float != (p->attrs[g->slot].kind == CUPLUG_ATTR_FLOAT64)))
            return learn_fail(&c, n_read, p);
    }
    if (!c.out) p->makers = makers, Py_INCREF(makers);
    p->key = call_key(&c, c.op);
    release_operands(c.ops, n_read);
    if (PyDict_Size(d->plans) >= MAX_PLANS) PyDict_Clear(d->plans);
    PyObject* k = PyLong_FromUnsignedLongLong(p->key);
    int rc = k ? PyDict_SetItem(d->plans, k, (PyObject*)p) : -1;
    Py_XDECREF(k);
    Py_DECREF((PyObject*)p);
    if (rc < 0) return NULL;
    Py_RETURN_TRUE;
#undef c
}

static PyObject* Dispatcher_stats(PyObject* self, PyObject* unused) {
    (void)unused;
    Dispatcher* d = (Dispatcher*)self;
    return Py_BuildValue("{sKsKsn}", "fast_calls", d->fast_calls, "slow_calls", d->slow_calls, "plans",
                         PyDict_Size(d->plans));
}

static PyObject* Dispatcher_forget(PyObject* self, PyObject* unused) {
    (void)unused;
    PyDict_Clear(((Dispatcher*)self)->plans);
    Py_RETURN_NONE;
}

/* Dispatcher(backend, slow, core, call_address, cuda, device_index) */
static PyObject* Dispatcher_new(PyTypeObject* type, PyObject* args, PyObject* kwargs) {
    PyObject *backend, *slow, *core;
    unsigned long long call_address;
    int cuda, device_index;
    if (kwargs && PyDict_Size(kwargs)) {
        PyErr_SetString(PyExc_TypeError, "Dispatcher takes positional arguments only");
        return NULL;
    }
    if (!PyArg_ParseTuple(args, "OOOKpi", &backend, &slow, &core, &call_address, &cuda, &device_index)) return NULL;
    if (!call_address || !PyCallable_Check(slow)) {
        PyErr_SetString(PyExc_ValueError, "Dispatcher: no call entry point, or a slow path that is not callable");
        return NULL;
    }
    allocfunc alloc = (allocfunc)PyType_GetSlot(type, Py_tp_alloc);
    Dispatcher* d = (Dispatcher*)alloc(type, 0);
    if (!d) return NULL;
    d->backend_ref = PyWeakref_NewRef(backend, NULL);
    d->plans = PyDict_New();
    if (!d->backend_ref || !d->plans) {
        Py_DECREF(d);
        return NULL;
    }
    d->slow = slow, Py_INCREF(slow);
    d->core = core, Py_INCREF(core);
    d->call = (call_fn)(uintptr_t)call_address;
    d->cuda = cuda, d->device_index = device_index;
    return (PyObject*)d;
}

static void Dispatcher_dealloc(PyObject* self) {
    Dispatcher* d = (Dispatcher*)self;
    Py_XDECREF(d->backend_ref);
    Py_XDECREF(d->slow);
    Py_XDECREF(d->core);
    Py_XDECREF(d->plans);
    PyTypeObject* tp = Py_TYPE(self);
    freefunc free = (freefunc)PyType_GetSlot(tp, Py_tp_free);
    free(self);
    Py_DECREF(tp);
}

static PyMethodDef Dispatcher_methods[] = {
    {"learn", Dispatcher_learn, METH_VARARGS, "learn(args, kwargs, facts) -> bool: keep a call Backend.run made."},
    {"stats", Dispatcher_stats, METH_NOARGS, "stats() -> {'fast_calls', 'slow_calls', 'plans'}."},
    {"forget", Dispatcher_forget, METH_NOARGS, "forget(): drop every learned call."},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot Dispatcher_slots[] = {
    {Py_tp_new, Dispatcher_new},
    {Py_tp_dealloc, Dispatcher_dealloc},
    {Py_tp_call, Dispatcher_call},
    {Py_tp_methods, Dispatcher_methods},
    {Py_tp_doc, "run(op, *inputs, out=None, stream=None, **attrs): Backend.run, a learned call repeated in C."},
    {0, NULL},
};
static PyType_Spec Dispatcher_spec = {"cuplug.runtime._fastcall.Dispatcher", sizeof(Dispatcher), 0,
                                      Py_TPFLAGS_DEFAULT, Dispatcher_slots};

/* ---- module functions: what Python teaches once ---- */

static void set_ref(PyObject** slot, PyObject* v) {
    PyObject* old = *slot;
    Py_XINCREF(v);
    *slot = v;
    Py_XDECREF(old);
}

/* configure(dtype rows, formats, resident type): rows (DType, code, bits, itemsize) of contract.dtypes.TABLE. */
static PyObject* fc_configure(PyObject* m, PyObject* a) {
    (void)m;
    PyObject *rows, *fmts, *resident;
    if (!PyArg_ParseTuple(a, "O!O!O", &PyTuple_Type, &rows, &PyDict_Type, &fmts, &resident)) return NULL;
    Py_ssize_t n = PyTuple_Size(rows);
    if (n > MAX_DTYPES) {
        PyErr_SetString(PyExc_ValueError, "configure: more dtypes than the fast path holds");
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject* obj;
        int code, bits, itemsize;
        if (!PyArg_ParseTuple(PyTuple_GetItem(rows, i), "Oiii", &obj, &code, &bits, &itemsize)) return NULL;
        set_ref(&dtypes.objs[i], obj);
        dtypes.code[i] = (uint8_t)code, dtypes.bits[i] = (uint8_t)bits, dtypes.itemsize[i] = itemsize;
    }
    dtypes.n = (int)n;
    set_ref(&formats, fmts);
    set_ref(&resident_type, resident);
    Py_RETURN_NONE;
}

static PyObject* fc_set_numpy(PyObject* m, PyObject* ndarray) {
    (void)m;
    set_ref(&ndarray_type, ndarray);
    Py_RETURN_NONE;
}

/* set_torch(Tensor, Parameter, strided, ((torch dtype, row), ...), raw stream function or None, getsets, methods,
 * mode test): getsets and methods are PyTorch's own descriptors in the order of G_* and M_* (operands.TorchReader's);
 * the mode test is torch._C._is_torch_function_mode_enabled (a mode sends the call to the whole path). */
static PyObject* fc_set_torch(PyObject* m, PyObject* a) {
    (void)m;
    PyObject *tensor, *param, *strided, *pairs, *raw, *getsets, *methods, *mode_on;
    if (!PyArg_ParseTuple(a, "OOOO!OO!O!O", &tensor, &param, &strided, &PyTuple_Type, &pairs, &raw, &PyTuple_Type,
                          &getsets, &PyTuple_Type, &methods, &mode_on))
        return NULL;
    if (!PyCallable_Check(mode_on)) {
        PyErr_SetString(PyExc_TypeError, "set_torch: the torch-function-mode test is not callable");
        return NULL;
    }
    Py_ssize_t n = PyTuple_Size(pairs);
    if (n > MAX_DTYPES || PyTuple_Size(getsets) != N_GETSETS || PyTuple_Size(methods) != N_METHODS) {
        PyErr_SetString(PyExc_ValueError, "set_torch: dtypes or accessors the fast path does not hold");
        return NULL;
    }
    descrgetfunc get = (descrgetfunc)PyType_GetSlot(Py_TYPE(PyTuple_GetItem(getsets, 0)), Py_tp_descr_get);
    if (!get) {
        PyErr_SetString(PyExc_TypeError, "set_torch: PyTorch's accessors are not descriptors");
        return NULL;
    }
    for (int i = 0; i < N_GETSETS; i++)
        if (PyType_GetSlot(Py_TYPE(PyTuple_GetItem(getsets, i)), Py_tp_descr_get) != (void*)get) {
            PyErr_SetString(PyExc_TypeError, "set_torch: PyTorch's accessors are not of one descriptor type");
            return NULL;
        }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject* obj;
        int row;
        if (!PyArg_ParseTuple(PyTuple_GetItem(pairs, i), "Oi", &obj, &row)) return NULL;
        set_ref(&torch_dtype_objs[i], obj);
        torch_dtype_rows[i] = row;
    }
    for (int i = 0; i < N_GETSETS; i++) set_ref(&torch_getsets[i], PyTuple_GetItem(getsets, i));
    for (int i = 0; i < N_METHODS; i++) set_ref(&torch_methods[i], PyTuple_GetItem(methods, i));
    getset_get = get;
    n_torch_dtypes = (int)n;
    set_ref(&torch_types[0], tensor);
    set_ref(&torch_types[1], param);
    set_ref(&torch_strided, strided);
    set_ref(&torch_raw_stream, raw == Py_None ? NULL : raw);
    set_ref(&torch_mode_on, mode_on);
    Py_RETURN_NONE;
}

/* set_torch_exchange(table or None): torch.Tensor's __dlpack_c_exchange_api__, a capsule "dlpack_exchange_api".
 * Taken when it is DLPack 1.x with both functions this module calls; None or anything else (an address as an
 * int, as early PyTorch nightlies gave it, is not trusted) reads through the accessors. Returns whether the
 * table is used. */
static PyObject* fc_set_torch_exchange(PyObject* m, PyObject* table) {
    (void)m;
    const dlpack_exchange_api* api = NULL;
    if (PyCapsule_CheckExact(table))
        api = (const dlpack_exchange_api*)PyCapsule_GetPointer(table, "dlpack_exchange_api");
    if (PyErr_Occurred()) PyErr_Clear();
    if (api && (api->header.major != 1 || !api->dltensor_from_py_object_no_sync || !api->current_work_stream))
        api = NULL;
    if (api) {
        memset(dl_rows, 0, sizeof dl_rows);
        for (int i = 0; i < dtypes.n; i++)
            if (dtypes.bits[i] <= 64) dl_rows[dtypes.code[i]][dtypes.bits[i]] = i + 1;
    }
    torch_exchange = api;
    set_ref(&torch_exchange_owner, api ? table : NULL);
    return PyBool_FromLong(api != NULL);
}

/* set_cupy(cupy.ndarray, cupy.cuda.get_current_stream): exact CuPy arrays read in C, launched on CuPy's stream. */
static PyObject* fc_set_cupy(PyObject* m, PyObject* a) {
    (void)m;
    PyObject *ndarray, *current;
    if (!PyArg_ParseTuple(a, "O!O", &PyType_Type, &ndarray, &current)) return NULL;
    if (!PyCallable_Check(current)) {
        PyErr_SetString(PyExc_TypeError, "set_cupy: get_current_stream is not callable");
        return NULL;
    }
    set_ref(&cupy_type, ndarray);
    set_ref(&cupy_stream_now, current);
    Py_RETURN_NONE;
}

static PyMethodDef module_methods[] = {
    {"set_cupy", fc_set_cupy, METH_VARARGS, "set_cupy(cupy.ndarray, cupy.cuda.get_current_stream)"},
    {"set_torch_exchange", fc_set_torch_exchange, METH_O,
     "set_torch_exchange(torch.Tensor.__dlpack_c_exchange_api__ or None) -> whether DLPack's C table is used"},
    {"configure", fc_configure, METH_VARARGS, "configure(dtype rows, formats, resident Tensor type)"},
    {"set_numpy", fc_set_numpy, METH_O, "set_numpy(numpy.ndarray)"},
    {"set_torch", fc_set_torch, METH_VARARGS, "set_torch(Tensor, Parameter, strided, dtype pairs, raw stream)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_fastcall",
                                        "Backend.run's prepared call in C (runtime/fastpath.py).", -1,
                                        module_methods, NULL, NULL, NULL, NULL};

#define INTERN(var, text)                                        \
    if (!(var = PyUnicode_InternFromString(text))) return NULL;

PyMODINIT_FUNC PyInit__fastcall(void) {
    INTERN(s_backend, "backend") INTERN(s_life, "_life")
    INTERN(s_fast, "_fast") INTERN(s_out, "out") INTERN(s_stream, "stream") INTERN(s_acquire, "acquire")
    INTERN(s_release, "release") INTERN(s_closed, "closed") INTERN(s_handle, "handle")
    INTERN(s_forked_from, "forked_from") INTERN(s_check, "_check") INTERN(s_item, "item") INTERN(s_lock, "lock")
    INTERN(s_data, "data") INTERN(s_ptr, "ptr") INTERN(s_device_id, "device_id") INTERN(s_shape, "shape")
    INTERN(s_strides, "strides") INTERN(s_dtype, "dtype") INTERN(s_char, "char")
    PyObject* m = PyModule_Create(&module_def);
    if (!m) return NULL;
    FastPlan_Type = (PyTypeObject*)PyType_FromSpec(&FastPlan_spec);
    Dispatcher_Type = (PyTypeObject*)PyType_FromSpec(&Dispatcher_spec);
    if (!FastPlan_Type || !Dispatcher_Type || PyModule_AddObjectRef(m, "Dispatcher", (PyObject*)Dispatcher_Type) < 0 ||
        PyModule_AddIntConstant(m, "MAX_PLANS", MAX_PLANS) < 0 ||
        PyModule_AddIntConstant(m, "MAX_OPERANDS", MAX_OPERANDS) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
