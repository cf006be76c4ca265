/*
 * mscclpp._fastcall: the collectives' per-call work in C, for torch tensors and cupy arrays.
 *
 * Why: an eager mscclpp.all_reduce of a small tensor cost about 6 us more from Python than from C, of
 * which ctypes' call took 1.7 us and the package's Python work (attribute reads, dict lookups, checks)
 * about 4 us. Here the same reads, checks and the library call are made from C: the tensor's accessors
 * through the C API, the library function through its address, with no ctypes conversions.
 *
 * How it fits (collectives.py): each of the package's four collectives calls its counterpart here first,
 * unless it was given stream=. That one returns the output when it called the library and the call
 * succeeded, raises the package's exception (_log.failure's, as the Python path raises it) when the
 * library failed, and returns None when anything is unusual: a buffer type not registered, a value of an
 * unexpected type, a check that would fail, a communicator before its first call, a library function
 * replaced by a Python one, ... Then no library function was called, no exception is pending, and the
 * Python code makes the call as before (and raises its precise error). So every message and every rule
 * stays in Python; this file only knows the conditions under which Python's path calls the library,
 * and then makes that same call.
 *
 * What Python hands over once (configure, set_function, add_type): the dict of the C functions the
 * collectives call (_fns) and the address of each, the operator tables (_OPS, _OTHER_OPS), the types
 * ReduceOp and Communicator, the element sizes, the per-thread log count and _log.failure, and per buffer
 * type (as collectives._resolve finds it) the framework's dtype table and stream accessor.
 *
 * Built against the stable ABI (Py_LIMITED_API 3.8): one _fastcall.abi3.so loads into every CPython from
 * 3.8 on (not the free-threaded builds, which refuse abi3 modules: the package then uses ctypes). Its
 * tables are changed and read with the GIL held; the GIL is released around the library call alone (the
 * library may block, and its log handler takes the GIL itself).
 */
#define PY_SSIZE_T_CLEAN
#define Py_LIMITED_API 0x03080000
#include <Python.h>

#include <stddef.h>

#ifndef METH_FASTCALL
/* In the stable ABI from 3.10; CPython 3.7 to 3.9 take the same flag with the same signature. It spares
 * the argument tuple that METH_VARARGS builds per call. */
#define METH_FASTCALL 0x0080
#endif

/* Bounds within which the overlap arithmetic below (int64) cannot overflow: buffer addresses below 2^61,
 * element counts below 2^56, so a buffer's bytes stay below 2^59 (the side of nranks pieces too: its count
 * is a buffer's). Anything beyond is left to Python's exact integers. */
#define MAX_ADDRESS (1ULL << 61)
#define MAX_COUNT (1LL << 56)
#define N_DTYPES 10 /* mscclppDataType_t: 0 .. 9 */

/* ---- what Python hands over ---- */

enum { TORCH = 0, CUPY = 1 };

/* A buffer type (exact type, subclasses are registered one by one, as collectives._adapters keys them). */
typedef struct {
  PyObject *type;
  int kind;
  PyObject *dtypes; /* dtype -> mscclppDataType_t (int) */
  PyObject *stream; /* torch: f(device) -> raw stream; cupy: get_current_stream */
  int per_device;   /* cupy: whether get_current_stream takes a device (-1: not known yet) */
} BufferType;

#define MAX_TYPES 16
static BufferType types[MAX_TYPES];
static int ntypes;

typedef int (*call_with_arg)(void *, void *, size_t, int, int, void *, void *);
typedef int (*call_without_arg)(void *, void *, size_t, int, void *, void *);

enum { NO_ARG, OP_ARG, ROOT_ARG };

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
  PyObject *key;    /* the name, as a str: its key in _fns */
  PyObject *bound;  /* the object _fns holds for it when `address` is the function to call */
  void *address;
} Collective;

enum { ALL_REDUCE, ALL_GATHER, REDUCE_SCATTER, BROADCAST, N_COLLECTIVES };

