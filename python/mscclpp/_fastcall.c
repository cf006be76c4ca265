/*
 * mscclpp._fastcall: the collectives' per-call work in C, for torch tensors and cupy arrays.
 *
 * Why: an eager mscclpp.all_reduce of a small tensor cost about 6 us more from Python than from C, of
 * which ctypes' call took 1.7 us and the package's Python work (attribute reads, dict lookups, checks)
 * about 4 us. Here the same reads, checks and the library call are made from C: the tensor's accessors
 * through the C API, the library function through its address, with no ctypes conversions.
 *
 * How it fits (collectives.py): the package's four public collectives (mscclpp.all_reduce, all_gather,
 * reduce_scatter, broadcast) are this module's builtins, made by publish() from the Python functions of
 * collectives.py, with their signatures and docstrings: no Python frame per call. A builtin parses its
 * arguments (the Python function's names, positions and defaults) and, when everything is usual, makes
 * the call: it returns the output when the library call succeeded and raises the package's exception
 * (_log.failure's, as the Python path raises it) when the library failed. Anything unusual (an unknown,
 * repeated or missing argument, stream= given, a buffer type not registered, a value of an unexpected
 * type, a check that would fail, a communicator before its first call, a library function replaced by a
 * Python one, the fast path turned off by enable(False)) hands the original arguments, as they came, to
 * the Python function, having called nothing: it makes the call and raises its precise error (TypeErrors
 * for bad signatures included). So every message and every rule stays in Python; this file only knows the
 * conditions under which Python's path calls the library, and then makes that same call.
 *
 * What Python hands over once (configure, set_function, add_type, publish): the dict of the C functions
 * the collectives call (_fns) and the address of each, the operator tables (_OPS, _OTHER_OPS), the types
 * ReduceOp and Communicator, the element sizes, the per-thread log count and _log.failure, per buffer type
 * (as collectives._resolve finds it) the framework's dtype table and stream accessor, and the Python
 * function of each collective. A communicator's state is read from one object per call: its _CommState's
 * `_fast` tuple (handle, device, size, rank), which comm.py keeps while the library holds the GPU.
 *
 * Built against the stable ABI (Py_LIMITED_API 3.10, where METH_FASTCALL | METH_KEYWORDS came in): one
 * _fastcall.abi3.so loads into every CPython from 3.10 on (not the free-threaded builds, which refuse abi3
 * modules; nor older Pythons, which it refuses at import: the package then uses ctypes).
 * PyObject_Vectorcall and PyObject_VectorcallMethod, exported by every CPython >= 3.9 but in the limited API
 * only from 3.12, are looked up at import (dlsym); where they are not found, the calls take the older
 * PyObject_Call* functions. Its tables are changed and read with the GIL held; the GIL is released around
 * the library call alone (the library may block, and its log handler takes the GIL itself).
 */
#define PY_SSIZE_T_CLEAN
#define Py_LIMITED_API 0x030A0000
#include <Python.h>

#include <dlfcn.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if PY_VERSION_HEX < 0x030A0000
#error "mscclpp._fastcall needs the headers of CPython >= 3.10 (stable ABI 3.10)"
#endif

#ifndef RTLD_DEFAULT
#define RTLD_DEFAULT ((void *)0)
#endif
#ifndef RTLD_NOLOAD
#define RTLD_NOLOAD 0
#endif

/* Bounds within which the overlap arithmetic below (int64) cannot overflow: buffer addresses below 2^61,
 * element counts below 2^56, so a buffer's bytes stay below 2^59 (the side of nranks pieces too: its count
 * is a buffer's). Anything beyond is left to Python's exact integers. */
#define MAX_ADDRESS (1ULL << 61)
#define MAX_COUNT (1LL << 56)
#define N_DTYPES 10 /* mscclppDataType_t: 0 .. 9 */

/* PyObject_Vectorcall(callable, args, nargsf, kwnames) and PyObject_VectorcallMethod(name, args, nargsf,
 * kwnames) (args[0] the object), found at import, or NULL. */
typedef PyObject *(*vectorcall_fn)(PyObject *, PyObject *const *, size_t, PyObject *);
static vectorcall_fn vectorcall, vectorcall_method;

/* ---- what Python hands over ---- */

enum { TORCH = 0, CUPY = 1 };

/* A buffer type (exact type, subclasses are registered one by one, as collectives._adapters keys them). */
typedef struct {
  PyObject *type;
  int kind;
  PyObject *dtypes; /* dtype -> mscclppDataType_t (int) */
  PyObject *stream; /* torch: f(device) -> raw stream; cupy: get_current_stream */
  int per_device;   /* cupy: whether get_current_stream takes a device (-1: not known yet) */
  int cupy_direct;  /* cupy: whether it has _c_contiguous and data.device_id (-1: not known yet) */
  PyObject *last_dtype; /* the dtype last found in `dtypes` (held), and its code */
  int last_code;
  /* torch: reading through torch's C shim (see read_torch): where the object holds its at::Tensor (-1: not
   * found out yet), the tensors and streams compared so far, and the dtype code of each c10::ScalarType
   * seen (-1: not yet). All reset by add_type. */
  int tensor_offset, borrowed_offset, shim_checked, stream_checked;
  signed char dtype_of_scalar[64];
} BufferType;

#define MAX_TYPES 16
static BufferType types[MAX_TYPES];
static int ntypes;

typedef int (*call_with_arg)(void *, void *, size_t, int, int, void *, void *);
typedef int (*call_without_arg)(void *, void *, size_t, int, void *, void *);

enum { NO_ARG, OP_ARG, ROOT_ARG };

/* The public function's parameters: what each is (its role), by position then keyword-only. */
enum { R_INP, R_OUT, R_ARG, R_COMM, R_STREAM, N_ROLES };
enum { REQUIRED, DEFAULT_NONE, DEFAULT_SUM };
#define MAX_PARAMS 5

typedef struct {
  const char *name;
  int role;
  int presence; /* REQUIRED, or the default */
  PyObject *key; /* the name, interned */
} Param;

/* A collective's shape: the input and output, one of which may be nranks pieces (a piece is the count
 * passed to the library), and where the input sits in NCCL's in-place form: at the output plus `shift` *
 * rank pieces. */
typedef struct {
  const char *name;
  int arg;          /* the fifth C argument: an operator, a root, or none (all-gather) */
  int in_scaled;    /* the input has nranks pieces (reduce-scatter) */
  int out_scaled;   /* the output has nranks pieces (all-gather) */
  int shift;        /* in place: input = output + shift * rank * piece bytes */
  int optional_out; /* out=None (or out is the input) means in place (all-reduce, broadcast) */
  const char *public_name;
  int npositional; /* the parameters before the `*` */
  int nparams;
  Param params[MAX_PARAMS];
  PyObject *key;    /* the name, as a str: its key in _fns */
  PyObject *bound;  /* the object _fns holds for it when `address` is the function to call */
  void *address;
  PyObject *python; /* collectives.py's function (publish): every call this module does not make */
  char *doc;        /* the builtin's docstring (signature and the Python function's __doc__) */
} Collective;

