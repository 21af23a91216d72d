/* The rows a batch's handler emits, kept in C: batch.emit is this type's add, called
   once a row, and what it costs is most of what a sink adds to a handler process.
   Built into the package as mldserver.rows._emitted when a C compiler is there at
   install time (setup.py); emitted.py keeps the same collector in Python without it.

       >>> from mldserver.rows._emitted import Collector
       >>> rows = Collector()
       >>> rows.add(record, {"k": 1})                  # orjson.dumps(row, None, OPT_APPEND_NEWLINE),
       >>> rows.add(record, {"k": 2}, 1763719200000)   # written at once into one buffer
       >>> rows.add(record, {"k": {1}})                # not JSON: set aside, with why
       >>> len(rows), bytes(rows.view()), rows.ends()
       (2, b'{"k":1}\n{"k":2}\n', b'...')             # ends: n native uint64, where each line ends
       >>> rows.records, rows.times, rows.timed, rows.bad
       ([record, record], [None, 1763719200000], 1, [(record, 'row not JSON-encodable: ...')])
       >>> rows.one_for_one([record])                  # False: 2 rows for 1 record (a passthrough's: True)
       >>> rows.truncate(1); rows.close()              # a failed attempt's rows taken back; the call is over
       >>> rows.add(record, {"k": 3})
       RuntimeError: batch.emit called after process_records returned: ...

   One row costs its orjson.dumps and a copy of its line: no Python frame, no method
   looked up, no list of sizes (a passthrough handler's 10,000 rows of 350 B: 6.0 ms a
   batch with emit in Python, of which 3.5 ms orjson). A row is what it was at its emit:
   its JSON line is written at once. The buffer is exported read-only by view() (the
   lines sent as they lie); while a view is held, add and truncate raise BufferError. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stdint.h>
#include <string.h>

static PyObject *dumps;   /* orjson.dumps */
static PyObject *option;  /* orjson.OPT_APPEND_NEWLINE */

static const char AFTER_THE_CALL[] =
    "batch.emit called after process_records returned: the row is not kept; emit inside the call "
    "(await the tasks that emit before returning)";

typedef struct {
    PyObject_HEAD
    char *buf;
    Py_ssize_t len, cap;    /* bytes of lines written; allocated */
    uint64_t *ends;
    Py_ssize_t n, ncap;     /* rows; allocated */
    PyObject *records;      /* list: each row's record */
    PyObject *times;        /* list: each row's event time as given (None: none given) */
    PyObject *bad;          /* list of (record, why): rows orjson could not encode */
    Py_ssize_t timed;       /* rows given an event time (not None) */
    Py_ssize_t exports;     /* views of the buffer held */
    int closed;
} Collector;

