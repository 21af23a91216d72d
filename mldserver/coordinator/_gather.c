/* A window's rows copied into merged order in one native pass, row by row from the JSON
   lines of the batches they came in: the rows of shards that interleave in time, as the
   sink writes them (coordinator/merge.py). pyarrow's take, which did this, first copied
   whole each range of rows it took from, then the rows, and its arrays were built a
   block at a time in Python; here each row is copied once, with the GIL released.
   Built into the package as mldserver.coordinator._gather when a C compiler is there at
   install time (setup.py); merge.py falls back to pyarrow's take without it.

       >>> from mldserver.coordinator._gather import gather
       >>> import numpy as np
       >>> bodies = [b'{"k":1}\n{"k":3}\n', b'{"k":2}\n']        # two batches' JSON lines
       >>> part = np.array([0, 1, 0]); start = np.array([0, 0, 8]); end = np.array([8, 8, 16])
       >>> out = bytearray(24)
       >>> gather(out, bodies, part, start, end)                   # row i: bodies[part[i]][start[i]:end[i]]
       24
       >>> bytes(out)
       b'{"k":1}\n{"k":2}\n{"k":3}\n'

   part, start and end are native int64 buffers of one length; every range must lie
   inside its body and the rows must fit in out, or ValueError (nothing is copied). */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

static int int64s(PyObject *obj, Py_buffer *view, const char *name) {
    if (PyObject_GetBuffer(obj, view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) return -1;
    if (view->itemsize != 8 || (view->format && strcmp(view->format, "q") && strcmp(view->format, "l") &&
                                strcmp(view->format, "<q") && strcmp(view->format, "=q") &&
                                strcmp(view->format, "<l") && strcmp(view->format, "=l"))) {
        PyErr_Format(PyExc_TypeError, "%s must be native int64, not format %s", name,
                     view->format ? view->format : "B");
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

static PyObject *gather(PyObject *self, PyObject *args) {
    PyObject *out_obj, *bodies_obj, *part_obj, *start_obj, *end_obj;
    if (!PyArg_ParseTuple(args, "OOOOO:gather", &out_obj, &bodies_obj, &part_obj, &start_obj, &end_obj))
        return NULL;
    PyObject *bodies = PySequence_Fast(bodies_obj, "bodies must be a sequence of buffers");
    if (!bodies) return NULL;
    Py_ssize_t nb = PySequence_Fast_GET_SIZE(bodies);
    Py_buffer out = {0}, part = {0}, start = {0}, end = {0};
    Py_buffer *views = PyMem_Calloc(nb ? nb : 1, sizeof(Py_buffer));
    Py_ssize_t got = 0, written = 0;
    PyObject *result = NULL;
    if (!views) {
        PyErr_NoMemory();
        goto done;
    }
    for (; got < nb; got++)
        if (PyObject_GetBuffer(PySequence_Fast_GET_ITEM(bodies, got), &views[got], PyBUF_SIMPLE) < 0) goto done;
    if (PyObject_GetBuffer(out_obj, &out, PyBUF_WRITABLE) < 0) goto done;
    if (int64s(part_obj, &part, "part") < 0) goto done;
    if (int64s(start_obj, &start, "start") < 0) goto done;
    if (int64s(end_obj, &end, "end") < 0) goto done;
    Py_ssize_t n = part.len / 8;
    if (start.len / 8 != n || end.len / 8 != n) {
        PyErr_SetString(PyExc_ValueError, "part, start and end must have one length");
        goto done;
    }
    const int64_t *p = part.buf, *s = start.buf, *e = end.buf;
    Py_ssize_t total = 0;
    for (Py_ssize_t i = 0; i < n; i++) {  /* every row checked before anything is copied */
        if (p[i] < 0 || p[i] >= nb || s[i] < 0 || s[i] > e[i] || e[i] > views[p[i]].len) {
            PyErr_Format(PyExc_ValueError, "row %zd: bytes %lld to %lld of body %lld are not inside it", i,
                         (long long)s[i], (long long)e[i], (long long)p[i]);
            goto done;
        }
        total += e[i] - s[i];
    }
    if (total > out.len) {
        PyErr_Format(PyExc_ValueError, "the rows take %zd bytes, out has %zd", total, out.len);
        goto done;
    }
    Py_BEGIN_ALLOW_THREADS
    char *to = out.buf;
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_ssize_t size = e[i] - s[i];
        memcpy(to + written, (const char *)views[p[i]].buf + s[i], size);
        written += size;
    }
    Py_END_ALLOW_THREADS
    result = PyLong_FromSsize_t(written);
done:
    for (Py_ssize_t i = 0; i < got; i++) PyBuffer_Release(&views[i]);
    PyMem_Free(views);
    if (out.obj) PyBuffer_Release(&out);
    if (part.obj) PyBuffer_Release(&part);
    if (start.obj) PyBuffer_Release(&start);
    if (end.obj) PyBuffer_Release(&end);
    Py_DECREF(bodies);
    return result;
}

static PyMethodDef methods[] = {
    {"gather", gather, METH_VARARGS,
     "gather(out, bodies, part, start, end) -> int: row i is bodies[part[i]][start[i]:end[i]] "
     "(part, start, end: native int64 buffers of one length), the rows copied one after another "
     "into out; returns the bytes written"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_gather", NULL, -1, methods};

PyMODINIT_FUNC PyInit__gather(void) { return PyModule_Create(&module); }