enum { ALL_REDUCE, ALL_GATHER, REDUCE_SCATTER, BROADCAST, N_COLLECTIVES };

#define P(name, role, presence) {name, role, presence, NULL}
static Collective collectives[N_COLLECTIVES] = {
    /* all_reduce(tensor, op="sum", *, comm, out=None, stream=None) */
    {"mscclppAllReduce", OP_ARG, 0, 0, 0, 1, "all_reduce", 2, 5,
     {P("tensor", R_INP, REQUIRED), P("op", R_ARG, DEFAULT_SUM), P("comm", R_COMM, REQUIRED),
      P("out", R_OUT, DEFAULT_NONE), P("stream", R_STREAM, DEFAULT_NONE)},
     NULL, NULL, NULL, NULL, NULL},
    /* all_gather(out, inp, *, comm, stream=None) */
    {"mscclppAllGather", NO_ARG, 0, 1, 1, 0, "all_gather", 2, 4,
     {P("out", R_OUT, REQUIRED), P("inp", R_INP, REQUIRED), P("comm", R_COMM, REQUIRED),
      P("stream", R_STREAM, DEFAULT_NONE)},
     NULL, NULL, NULL, NULL, NULL},
    /* reduce_scatter(out, inp, op="sum", *, comm, stream=None) */
    {"mscclppReduceScatter", OP_ARG, 1, 0, -1, 0, "reduce_scatter", 3, 5,
     {P("out", R_OUT, REQUIRED), P("inp", R_INP, REQUIRED), P("op", R_ARG, DEFAULT_SUM),
      P("comm", R_COMM, REQUIRED), P("stream", R_STREAM, DEFAULT_NONE)},
     NULL, NULL, NULL, NULL, NULL},
    /* broadcast(tensor, root, *, comm, out=None, stream=None) */
    {"mscclppBroadcast", ROOT_ARG, 0, 0, 0, 1, "broadcast", 2, 5,
     {P("tensor", R_INP, REQUIRED), P("root", R_ARG, REQUIRED), P("comm", R_COMM, REQUIRED),
      P("out", R_OUT, DEFAULT_NONE), P("stream", R_STREAM, DEFAULT_NONE)},
     NULL, NULL, NULL, NULL, NULL},
};
#undef P

static PyObject *fns;         /* collectives._fns */
static PyObject *ops;         /* collectives._OPS */
static PyObject *other_ops;   /* collectives._OTHER_OPS */
static PyObject *reduce_op;   /* collectives.ReduceOp */
static PyObject *communicator; /* comm.Communicator */
static PyObject *tlog;         /* _log._state: per thread, `logged` counts the library's log lines */
static PyObject *failure;      /* _log.failure(name, rc, mark): the exception of a failed call */
static long long itemsize[N_DTYPES];
static int enabled = 1;        /* enable(): whether the builtins make calls (else all go to Python) */
static unsigned long long taken, declined; /* calls made here, calls left to Python (stats()) */

/* Attribute names and the default operator, interned once. */
static PyObject *s_st, *s_fast, *s_sum, *s_device_id, *s_c_contiguous_direct;
static PyObject *s_is_cuda, *s_dtype, *s_is_contiguous, *s_data_ptr, *s_numel, *s_get_device, *s_size;
static PyObject *s_flags, *s_c_contiguous, *s_data, *s_ptr, *s_id, *s_logged, *s_device, *s_doc;
static PyObject *s_cdata, *s_basicsize;

/* ---- reading values ----
 * Each take_* consumes a new reference (which may be NULL after a failed call) and returns 1 with the
 * value, or 0: then the caller declines (an exception may be pending; the caller clears it). */

static int take_true(PyObject *v) {
  if (v == NULL)
    return 0;
  int ok = v == Py_True;
  Py_DECREF(v);
  return ok;
}

/* v (borrowed) as an int in [lo, hi). */
static int read_ll(PyObject *v, long long lo, long long hi, long long *out) {
  if (!PyLong_Check(v))
    return 0;
  int overflow = 0;
  long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
  if (overflow || (x == -1 && PyErr_Occurred()) || x < lo || x >= hi)
    return 0;
  *out = x;
  return 1;
}

static int take_ll(PyObject *v, long long lo, long long hi, long long *out) {
  if (v == NULL)
    return 0;
  int ok = read_ll(v, lo, hi, out);
  Py_DECREF(v);
  return ok;
}

/* A buffer's address: below MAX_ADDRESS, for the overlap arithmetic. */
static int take_address(PyObject *v, unsigned long long *out) {
  long long x;
  if (!take_ll(v, 0, (long long)MAX_ADDRESS, &x))
    return 0;
  *out = (unsigned long long)x;
  return 1;
}

/* A handle (the communicator's, a stream's; borrowed): any 64-bit value, passed on as it is. */
static int read_handle(PyObject *v, void **out) {
  if (!PyLong_Check(v))
    return 0;
  unsigned long long x = PyLong_AsUnsignedLongLong(v);
  if (x == (unsigned long long)-1 && PyErr_Occurred())
    return 0;
  *out = (void *)(size_t)x;
  return 1;
}

static int take_handle(PyObject *v, void **out) {
  if (v == NULL)
    return 0;
  int ok = read_handle(v, out);
  Py_DECREF(v);
  return ok;
}

/* The code of dtype `dt` (consumed) in bt's table `table`: the dtype found last is remembered in the type's
 * entry (while that entry still has this table: an accessor may have reconfigured it meanwhile). */
static int take_dtype(PyObject *dt, BufferType *bt, PyObject *table, int *out) {
  if (dt == NULL)
    return 0;
  if (dt == bt->last_dtype && bt->dtypes == table) {
    Py_DECREF(dt);
    *out = bt->last_code;
    return 1;
  }
  PyObject *code = PyDict_GetItemWithError(table, dt); /* borrowed */
  long long c;
  if (code == NULL) {
    Py_DECREF(dt);
    return 0;
  }
  Py_INCREF(code);
  if (!take_ll(code, 0, N_DTYPES, &c)) {
    Py_DECREF(dt);
    return 0;
  }
  *out = (int)c;
  if (bt->dtypes == table) {
    PyObject *old = bt->last_dtype;
    bt->last_dtype = dt; /* the reference taken over */
    bt->last_code = (int)c;
    Py_XDECREF(old);
  } else {
    Py_DECREF(dt);
  }
  return 1;
}

/* o.name(), without a bound-method object where PyObject_VectorcallMethod was found. */
static PyObject *method(PyObject *o, PyObject *name) {
  if (vectorcall_method != NULL) {
    PyObject *args[1] = {o};
    return vectorcall_method(name, args, 1, NULL);
  }
  return PyObject_CallMethodObjArgs(o, name, NULL);
}