static int grow(void **p, Py_ssize_t *cap, Py_ssize_t need, size_t item) {
    if (need <= *cap) return 0;
    Py_ssize_t cap2 = *cap ? *cap : 256;
    while (cap2 < need) cap2 *= 2;
    void *q = PyMem_Realloc(*p, (size_t)cap2 * item);
    if (q == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    *p = q;
    *cap = cap2;
    return 0;
}

/* The largest buffers a collector let go of, for the next one to start with: a batch's
   lines grow to megabytes, and buffers taken afresh each batch were grown a dozen times
   and their pages faulted in again (a handler process gives its free pages back every
   second: pool/malloc.py). One spare of each kind, of at most SPARE_MAX bytes; under the
   GIL, like everything here. */
#define SPARE_MAX ((Py_ssize_t)64 << 20)
static void *spare_buf, *spare_ends;
static Py_ssize_t spare_cap, spare_ncap;

static void adopt(void **p, Py_ssize_t *cap, void **spare, Py_ssize_t *spare_cap) {
    if (*p == NULL && *spare != NULL) {
        *p = *spare;
        *cap = *spare_cap;
        *spare = NULL;
        *spare_cap = 0;
    }
}

static void let_go(void *p, Py_ssize_t cap, size_t item, void **spare, Py_ssize_t *spare_cap) {
    if (p != NULL && cap * (Py_ssize_t)item <= SPARE_MAX && cap > *spare_cap) {
        PyMem_Free(*spare);
        *spare = p;
        *spare_cap = cap;
    } else {
        PyMem_Free(p);
    }
}

/* -1 with BufferError while a view of the lines is held (they may move or be cut). */
static int unheld(Collector *self) {
    if (self->exports) {
        PyErr_SetString(PyExc_BufferError, "the rows are being sent (a view of them is held): none may be added "
                                            "or taken back");
        return -1;
    }
    return 0;
}

/* One line appended as it is, with its record and time. */
static int append(Collector *self, PyObject *record, const char *line, Py_ssize_t size, PyObject *t) {
    adopt((void **)&self->buf, &self->cap, &spare_buf, &spare_cap);
    adopt((void **)&self->ends, &self->ncap, &spare_ends, &spare_ncap);
    if (grow((void **)&self->buf, &self->cap, self->len + size, 1) < 0 ||
        grow((void **)&self->ends, &self->ncap, self->n + 1, sizeof(uint64_t)) < 0)
        return -1;
    if (PyList_Append(self->records, record) < 0) return -1;
    if (PyList_Append(self->times, t) < 0) {
        Py_ssize_t k = PyList_GET_SIZE(self->records);
        PyList_SetSlice(self->records, k - 1, k, NULL);
        return -1;
    }
    memcpy(self->buf + self->len, line, (size_t)size);
    self->len += size;
    self->ends[self->n++] = (uint64_t)self->len;
    if (t != Py_None) self->timed++;
    return 0;
}

static int unpack(PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames, const char *const *names, int required,
                  int total, PyObject **out, const char *fname) {
    if (nargs > total) {
        PyErr_Format(PyExc_TypeError, "%s() takes from %d to %d positional arguments but %zd were given", fname,
                     required, total, nargs);
        return -1;
    }
    for (int i = 0; i < total; i++) out[i] = i < nargs ? args[i] : NULL;
    Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    for (Py_ssize_t k = 0; k < nkw; k++) {
        PyObject *key = PyTuple_GET_ITEM(kwnames, k);
        int found = 0;
        for (int i = 0; i < total; i++) {
            if (PyUnicode_CompareWithASCIIString(key, names[i]) == 0) {
                if (out[i] != NULL) {
                    PyErr_Format(PyExc_TypeError, "%s() got multiple values for argument '%s'", fname, names[i]);
                    return -1;
                }
                out[i] = args[nargs + k];
                found = 1;
                break;
            }
        }
        if (!found) {
            PyErr_Format(PyExc_TypeError, "%s() got an unexpected keyword argument '%U'", fname, key);
            return -1;
        }
    }
    for (int i = 0; i < required; i++) {
        if (out[i] == NULL) {
            PyErr_Format(PyExc_TypeError, "%s() missing required argument: '%s'", fname, names[i]);
            return -1;
        }
    }
    return 0;
}

static PyObject *add(Collector *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    static const char *const names[] = {"record", "row", "event_time_ms"};
    PyObject *a[3];
    if (unpack(args, nargs, kwnames, names, 2, 3, a, "emit") < 0) return NULL;
    if (self->closed) {
        PyErr_SetString(PyExc_RuntimeError, AFTER_THE_CALL);
        return NULL;
    }
    if (unheld(self) < 0) return NULL;
    PyObject *t = a[2] ? a[2] : Py_None;
    PyObject *call[3] = {a[1], Py_None, option};
    PyObject *line = PyObject_Vectorcall(dumps, call, 3, NULL);
    if (line == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_TypeError)) return NULL;  /* (orjson.JSONEncodeError is one) */
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);
        PyErr_NormalizeException(&type, &value, &tb);
        PyObject *why = PyUnicode_FromFormat("row not JSON-encodable: %S", value ? value : Py_None);
        Py_XDECREF(type);
        Py_XDECREF(value);
        Py_XDECREF(tb);
        if (why == NULL) return NULL;
        PyObject *item = PyTuple_Pack(2, a[0], why);
        Py_DECREF(why);
        if (item == NULL) return NULL;
        int failed = PyList_Append(self->bad, item);
        Py_DECREF(item);
        if (failed < 0) return NULL;
        Py_RETURN_NONE;
    }
    int failed = append(self, a[0], PyBytes_AS_STRING(line), PyBytes_GET_SIZE(line), t);
    Py_DECREF(line);
    if (failed < 0) return NULL;
    Py_RETURN_NONE;
}