static Collective collectives[N_COLLECTIVES] = {
    {"mscclppAllReduce", OP_ARG, 0, 0, 0, 1, NULL, NULL, NULL},
    {"mscclppAllGather", NO_ARG, 0, 1, 1, 0, NULL, NULL, NULL},
    {"mscclppReduceScatter", OP_ARG, 1, 0, -1, 0, NULL, NULL, NULL},
    {"mscclppBroadcast", ROOT_ARG, 0, 0, 0, 1, NULL, NULL, NULL},
};

static PyObject *fns;         /* collectives._fns */
static PyObject *ops;         /* collectives._OPS */
static PyObject *other_ops;   /* collectives._OTHER_OPS */
static PyObject *reduce_op;   /* collectives.ReduceOp */
static PyObject *communicator; /* comm.Communicator */
static PyObject *tlog;         /* _log._state: per thread, `logged` counts the library's log lines */
static PyObject *failure;      /* _log.failure(name, rc, mark): the exception of a failed call */
static long long itemsize[N_DTYPES];
static unsigned long long taken, declined; /* calls made here, calls left to Python (stats()) */

/* Attribute names, interned once. */
static PyObject *s_st, *s_handle, *s_device, *s_library_has_gpu, *s_size, *s_rank;
static PyObject *s_is_cuda, *s_dtype, *s_is_contiguous, *s_data_ptr, *s_numel, *s_get_device;
static PyObject *s_flags, *s_c_contiguous, *s_data, *s_ptr, *s_id, *s_logged;

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