/* f(x) */
static PyObject *call1(PyObject *f, PyObject *x) {
  if (vectorcall != NULL) {
    PyObject *args[1] = {x};
    return vectorcall(f, args, 1, NULL);
  }
  return PyObject_CallFunctionObjArgs(f, x, NULL);
}

/* o.name, consuming o (a new reference, or NULL after a failed call). */
static PyObject *attr_of(PyObject *o, PyObject *name) {
  if (o == NULL)
    return NULL;
  PyObject *v = PyObject_GetAttr(o, name);
  Py_DECREF(o);
  return v;
}

/* ---- the communicator ---- */

typedef struct {
  void *handle;
  long long device, size, rank;
} Comm;

/* The last state tuple read (held: its address is not reused while held) and what it says. */
static PyObject *comm_last;
static Comm comm_last_read;

/* The communicator's state, only where collectives.py would call the library directly: a Communicator
 * (exactly), open, whose library has taken its GPU (before, Python makes the GPU current: _first_calls).
 * comm.py keeps comm._st._fast = (handle, device, size, rank) exactly then, else None. */
static int read_comm(PyObject *comm, Comm *c) {
  if ((PyObject *)Py_TYPE(comm) != communicator)
    return 0;
  PyObject *fast = attr_of(PyObject_GetAttr(comm, s_st), s_fast);
  if (fast == NULL)
    return 0;
  if (fast == comm_last) {
    *c = comm_last_read;
    Py_DECREF(fast);
    return 1;
  }
  int ok = PyTuple_Check(fast) && PyTuple_Size(fast) == 4 && read_handle(PyTuple_GetItem(fast, 0), &c->handle) &&
           read_ll(PyTuple_GetItem(fast, 1), 0, 1 << 30, &c->device) &&
           read_ll(PyTuple_GetItem(fast, 2), 1, 1LL << 31, &c->size) &&
           read_ll(PyTuple_GetItem(fast, 3), 0, c->size, &c->rank);
  if (ok) {
    PyObject *old = comm_last;
    comm_last = fast; /* the reference taken over */
    comm_last_read = *c;
    Py_XDECREF(old);
  } else {
    Py_DECREF(fast);
  }
  return ok;
}

/* ---- the operator and the root ---- */

/* As collectives._op: the usual spellings (exact str, int, ReduceOp) in _OPS, other enums' members once
 * Python has resolved them (_OTHER_OPS). bools and other strs are Python's (it refuses or parses them). */
static int read_op(PyObject *op, int *code) {
  PyObject *tp = (PyObject *)Py_TYPE(op);
  PyObject *table;
  if (tp == (PyObject *)&PyUnicode_Type || tp == (PyObject *)&PyLong_Type || tp == reduce_op)
    table = ops;
  else if (PyBool_Check(op) || PyUnicode_Check(op))
    return 0;
  else
    table = other_ops;
  PyObject *v = PyDict_GetItemWithError(table, op); /* borrowed; unhashable: an error, cleared */
  long long c;
  if (v == NULL || !read_ll(v, 0, 5, &c))
    return 0;
  *code = (int)c;
  return 1;
}

/* As broadcast's check: an int (exactly) in the C int range; anything else is Python's (_int32). */
static int read_root(PyObject *root, int *out) {
  long long r;
  if (Py_TYPE(root) != &PyLong_Type || !read_ll(root, -(1LL << 31), 1LL << 31, &r))
    return 0;
  *out = (int)r;
  return 1;
}

/* ---- buffers ---- */

/* A buffer as read, with its type's entry. The entry's objects are held (strong references) for the call:
 * the accessors may run Python code, and another thread may then reconfigure the table. */
typedef struct {
  BufferType *slot; /* for the remembered facts (dtype, cupy's forms): checked against `dtypes`, or ints */
  int kind;
  PyObject *dtypes, *stream;
  unsigned long long ptr;
  long long count;
  int dtype;
  long long device;
} Buffer;

static void hold(Buffer *b) {
  Py_XINCREF(b->dtypes);
  Py_XINCREF(b->stream);
}

static void release(Buffer *b) {
  Py_CLEAR(b->dtypes);
  Py_CLEAR(b->stream);
}

static BufferType *find_type(PyObject *tp) {
  for (int i = 0; i < ntypes; i++)
    if (types[i].type == tp)
      return &types[i];
  return NULL;
}

/* ---- torch tensors read through torch's C shim ----
 * Why: each read of read_torch_python is a Python call into torch (60-125 ns each on an H100's host; six
 * per tensor, twelve per call of two tensors: about 1.2 us, a third of what a call from Python costs more
 * than one from C). torch's libraries export a C interface (the AOTInductor shim: aoti_torch_get_data_ptr,
 * aoti_torch_get_numel, ... extern "C" functions taking an at::Tensor*) that reads the same facts in a few
 * ns each. What it needs is the at::Tensor inside the Python object: torch's object (THPVariable) is the
 * object header, then a MaybeOwned<at::Tensor> (a bool "borrowed", then the tensor: one TensorImpl
 * pointer), or in other versions the tensor right after the header.
 *
 * Neither is torch's public Python API, so nothing is taken on trust: the shim's functions are looked up
 * by name (all present, or the shim is not used); the tensor's place in the object is found on the first
 * tensor of a type, as the word equal to t._cdata (torch's own read of the TensorImpl address), and only at
 * one of the two known places; and on the first SHIM_CHECKS tensors of each type every shim read is
 * compared with the Python reads of the same tensor. One disagreement turns the shim off for good (the
 * Python reads go on, as before). Anything unusual about a tensor (not CUDA, not contiguous, a dtype not
 * yet seen through the Python reads, a borrowed tensor, a shim error) takes the Python reads too, which
 * decline where a check fails, so the package's error messages are unchanged. shim_state() says which. */
typedef int32_t (*shim_ptr_fn)(void *, void **);
typedef int32_t (*shim_i64_fn)(void *, int64_t *);
typedef int32_t (*shim_i32_fn)(void *, int32_t *);
typedef int32_t (*shim_i64p_fn)(void *, int64_t **);
typedef int32_t (*shim_stream_fn)(int32_t, void **);
#define SHIM_CHECKS 8
#define SHIM_CUDA 1          /* c10::DeviceType::CUDA */
#define SHIM_MAX_SCALAR 64   /* c10::ScalarType codes learned (below this) */
static struct {
  int state; /* -1: not looked up yet; 0: off; 1: on */
  const char *why_off;
  shim_ptr_fn data_ptr;
  shim_i64_fn numel, dim;
  shim_i32_fn dtype, device_type, device_index;
  shim_i64p_fn sizes, strides;
  shim_stream_fn stream; /* libtorch_cuda's current stream of a device, or NULL (then Python's) */
  unsigned long long reads, stream_reads;
} shim = {-1, "not looked up yet", NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, 0, 0};

static void shim_off(const char *why) {
  shim.state = 0;
  shim.why_off = why;
}