static PyObject *append_line(Collector *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "append_line(record, line, event_time_ms)");
        return NULL;
    }
    if (unheld(self) < 0) return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(args[1], &view, PyBUF_SIMPLE) < 0) return NULL;
    int failed = append(self, args[0], view.buf, view.len, args[2]);
    PyBuffer_Release(&view);
    if (failed < 0) return NULL;
    Py_RETURN_NONE;
}

static PyObject *truncate_(Collector *self, PyObject *arg) {
    Py_ssize_t n = PyNumber_AsSsize_t(arg, PyExc_OverflowError);
    if (n == -1 && PyErr_Occurred()) return NULL;
    if (n < 0) n = 0;
    if (n >= self->n) Py_RETURN_NONE;
    if (unheld(self) < 0) return NULL;
    if (PyList_SetSlice(self->records, n, PY_SSIZE_T_MAX, NULL) < 0 ||
        PyList_SetSlice(self->times, n, PY_SSIZE_T_MAX, NULL) < 0)
        return NULL;
    self->n = n;
    self->len = n ? (Py_ssize_t)self->ends[n - 1] : 0;
    self->timed = 0;
    for (Py_ssize_t i = 0; i < n; i++)
        if (PyList_GET_ITEM(self->times, i) != Py_None) self->timed++;
    Py_RETURN_NONE;
}

/* Is each row's record the record at that index of `records`, one for one (a
   passthrough's rows)? By identity, as the rows' record indexes are found. */
static PyObject *one_for_one(Collector *self, PyObject *records) {
    PyObject *seq = PySequence_Fast(records, "one_for_one(records): records must be a sequence");
    if (seq == NULL) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    int same = n == PyList_GET_SIZE(self->records);
    for (Py_ssize_t i = 0; same && i < n; i++) same = items[i] == PyList_GET_ITEM(self->records, i);
    Py_DECREF(seq);
    return PyBool_FromLong(same);
}

static PyObject *close_(Collector *self, PyObject *unused) {
    self->closed = 1;
    Py_RETURN_NONE;
}

static PyObject *lines_(Collector *self, PyObject *unused) {
    return PyBytes_FromStringAndSize(self->buf ? self->buf : "", self->len);
}

static PyObject *view_(Collector *self, PyObject *unused) {
    return PyMemoryView_FromObject((PyObject *)self);
}

static PyObject *ends_(Collector *self, PyObject *unused) {
    return PyBytes_FromStringAndSize(self->ends ? (const char *)self->ends : "", self->n * (Py_ssize_t)sizeof(uint64_t));
}

static int getbuffer(Collector *self, Py_buffer *view, int flags) {
    if ((flags & PyBUF_WRITABLE) == PyBUF_WRITABLE) {
        PyErr_SetString(PyExc_BufferError, "the rows' lines are read-only");
        view->obj = NULL;
        return -1;
    }
    int r = PyBuffer_FillInfo(view, (PyObject *)self, self->buf ? self->buf : (void *)"", self->len, 1, flags);
    if (r == 0) self->exports++;
    return r;
}

static void releasebuffer(Collector *self, Py_buffer *view) {
    self->exports--;
}

static Py_ssize_t length(Collector *self) {
    return self->n;
}

static int init(Collector *self, PyObject *args, PyObject *kwargs) {
    if (PyTuple_GET_SIZE(args) || (kwargs && PyDict_GET_SIZE(kwargs))) {
        PyErr_SetString(PyExc_TypeError, "Collector() takes no arguments");
        return -1;
    }
    if (unheld(self) < 0) return -1;
    Py_XSETREF(self->records, PyList_New(0));
    Py_XSETREF(self->times, PyList_New(0));
    Py_XSETREF(self->bad, PyList_New(0));
    if (!self->records || !self->times || !self->bad) return -1;
    self->len = self->n = self->timed = 0;
    self->closed = 0;
    return 0;
}