static int take_ll(PyObject *v, long long lo, long long hi, long long *out) {
  if (v == NULL)
    return 0;
  int ok = 0;
  if (PyLong_Check(v)) {
    int overflow = 0;
    long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
    if (!overflow && !(x == -1 && PyErr_Occurred()) && x >= lo && x < hi) {
      *out = x;
      ok = 1;
    }
  }
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

/* A handle (the communicator's, a stream's): any 64-bit value, passed on as it is. */
static int take_handle(PyObject *v, void **out) {
  if (v == NULL)
    return 0;
  int ok = 0;
  if (PyLong_Check(v)) {
    unsigned long long x = PyLong_AsUnsignedLongLong(v);
    if (!(x == (unsigned long long)-1 && PyErr_Occurred())) {
      *out = (void *)(size_t)x;
      ok = 1;
    }
  }
  Py_DECREF(v);
  return ok;
}

static int take_dtype(PyObject *dt, PyObject *table, int *out) {
  if (dt == NULL)
    return 0;
  PyObject *code = PyDict_GetItemWithError(table, dt); /* borrowed */
  Py_DECREF(dt);
  long long c;
  if (code == NULL)
    return 0;
  Py_INCREF(code);
  if (!take_ll(code, 0, N_DTYPES, &c))
    return 0;
  *out = (int)c;
  return 1;
}

static PyObject *method(PyObject *o, PyObject *name) { return PyObject_CallMethodObjArgs(o, name, NULL); }

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

/* The communicator's state, only where collectives.py would call the library directly: a Communicator
 * (exactly), open, whose library has taken its GPU (before, Python makes the GPU current: _first_calls). */
static int read_comm(PyObject *comm, Comm *c) {
  if ((PyObject *)Py_TYPE(comm) != communicator)
    return 0;
  PyObject *st = PyObject_GetAttr(comm, s_st);
  if (st == NULL)
    return 0;
  int ok = take_true(PyObject_GetAttr(st, s_library_has_gpu)) &&
           take_handle(PyObject_GetAttr(st, s_handle), &c->handle) &&
           take_ll(PyObject_GetAttr(st, s_device), 0, 1 << 30, &c->device) &&
           take_ll(PyObject_GetAttr(st, s_size), 1, 1LL << 31, &c->size) &&
           take_ll(PyObject_GetAttr(st, s_rank), 0, c->size, &c->rank);
  Py_DECREF(st);
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
  if (v == NULL)
    return 0;
  Py_INCREF(v);
  if (!take_ll(v, 0, 5, &c))
    return 0;
  *code = (int)c;
  return 1;
}

/* As broadcast's check: an int (exactly) in the C int range; anything else is Python's (_int32). */
static int read_root(PyObject *root, int *out) {
  long long r;
  if (Py_TYPE(root) != &PyLong_Type)
    return 0;
  Py_INCREF(root);
  if (!take_ll(root, -(1LL << 31), 1LL << 31, &r))
    return 0;
  *out = (int)r;
  return 1;
}

/* ---- buffers ---- */

/* A buffer as read, with its type's entry. The entry's objects are held (strong references) for the call:
 * the accessors may run Python code, and another thread may then reconfigure the table. */
typedef struct {
  BufferType *slot; /* for cupy's per_device, an int: a stale slot costs a second look, nothing more */
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

/* As collectives._Torch.info, where it returns: a CUDA tensor of a known dtype, contiguous. */
static int read_torch(PyObject *t, Buffer *b) {
  return take_true(PyObject_GetAttr(t, s_is_cuda)) &&
         take_dtype(PyObject_GetAttr(t, s_dtype), b->dtypes, &b->dtype) &&
         take_true(method(t, s_is_contiguous)) && take_address(method(t, s_data_ptr), &b->ptr) &&
         take_ll(method(t, s_numel), 0, MAX_COUNT, &b->count) &&
         take_ll(method(t, s_get_device), 0, 1 << 30, &b->device);
}

/* As collectives._Cupy.info, where it returns: a known dtype, C-contiguous. */
static int read_cupy(PyObject *a, Buffer *b) {
  return take_dtype(PyObject_GetAttr(a, s_dtype), b->dtypes, &b->dtype) &&
         take_true(attr_of(PyObject_GetAttr(a, s_flags), s_c_contiguous)) &&
         take_address(attr_of(PyObject_GetAttr(a, s_data), s_ptr), &b->ptr) &&
         take_ll(PyObject_GetAttr(a, s_size), 0, MAX_COUNT, &b->count) &&
         take_ll(attr_of(PyObject_GetAttr(a, s_device), s_id), 0, 1 << 30, &b->device);
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
  PyObject *dev = PyLong_FromLongLong(b->device);
  if (dev == NULL)
    return 0;
  int ok = 0;
  if (b->kind == TORCH) {
    ok = take_handle(PyObject_CallFunctionObjArgs(b->stream, dev, NULL), out);
  } else {
    /* cupy >= 11 takes the device (its current stream is per device); older ones take nothing, which
     * their TypeError tells, once. */
    int per_device = b->slot->per_device;
    if (per_device != 0) {
      ok = take_handle(attr_of(PyObject_CallFunctionObjArgs(b->stream, dev, NULL), s_ptr), out);
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

static PyObject *decline(void) {
  PyErr_Clear();
  declined++;
  Py_RETURN_NONE;
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

/* The one path of the four collectives: the checks of collectives.py's fast path, then the library call.
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
 * what a call uses of its tables is held for the call (the function's owner, the buffer types' objects). */
static PyObject *collective(const Collective *c, PyObject *comm, PyObject *inp, PyObject *out, PyObject *arg) {
  if (!function_in_place(c))
    return decline();
  PyObject *bound = c->bound; /* keeps the function alive (a ctypes callback's code lives in it) */
  void *address = c->address;
  Py_INCREF(bound);
  Buffer in = {0}, o = {0};
  PyObject *result = NULL;
  int called = checked_call(c, address, comm, inp, out, arg, &in, &o, &result);
  release(&in);
  release(&o);
  Py_DECREF(bound);
  return called ? result : decline();
}

/* ---- the module's functions ---- */

/* all_reduce, all_gather, reduce_scatter, broadcast: (comm, inp, out, arg), arg the operator (all-reduce,
 * reduce-scatter), the root (broadcast) or None (all-gather); out None means in place for all-reduce and
 * broadcast. Returns the output when the library call succeeded, raises the package's exception when it
 * failed, and returns None when the call is left to Python (nothing was called). */
static PyObject *dispatch(int which, PyObject *const *args, Py_ssize_t nargs) {
  if (nargs != 4) {
    PyErr_Format(PyExc_TypeError, "_fastcall: %s takes (comm, inp, out, arg), 4 arguments, not %zd",
                 collectives[which].name, nargs);
    return NULL;
  }
  return collective(&collectives[which], args[0], args[1], args[2], args[3]);
}

#define COLLECTIVE_ENTRY(fn, which)                                                                        \
  static PyObject *fn(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {                           \
    (void)self;                                                                                            \
    return dispatch(which, args, nargs);                                                                   \
  }
COLLECTIVE_ENTRY(py_all_reduce, ALL_REDUCE)
COLLECTIVE_ENTRY(py_all_gather, ALL_GATHER)
COLLECTIVE_ENTRY(py_reduce_scatter, REDUCE_SCATTER)
COLLECTIVE_ENTRY(py_broadcast, BROADCAST)

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
  replace(&bt->dtypes, dtypes);
  replace(&bt->stream, stream);
  Py_RETURN_TRUE;
}

/* stats(): (calls made here, calls left to Python) since the module was loaded. */
static PyObject *py_stats(PyObject *self, PyObject *unused) {
  (void)self;
  (void)unused;
  return Py_BuildValue("(KK)", taken, declined);
}

static PyMethodDef methods[] = {
    {"all_reduce", (PyCFunction)(void (*)(void))py_all_reduce, METH_FASTCALL,
     "all_reduce(comm, tensor, out, op): the output, or None (left to Python)"},
    {"all_gather", (PyCFunction)(void (*)(void))py_all_gather, METH_FASTCALL,
     "all_gather(comm, inp, out, None): the output, or None (left to Python)"},
    {"reduce_scatter", (PyCFunction)(void (*)(void))py_reduce_scatter, METH_FASTCALL,
     "reduce_scatter(comm, inp, out, op): the output, or None (left to Python)"},
    {"broadcast", (PyCFunction)(void (*)(void))py_broadcast, METH_FASTCALL,
     "broadcast(comm, tensor, out, root): the output, or None (left to Python)"},
    {"configure", py_configure, METH_VARARGS,
     "configure(fns, ops, other_ops, ReduceOp, Communicator, itemsizes, tlog, failure): start afresh"},
    {"set_function", py_set_function, METH_VARARGS,
     "set_function(index, bound, address): the C function to call while fns holds bound"},
    {"add_type", py_add_type, METH_VARARGS, "add_type(type, kind, dtypes, stream): a torch (0) or cupy (1) type"},
    {"stats", py_stats, METH_NOARGS, "stats(): (calls made here, calls left to Python)"},
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

PyMODINIT_FUNC PyInit__fastcall(void) {
  if (!(intern(&s_st, "_st") && intern(&s_handle, "_handle") && intern(&s_device, "device") &&
        intern(&s_library_has_gpu, "library_has_gpu") && intern(&s_size, "size") && intern(&s_rank, "rank") &&
        intern(&s_is_cuda, "is_cuda") && intern(&s_dtype, "dtype") && intern(&s_is_contiguous, "is_contiguous") &&
        intern(&s_data_ptr, "data_ptr") && intern(&s_numel, "numel") && intern(&s_get_device, "get_device") &&
        intern(&s_flags, "flags") && intern(&s_c_contiguous, "c_contiguous") && intern(&s_data, "data") &&
        intern(&s_ptr, "ptr") && intern(&s_id, "id") && intern(&s_logged, "logged")))
    return NULL;
  for (int i = 0; i < N_COLLECTIVES; i++)
    if (!intern(&collectives[i].key, collectives[i].name))
      return NULL;
  PyObject *m = PyModule_Create(&module);
  /* What collectives.py checks before using the module: a build of another interface (a stale file beside
   * newer Python code) is not used. Raise it with any change of the functions' arguments or meaning. */
  if (m != NULL && PyModule_AddIntConstant(m, "INTERFACE", 1) < 0) {
    Py_DECREF(m);
    return NULL;
  }
  return m;
}