/* A function of a loaded torch library (never loads one: a process without torch has no torch tensors). */
static void *torch_symbol(const char *lib_name, const char *name) {
  void *lib = dlopen(lib_name, RTLD_LAZY | RTLD_NOLOAD);
  void *p = lib != NULL ? dlsym(lib, name) : NULL;
  if (lib != NULL)
    dlclose(lib);
  return p != NULL ? p : dlsym(RTLD_DEFAULT, name);
}

static int shim_lookup(void) {
  if (shim.state >= 0)
    return shim.state;
  const char *cpu = "libtorch_cpu.so";
  *(void **)&shim.data_ptr = torch_symbol(cpu, "aoti_torch_get_data_ptr");
  *(void **)&shim.numel = torch_symbol(cpu, "aoti_torch_get_numel");
  *(void **)&shim.dim = torch_symbol(cpu, "aoti_torch_get_dim");
  *(void **)&shim.dtype = torch_symbol(cpu, "aoti_torch_get_dtype");
  *(void **)&shim.device_type = torch_symbol(cpu, "aoti_torch_get_device_type");
  *(void **)&shim.device_index = torch_symbol(cpu, "aoti_torch_get_device_index");
  *(void **)&shim.sizes = torch_symbol(cpu, "aoti_torch_get_sizes");
  *(void **)&shim.strides = torch_symbol(cpu, "aoti_torch_get_strides");
  *(void **)&shim.stream = torch_symbol("libtorch_cuda.so", "aoti_torch_get_current_cuda_stream");
  if (shim.data_ptr && shim.numel && shim.dim && shim.dtype && shim.device_type && shim.device_index && shim.sizes &&
      shim.strides) {
    shim.state = 1;
    shim.why_off = "";
  } else {
    shim_off("torch's C shim (aoti_torch_get_*) was not found in the process");
  }
  return shim.state;
}

/* Where the type's objects hold their at::Tensor: bt->tensor_offset (0: unknown place, the shim is not
 * used for this type) and bt->borrowed_offset (the MaybeOwned flag's byte, or 0 where there is none). */
static void find_tensor_offset(PyObject *t, BufferType *bt) {
  bt->tensor_offset = 0;
  bt->borrowed_offset = 0;
  PyObject *cd = PyObject_GetAttr(t, s_cdata);
  PyObject *bs = PyObject_GetAttr(bt->type, s_basicsize);
  unsigned long long impl = cd != NULL && PyLong_Check(cd) ? PyLong_AsUnsignedLongLong(cd) : 0;
  long long basic = bs != NULL && PyLong_Check(bs) ? PyLong_AsLongLong(bs) : 0;
  Py_XDECREF(cd);
  Py_XDECREF(bs);
  PyErr_Clear();
  if (impl == 0 || impl == (unsigned long long)-1)
    return;
  /* The header is 16 bytes in the builds this module loads into (stable ABI, not free-threaded). */
  const unsigned char *o = (const unsigned char *)t;
  if (basic >= 32 && *(const unsigned long long *)(o + 24) == impl && o[16] == 0) {
    bt->tensor_offset = 24; /* MaybeOwned<at::Tensor>, owned: the flag at 16 */
    bt->borrowed_offset = 16;
  } else if (basic >= 24 && *(const unsigned long long *)(o + 16) == impl) {
    bt->tensor_offset = 16; /* the at::Tensor itself */
  }
}

typedef struct {
  void *ptr;
  int64_t numel;
  int32_t scalar, device_type, device_index;
  int contiguous;
} TensorFacts;

/* torch's rule: contiguous where every dimension of size other than 1 has the stride of the ones after. */
static int shim_contiguous(void *tensor, int64_t numel) {
  int64_t dim, *sizes, *strides;
  if (numel == 0)
    return 1;
  if (shim.dim(tensor, &dim) != 0 || shim.sizes(tensor, &sizes) != 0 || shim.strides(tensor, &strides) != 0)
    return -1;
  int64_t expected = 1;
  for (int64_t d = dim - 1; d >= 0; d--) {
    if (sizes[d] != 1) {
      if (strides[d] != expected)
        return 0;
      expected *= sizes[d];
    }
  }
  return 1;
}

/* The tensor's facts through the shim: 1, or 0 where it cannot read them. */
static int shim_facts(PyObject *t, BufferType *bt, TensorFacts *f) {
  if (shim_lookup() != 1)
    return 0;
  if (bt->tensor_offset < 0)
    find_tensor_offset(t, bt);
  if (bt->tensor_offset == 0)
    return 0;
  const unsigned char *o = (const unsigned char *)t;
  if (bt->borrowed_offset != 0 && o[bt->borrowed_offset] != 0)
    return 0; /* borrowed: the word there points at a tensor held elsewhere (rare; Python's reads) */
  void *tensor = (void *)(o + bt->tensor_offset);
  if (shim.device_type(tensor, &f->device_type) != 0 || shim.device_index(tensor, &f->device_index) != 0 ||
      shim.dtype(tensor, &f->scalar) != 0 || shim.numel(tensor, &f->numel) != 0)
    return 0;
  f->contiguous = shim_contiguous(tensor, f->numel);
  if (f->contiguous < 0 || shim.data_ptr(tensor, &f->ptr) != 0)
    return 0;
  return 1;
}

/* As collectives._Torch.info, where it returns: a CUDA tensor of a known dtype, contiguous. is_cuda and
 * dtype are properties (cheap); the methods are called without bound-method objects. */
static int read_torch_python(PyObject *t, Buffer *b) {
  return take_true(PyObject_GetAttr(t, s_is_cuda)) &&
         take_dtype(PyObject_GetAttr(t, s_dtype), b->slot, b->dtypes, &b->dtype) &&
         take_true(method(t, s_is_contiguous)) && take_address(method(t, s_data_ptr), &b->ptr) &&
         take_ll(method(t, s_numel), 0, MAX_COUNT, &b->count) &&
         take_ll(method(t, s_get_device), 0, 1 << 30, &b->device);
}

/* A torch tensor's facts: through the shim where it is trusted and the tensor is usual, else Python's reads
 * (compared with the shim's while the type's checks last). */
static int read_torch(PyObject *t, Buffer *b) {
  BufferType *bt = b->slot;
  TensorFacts f;
  int have = shim_facts(t, bt, &f);
  int usual = have && f.device_type == SHIM_CUDA && f.contiguous == 1 && f.scalar >= 0 &&
              f.scalar < SHIM_MAX_SCALAR && bt->dtype_of_scalar[f.scalar] >= 0 && f.numel >= 0 &&
              f.numel < MAX_COUNT && (unsigned long long)(size_t)f.ptr < MAX_ADDRESS && f.device_index >= 0 &&
              b->dtypes == bt->dtypes;
  if (usual && bt->shim_checked >= SHIM_CHECKS) {
    b->ptr = (unsigned long long)(size_t)f.ptr;
    b->count = f.numel;
    b->dtype = bt->dtype_of_scalar[f.scalar];
    b->device = f.device_index;
    shim.reads++;
    return 1;
  }
  int ok = read_torch_python(t, b);
  if (have && ok && shim.state == 1) {
    /* Python found a usual tensor: the shim must have read the same. */
    if (f.device_type != SHIM_CUDA || f.contiguous != 1 || (unsigned long long)(size_t)f.ptr != b->ptr ||
        f.numel != b->count || f.device_index != b->device || f.scalar < 0 || f.scalar >= SHIM_MAX_SCALAR ||
        (b->dtypes == bt->dtypes && bt->dtype_of_scalar[f.scalar] >= 0 && bt->dtype_of_scalar[f.scalar] != b->dtype)) {
      shim_off("torch's C shim read a tensor otherwise than its Python accessors");
    } else if (b->dtypes == bt->dtypes) { /* else add_type changed the table meanwhile: learn nothing */
      bt->dtype_of_scalar[f.scalar] = (signed char)b->dtype;
      bt->shim_checked++;
    }
  }
  return ok;
}