static int traverse(Collector *self, visitproc visit, void *arg) {
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(self->records);
    Py_VISIT(self->times);
    Py_VISIT(self->bad);
    return 0;
}

static int clear(Collector *self) {
    Py_CLEAR(self->records);
    Py_CLEAR(self->times);
    Py_CLEAR(self->bad);
    return 0;
}

static void dealloc(Collector *self) {
    PyTypeObject *type = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    clear(self);
    let_go(self->buf, self->cap, 1, &spare_buf, &spare_cap);
    let_go(self->ends, self->ncap, sizeof(uint64_t), &spare_ends, &spare_ncap);
    type->tp_free((PyObject *)self);
    Py_DECREF(type);
}

static PyMethodDef collector_methods[] = {
    {"add", (PyCFunction)(void (*)(void))add, METH_FASTCALL | METH_KEYWORDS,
     "add(record, row, event_time_ms=None): the row's JSON line written at once (orjson); a row "
     "orjson cannot encode is set aside in bad, with its record and why"},
    {"append_line", (PyCFunction)(void (*)(void))append_line, METH_FASTCALL,
     "append_line(record, line, event_time_ms): a JSON line already encoded (its newline included), kept as it "
     "is (closed or not)"},
    {"truncate", (PyCFunction)truncate_, METH_O, "truncate(n): only the first n rows stay"},
    {"one_for_one", (PyCFunction)one_for_one, METH_O,
     "one_for_one(records): is each row's record the one at its index in records (identity), as many rows as records?"},
    {"close", (PyCFunction)close_, METH_NOARGS, "the call is over: a later add raises RuntimeError, saying so"},
    {"lines", (PyCFunction)lines_, METH_NOARGS, "the rows' JSON lines, back to back (a copy)"},
    {"view", (PyCFunction)view_, METH_NOARGS,
     "the rows' JSON lines where they were written (read-only): no row may be added or taken back while it is held"},
    {"ends", (PyCFunction)ends_, METH_NOARGS, "where each row's line ends in lines(): n native uint64 (a copy)"},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef collector_members[] = {
    {"records", T_OBJECT_EX, offsetof(Collector, records), READONLY, "each row's record"},
    {"times", T_OBJECT_EX, offsetof(Collector, times), READONLY, "each row's event time as given (None: none given)"},
    {"bad", T_OBJECT_EX, offsetof(Collector, bad), READONLY, "(record, why) of each row orjson could not encode"},
    {"timed", T_PYSSIZET, offsetof(Collector, timed), READONLY, "rows given an event time (not None)"},
    {NULL, 0, 0, 0, NULL},
};

static PyType_Slot collector_slots[] = {
    {Py_tp_doc, "The rows a batch's handler emits: each one's JSON line, record and event time."},
    {Py_tp_init, init},
    {Py_tp_new, PyType_GenericNew},
    {Py_tp_dealloc, dealloc},
    {Py_tp_traverse, traverse},
    {Py_tp_clear, clear},
    {Py_tp_methods, collector_methods},
    {Py_tp_members, collector_members},
    {Py_sq_length, length},
    {Py_bf_getbuffer, getbuffer},
    {Py_bf_releasebuffer, releasebuffer},
    {0, NULL},
};

static PyType_Spec collector_spec = {
    "mldserver.rows._emitted.Collector", sizeof(Collector), 0,
    Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC, collector_slots,
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_emitted", NULL, -1, NULL};

PyMODINIT_FUNC PyInit__emitted(void) {
    PyObject *orjson = PyImport_ImportModule("orjson");
    if (orjson == NULL) return NULL;
    dumps = PyObject_GetAttrString(orjson, "dumps");
    option = PyObject_GetAttrString(orjson, "OPT_APPEND_NEWLINE");
    Py_DECREF(orjson);
    if (dumps == NULL || option == NULL) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    PyObject *type = PyType_FromSpec(&collector_spec);
    if (type == NULL || PyModule_AddObject(m, "Collector", type) < 0) {
        Py_XDECREF(type);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