/* Whether a cupy array type has the attributes its public ones are made of: a._c_contiguous (a bool, what
 * a.flags.c_contiguous reads; a.flags makes a Flags object per read) and a.data.device_id (what
 * a.device.id reads; a.device makes a Device object per read). Found out on the first array of a type. */
static int cupy_direct(PyObject *a, PyObject *data) {
  PyObject *cc = PyObject_GetAttr(a, s_c_contiguous_direct);
  PyObject *id = PyObject_GetAttr(data, s_device_id);
  int ok = cc != NULL && PyBool_Check(cc) && id != NULL && PyLong_Check(id);
  Py_XDECREF(cc);
  Py_XDECREF(id);
  PyErr_Clear();
  return ok;
}

/* As collectives._Cupy.info, where it returns: a known dtype, C-contiguous. */
static int read_cupy(PyObject *a, Buffer *b) {
  if (!take_dtype(PyObject_GetAttr(a, s_dtype), b->slot, b->dtypes, &b->dtype))
    return 0;
  PyObject *data = PyObject_GetAttr(a, s_data);
  if (data == NULL)
    return 0;
  int direct = b->slot->cupy_direct;
  if (direct < 0)
    b->slot->cupy_direct = direct = cupy_direct(a, data);
  int ok;
  if (direct)
    ok = take_true(PyObject_GetAttr(a, s_c_contiguous_direct)) && take_address(PyObject_GetAttr(data, s_ptr), &b->ptr) &&
         take_ll(PyObject_GetAttr(a, s_size), 0, MAX_COUNT, &b->count) &&
         take_ll(PyObject_GetAttr(data, s_device_id), 0, 1 << 30, &b->device);
  else
    ok = take_true(attr_of(PyObject_GetAttr(a, s_flags), s_c_contiguous)) &&
         take_address(PyObject_GetAttr(data, s_ptr), &b->ptr) &&
         take_ll(PyObject_GetAttr(a, s_size), 0, MAX_COUNT, &b->count) &&
         take_ll(attr_of(PyObject_GetAttr(a, s_device), s_id), 0, 1 << 30, &b->device);
  Py_DECREF(data);
  return ok;
}

/* Reads x into b (which holds its type's objects from then on, also when the reading fails: release). */
static int read_buffer(PyObject *x, Buffer *b) {
  BufferType *bt = find_type((PyObject *)Py_TYPE(x));
  if (bt == NULL)
    return 0;
  b->slot = bt;
  b->kind = bt->kind;
  b->dtypes = bt->dtypes;
  b->stream = bt->stream;
  hold(b);
  return b->kind == TORCH ? read_torch(x, b) : read_cupy(x, b);
}

/* The current stream of the output's framework on `device`, as _Torch.stream and _Cupy.stream. */
static int read_stream(Buffer *b, void **out) {
  /* torch: its current stream through the shim (see read_torch), once it agreed SHIM_CHECKS times. */
  void *shim_stream = NULL;
  int have = b->kind == TORCH && shim.state == 1 && shim.stream != NULL && b->device <= INT32_MAX &&
             shim.stream((int32_t)b->device, &shim_stream) == 0;
  if (have && b->slot->stream_checked >= SHIM_CHECKS && b->stream == b->slot->stream) {
    *out = shim_stream;
    shim.stream_reads++;
    return 1;
  }
  PyObject *dev = PyLong_FromLongLong(b->device);
  if (dev == NULL)
    return 0;
  int ok = 0;
  if (b->kind == TORCH) {
    ok = take_handle(call1(b->stream, dev), out);
    if (have && ok && b->stream == b->slot->stream) {
      if (*out == shim_stream)
        b->slot->stream_checked++;
      else
        shim.stream = NULL; /* another stream than the accessor's: Python's from now on */
    }
  } else {
    /* cupy >= 11 takes the device (its current stream is per device); older ones take nothing, which
     * their TypeError tells, once. */
    int per_device = b->slot->per_device;
    if (per_device != 0) {
      ok = take_handle(attr_of(call1(b->stream, dev), s_ptr), out);
      if (ok) {
        per_device = 1;
      } else if (PyErr_Occurred() && PyErr_ExceptionMatches(PyExc_TypeError)) {
        PyErr_Clear();
        per_device = 0;
      }
    }
    if (per_device == 0)
      ok = take_handle(attr_of(PyObject_CallObject(b->stream, NULL), s_ptr), out);
    b->slot->per_device = per_device;
  }
  Py_DECREF(dev);
  return ok;
}

/* ---- the call ---- */

/* Whether _fns still holds the function whose address we have (the tests replace functions in _fns by
 * recorders; a Python replacement is called by Python's path). */
static int function_in_place(const Collective *c) {
  return fns != NULL && c->address != NULL && PyDict_GetItemWithError(fns, c->key) == c->bound;
}

/* The library call, once everything is read and checked; the GIL is released around it. Returns the
 * output, or raises _log.failure(name, rc, mark) as the Python path does. */
static PyObject *call_library(const Collective *c, void *address, PyObject *inp, PyObject *out, const Buffer *in,
                              const Buffer *o, long long count, int arg_value, void *handle, void *stream,
                              PyObject *mark) {
  void *send = (void *)(size_t)in->ptr, *recv = (void *)(size_t)o->ptr;
  int rc;
  Py_BEGIN_ALLOW_THREADS
  if (c->arg == NO_ARG)
    rc = ((call_without_arg)address)(send, recv, (size_t)count, in->dtype, handle, stream);
  else
    rc = ((call_with_arg)address)(send, recv, (size_t)count, in->dtype, arg_value, handle, stream);
  Py_END_ALLOW_THREADS
  taken++;
  if (rc == 0) {
    PyObject *result = (c->optional_out && out == Py_None) ? inp : out;
    Py_INCREF(result);
    return result;
  }
  PyObject *code = PyLong_FromLong(rc);
  PyObject *error = code ? PyObject_CallFunctionObjArgs(failure, c->key, code, mark, NULL) : NULL;
  Py_XDECREF(code);
  if (error != NULL) {
    PyErr_SetObject((PyObject *)Py_TYPE(error), error);
    Py_DECREF(error);
  }
  return NULL;
}

/* The one path of the four collectives: the checks of collectives.py's path, then the library call.
 * Returns 1 when it called the library (*result: the output, or NULL with the exception), 0 when it did
 * not (any check that would fail, or anything unusual). The buffers are released by the caller. */
static int checked_call(const Collective *c, void *address, PyObject *comm, PyObject *inp, PyObject *out,
                        PyObject *arg, Buffer *in, Buffer *o, PyObject **result) {
  Comm cm;
  int arg_value = 0;
  if (!read_comm(comm, &cm))
    return 0;
  if ((c->arg == OP_ARG && !read_op(arg, &arg_value)) || (c->arg == ROOT_ARG && !read_root(arg, &arg_value)))
    return 0;
  if (!read_buffer(inp, in))
    return 0;
  if ((c->optional_out && out == Py_None) || out == inp) {
    *o = *in;
    hold(o);
  } else if (!read_buffer(out, o)) {
    return 0;
  }
  /* Same element type, same GPU, the communicator's. */
  if (o->dtype != in->dtype || o->device != in->device || o->device != cm.device)
    return 0;
  /* The element counts: the scaled side holds nranks pieces. */
  long long count = in->count;
  if (c->in_scaled) {
    if (in->count % cm.size || in->count / cm.size != o->count)
      return 0;
    count = o->count;
  } else if (c->out_scaled) {
    if (o->count % cm.size || o->count / cm.size != in->count)
      return 0;
  } else if (o->count != in->count) {
    return 0;
  }
  /* No partial overlap: disjoint, or the input where NCCL's in-place form has it (collectives._placement). */
  long long piece = count * itemsize[in->dtype];
  long long send = (long long)in->ptr, recv = (long long)o->ptr;
  long long send_bytes = c->in_scaled ? piece * cm.size : piece;
  long long recv_bytes = c->out_scaled ? piece * cm.size : piece;
  long long in_place = recv + c->shift * cm.rank * piece;
  if (send != in_place && send_bytes && recv_bytes && send < recv + recv_bytes && recv < send + send_bytes)
    return 0;
  void *stream;
  if (!read_stream(o, &stream))
    return 0;
  /* This thread's count of the library's log lines, noted before the call as the Python path notes it: a
   * failure's exception carries the lines logged since (_log.failure). */
  PyObject *mark = PyObject_GetAttr(tlog, s_logged);
  if (mark == NULL)
    return 0;
  *result = call_library(c, address, inp, out, in, o, count, arg_value, cm.handle, stream, mark);
  Py_DECREF(mark);
  return 1;
}

/* The accessors may run Python code, and that may reconfigure the extension (another thread, a reload):
 * what a call uses of its tables is held for the call (the function's owner, the buffer types' objects).
 * Returns 1 with *result when it called the library, 0 (nothing called, no exception) otherwise. */
static int collective(const Collective *c, PyObject *comm, PyObject *inp, PyObject *out, PyObject *arg,
                      PyObject **result) {
  if (!function_in_place(c)) {
    PyErr_Clear();
    return 0;
  }
  PyObject *bound = c->bound; /* keeps the function alive (a ctypes callback's code lives in it) */
  void *address = c->address;
  Py_INCREF(bound);
  Buffer in = {0}, o = {0};
  int called = checked_call(c, address, comm, inp, out, arg, &in, &o, result);
  release(&in);
  release(&o);
  Py_DECREF(bound);
  if (!called)
    PyErr_Clear();
  return called;
}

/* ---- the public functions ---- */

/* The Python function of c, called with the arguments as they came. */
static PyObject *call_python(Collective *c, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
  PyObject *f = c->python;
  if (f == NULL) {
    PyErr_Format(PyExc_RuntimeError, "mscclpp._fastcall: %s has no Python function (publish was not called)",
                 c->public_name);
    return NULL;
  }
  Py_INCREF(f); /* a reload may publish another while it runs */
  PyObject *r = NULL;
  if (vectorcall != NULL) {
    r = vectorcall(f, args, (size_t)nargs, kwnames);
  } else {
    Py_ssize_t nkw = kwnames != NULL ? PyTuple_Size(kwnames) : 0;
    PyObject *tuple = PyTuple_New(nargs);
    PyObject *dict = nkw ? PyDict_New() : NULL;
    int ok = tuple != NULL && (nkw == 0 || dict != NULL);
    for (Py_ssize_t i = 0; ok && i < nargs; i++) {
      Py_INCREF(args[i]);
      PyTuple_SetItem(tuple, i, args[i]);
    }
    for (Py_ssize_t k = 0; ok && k < nkw; k++)
      ok = PyDict_SetItem(dict, PyTuple_GetItem(kwnames, k), args[nargs + k]) == 0;
    if (ok)
      r = PyObject_Call(f, tuple, dict);
    Py_XDECREF(tuple);
    Py_XDECREF(dict);
  }
  Py_DECREF(f);
  return r;
}

/* Which parameter of c a keyword names, or -1: interned names compare by address (a call's keywords are
 * the code's interned constants), others by value. */
static int find_param(const Collective *c, PyObject *key) {
  for (int j = 0; j < c->nparams; j++)
    if (key == c->params[j].key)
      return j;
  for (int j = 0; j < c->nparams; j++)
    if (PyUnicode_Check(key) && PyUnicode_Compare(key, c->params[j].key) == 0)
      return j;
  PyErr_Clear();
  return -1;
}

/* The arguments by role, as the Python function would bind them; 0 where it would not bind them (too many
 * or unknown or repeated or missing) or where the call is Python's anyway (stream= given). */
static int parse(const Collective *c, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames,
                 PyObject **role) {
  PyObject *slot[MAX_PARAMS] = {NULL};
  if (nargs > c->npositional)
    return 0;
  for (Py_ssize_t i = 0; i < nargs; i++)
    slot[i] = args[i];
  if (kwnames != NULL) {
    Py_ssize_t nkw = PyTuple_Size(kwnames);
    for (Py_ssize_t k = 0; k < nkw; k++) {
      int j = find_param(c, PyTuple_GetItem(kwnames, k));
      if (j < 0 || slot[j] != NULL)
        return 0;
      slot[j] = args[nargs + k];
    }
  }
  role[R_ARG] = Py_None; /* all-gather has none */
  for (int j = 0; j < c->nparams; j++) {
    const Param *p = &c->params[j];
    PyObject *v = slot[j];
    if (v == NULL) {
      if (p->presence == REQUIRED)
        return 0;
      v = p->presence == DEFAULT_SUM ? s_sum : Py_None;
    }
    role[p->role] = v;
  }
  return role[R_STREAM] == Py_None;
}

/* A public collective: the call made here, or handed to the Python function as it came. */
static PyObject *entry(int which, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
  Collective *c = &collectives[which];
  if (enabled) {
    PyObject *role[N_ROLES];
    PyObject *result;
    if (parse(c, args, nargs, kwnames, role) &&
        collective(c, role[R_COMM], role[R_INP], role[R_OUT], role[R_ARG], &result))
      return result;
    declined++;
  }
  return call_python(c, args, nargs, kwnames);
}

#define COLLECTIVE_ENTRY(fn, which)                                                                        \
  static PyObject *fn(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {        \
    (void)self;                                                                                            \
    return entry(which, args, nargs, kwnames);                                                             \
  }
COLLECTIVE_ENTRY(py_all_reduce, ALL_REDUCE)
COLLECTIVE_ENTRY(py_all_gather, ALL_GATHER)
COLLECTIVE_ENTRY(py_reduce_scatter, REDUCE_SCATTER)
COLLECTIVE_ENTRY(py_broadcast, BROADCAST)

/* The builtins' definitions; their docstrings are set by publish (the Python functions' own). */
static PyMethodDef public_defs[N_COLLECTIVES] = {
    {"all_reduce", (PyCFunction)(void (*)(void))py_all_reduce, METH_FASTCALL | METH_KEYWORDS, NULL},
    {"all_gather", (PyCFunction)(void (*)(void))py_all_gather, METH_FASTCALL | METH_KEYWORDS, NULL},
    {"reduce_scatter", (PyCFunction)(void (*)(void))py_reduce_scatter, METH_FASTCALL | METH_KEYWORDS, NULL},
    {"broadcast", (PyCFunction)(void (*)(void))py_broadcast, METH_FASTCALL | METH_KEYWORDS, NULL},
};

/* ---- the module's functions ---- */

/* *slot = v (a new reference taken here), dropping what it held. */
static void replace(PyObject **slot, PyObject *v) {
  PyObject *old = *slot;
  Py_INCREF(v);
  *slot = v;
  Py_XDECREF(old);
}

static void forget_types(void) {
  for (int i = 0; i < ntypes; i++) {
    Py_CLEAR(types[i].type);
    Py_CLEAR(types[i].dtypes);
    Py_CLEAR(types[i].stream);
    Py_CLEAR(types[i].last_dtype);
  }
  ntypes = 0;
}

static void forget_functions(void) {
  for (int i = 0; i < N_COLLECTIVES; i++) {
    Py_CLEAR(collectives[i].bound);
    collectives[i].address = NULL;
  }
}

/* configure(fns, ops, other_ops, ReduceOp, Communicator, itemsizes, tlog, failure): starts afresh (no
 * function, no buffer type) with these; collectives.py calls it at import (a reload calls it again). */
static PyObject *py_configure(PyObject *self, PyObject *args) {
  (void)self;
  PyObject *f, *o, *oo, *ro, *cm, *sizes, *tl, *fail;
  if (!PyArg_ParseTuple(args, "O!O!O!OOOOO:configure", &PyDict_Type, &f, &PyDict_Type, &o, &PyDict_Type, &oo, &ro,
                        &cm, &sizes, &tl, &fail))
    return NULL;
  if (!PyCallable_Check(fail)) {
    PyErr_SetString(PyExc_TypeError, "_fastcall.configure: failure must be callable");
    return NULL;
  }
  long long sz[N_DTYPES];
  if (PySequence_Size(sizes) != N_DTYPES) {
    PyErr_Clear();
    PyErr_SetString(PyExc_ValueError, "_fastcall.configure: itemsizes must hold the 10 element sizes");
    return NULL;
  }
  for (int i = 0; i < N_DTYPES; i++) {
    if (!take_ll(PySequence_GetItem(sizes, i), 1, 17, &sz[i])) {
      PyErr_Clear();
      PyErr_SetString(PyExc_ValueError, "_fastcall.configure: an element size is not an int in [1, 16]");
      return NULL;
    }
  }
  forget_types();
  forget_functions();
  Py_CLEAR(comm_last);
  replace(&fns, f);
  replace(&ops, o);
  replace(&other_ops, oo);
  replace(&reduce_op, ro);
  replace(&communicator, cm);
  replace(&tlog, tl);
  replace(&failure, fail);
  for (int i = 0; i < N_DTYPES; i++)
    itemsize[i] = sz[i];
  Py_RETURN_NONE;
}

/* set_function(index, bound, address): the C function of collective `index` (collectives._NAMES' order)
 * is at `address` (0: none) while _fns holds `bound` under its name. */
static PyObject *py_set_function(PyObject *self, PyObject *args) {
  (void)self;
  int index;
  PyObject *bound, *address;
  if (!PyArg_ParseTuple(args, "iOO:set_function", &index, &bound, &address))
    return NULL;
  if (index < 0 || index >= N_COLLECTIVES) {
    PyErr_Format(PyExc_IndexError, "_fastcall.set_function: no collective %d", index);
    return NULL;
  }
  void *p = PyLong_AsVoidPtr(address);
  if (p == NULL && PyErr_Occurred())
    return NULL;
  Collective *c = &collectives[index];
  replace(&c->bound, bound);
  c->address = p;
  Py_RETURN_NONE;
}

/* add_type(type, kind, dtypes, stream): buffers of exactly `type` are torch tensors (kind 0; stream:
 * f(device) -> raw stream) or cupy arrays (kind 1; stream: cupy.cuda.get_current_stream). False when
 * the table is full (that type's calls are then Python's). */
static PyObject *py_add_type(PyObject *self, PyObject *args) {
  (void)self;
  PyObject *tp, *dtypes, *stream;
  int kind;
  if (!PyArg_ParseTuple(args, "OiO!O:add_type", &tp, &kind, &PyDict_Type, &dtypes, &stream))
    return NULL;
  if (!PyType_Check(tp) || (kind != TORCH && kind != CUPY) || !PyCallable_Check(stream)) {
    PyErr_SetString(PyExc_TypeError, "_fastcall.add_type: (type, 0 or 1, dict, callable)");
    return NULL;
  }
  BufferType *bt = find_type(tp);
  if (bt == NULL) {
    if (ntypes == MAX_TYPES)
      Py_RETURN_FALSE;
    bt = &types[ntypes++];
    Py_INCREF(tp);
    bt->type = tp;
  }
  bt->kind = kind;
  bt->per_device = -1;
  bt->cupy_direct = -1;
  bt->tensor_offset = -1;
  bt->borrowed_offset = 0;
  bt->shim_checked = 0;
  bt->stream_checked = 0;
  memset(bt->dtype_of_scalar, -1, sizeof bt->dtype_of_scalar);
  Py_CLEAR(bt->last_dtype);
  replace(&bt->dtypes, dtypes);
  replace(&bt->stream, stream);
  Py_RETURN_TRUE;
}

/* publish(index, function, text_signature, module): the public builtin of collective `index`
 * (collectives._NAMES' order), which hands every call it does not make to `function` (collectives.py's),
 * with `function`'s docstring after `text_signature` (as "($module, tensor, op='sum', *, ...)": what
 * inspect.signature reads) and __module__ `module`. Publishing again (a reload) changes the function and
 * the docstring of the builtins published before as well. */
static PyObject *py_publish(PyObject *self, PyObject *args) {
  int index;
  PyObject *function, *module_name;
  const char *signature;
  if (!PyArg_ParseTuple(args, "iOsU:publish", &index, &function, &signature, &module_name))
    return NULL;
  if (index < 0 || index >= N_COLLECTIVES || !PyCallable_Check(function)) {
    PyErr_SetString(PyExc_TypeError, "_fastcall.publish: (index of a collective, callable, str, str)");
    return NULL;
  }
  Collective *c = &collectives[index];
  PyObject *doc = PyObject_GetAttr(function, s_doc);
  if (doc == NULL)
    return NULL;
  const char *text = "";
  Py_ssize_t len = 0;
  if (PyUnicode_Check(doc) && (text = PyUnicode_AsUTF8AndSize(doc, &len)) == NULL) {
    Py_DECREF(doc);
    return NULL;
  }
  const char *name = public_defs[index].ml_name;
  size_t size = strlen(name) + strlen(signature) + 5 + (size_t)len + 1;
  char *made = malloc(size);
  if (made == NULL) {
    Py_DECREF(doc);
    return PyErr_NoMemory();
  }
  snprintf(made, size, "%s%s\n--\n\n%s", name, signature, text);
  Py_DECREF(doc);
  PyObject *builtin = PyCFunction_NewEx(&public_defs[index], self, module_name);
  if (builtin == NULL) {
    free(made);
    return NULL;
  }
  char *old = c->doc;
  public_defs[index].ml_doc = c->doc = made;
  free(old);
  replace(&c->python, function);
  return builtin;
}

/* enable(on): whether the builtins make calls themselves (else every call is the Python function's). */
static PyObject *py_enable(PyObject *self, PyObject *on) {
  (void)self;
  int v = PyObject_IsTrue(on);
  if (v < 0)
    return NULL;
  enabled = v;
  Py_RETURN_NONE;
}

/* shim_state(): (1 on, 0 off, -1 not looked up yet; why off; tensors read through torch's C shim; streams
 * read through it). */
static PyObject *py_shim_state(PyObject *self, PyObject *unused) {
  (void)self;
  (void)unused;
  return Py_BuildValue("(isKK)", shim.state, shim.why_off, shim.reads, shim.stream_reads);
}

/* stats(): (calls made here, calls left to Python) since the module was loaded. */
static PyObject *py_stats(PyObject *self, PyObject *unused) {
  (void)self;
  (void)unused;
  return Py_BuildValue("(KK)", taken, declined);
}

static PyMethodDef methods[] = {
    {"configure", py_configure, METH_VARARGS,
     "configure(fns, ops, other_ops, ReduceOp, Communicator, itemsizes, tlog, failure): start afresh"},
    {"set_function", py_set_function, METH_VARARGS,
     "set_function(index, bound, address): the C function to call while fns holds bound"},
    {"add_type", py_add_type, METH_VARARGS, "add_type(type, kind, dtypes, stream): a torch (0) or cupy (1) type"},
    {"publish", py_publish, METH_VARARGS,
     "publish(index, function, text_signature, module): the public builtin of a collective"},
    {"enable", py_enable, METH_O, "enable(on): whether the builtins make calls themselves"},
    {"stats", py_stats, METH_NOARGS, "stats(): (calls made here, calls left to Python)"},
    {"shim_state", py_shim_state, METH_NOARGS,
     "shim_state(): (1 on / 0 off / -1 not looked up, why off, tensors and streams read through torch's C shim)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "mscclpp._fastcall",
    "The collectives' per-call work in C for torch tensors and cupy arrays (see _fastcall.c).", -1, methods,
    NULL, NULL, NULL, NULL,
};

static int intern(PyObject **slot, const char *name) {
  *slot = PyUnicode_InternFromString(name);
  return *slot != NULL;
}

/* A function of the running CPython: from the process's symbols, else from the library that holds the
 * C API (an embedding application may have loaded libpython without exporting its symbols). */
static void *python_symbol(const char *name) {
  void *p = dlsym(RTLD_DEFAULT, name);
  Dl_info info;
  if (p == NULL && dladdr((void *)&PyObject_GetAttr, &info) && info.dli_fname != NULL) {
    void *lib = dlopen(info.dli_fname, RTLD_LAZY | RTLD_NOLOAD);
    if (lib != NULL) {
      p = dlsym(lib, name);
      dlclose(lib);
    }
  }
  return p;
}

PyMODINIT_FUNC PyInit__fastcall(void) {
  /* Built for the stable ABI of 3.10: older Pythons (which would load the file) take the ctypes path. */
  int major = 0, minor = 0;
  if (sscanf(Py_GetVersion(), "%d.%d", &major, &minor) != 2 || major < 3 || (major == 3 && minor < 10)) {
    PyErr_Format(PyExc_ImportError, "mscclpp._fastcall needs CPython >= 3.10, not %d.%d", major, minor);
    return NULL;
  }
  if (!(intern(&s_st, "_st") && intern(&s_fast, "_fast") && intern(&s_sum, "sum") &&
        intern(&s_device_id, "device_id") && intern(&s_c_contiguous_direct, "_c_contiguous") &&
        intern(&s_is_cuda, "is_cuda") && intern(&s_dtype, "dtype") && intern(&s_is_contiguous, "is_contiguous") &&
        intern(&s_data_ptr, "data_ptr") && intern(&s_numel, "numel") && intern(&s_get_device, "get_device") &&
        intern(&s_size, "size") && intern(&s_flags, "flags") && intern(&s_c_contiguous, "c_contiguous") &&
        intern(&s_data, "data") && intern(&s_ptr, "ptr") && intern(&s_id, "id") && intern(&s_logged, "logged") &&
        intern(&s_device, "device") && intern(&s_doc, "__doc__") && intern(&s_cdata, "_cdata") &&
        intern(&s_basicsize, "__basicsize__")))
    return NULL;
  for (int i = 0; i < N_COLLECTIVES; i++) {
    if (!intern(&collectives[i].key, collectives[i].name))
      return NULL;
    for (int j = 0; j < collectives[i].nparams; j++)
      if (!intern(&collectives[i].params[j].key, collectives[i].params[j].name))
        return NULL;
  }
  *(void **)&vectorcall = python_symbol("PyObject_Vectorcall");
  *(void **)&vectorcall_method = python_symbol("PyObject_VectorcallMethod");
  PyObject *m = PyModule_Create(&module);
  /* What collectives.py checks before using the module: a build of another interface (a stale file beside
   * newer Python code) is not used. Raise it with any change of the functions' arguments or meaning. */
  if (m != NULL && (PyModule_AddIntConstant(m, "INTERFACE", 2) < 0 ||
                    PyModule_AddIntConstant(m, "VECTORCALL", (vectorcall != NULL) + 2 * (vectorcall_method != NULL)) < 0)) {
    Py_DECREF(m);
    return NULL;
  }
  return m;
}
