/* Every record's data decoded from a processRecords line's bytes in one native pass, in
   a handler process: the first record.data a handler reads (pool/frames.py's LineData),
   where Python made a str per record and called pybase64 on each. Built into the package
   as mldserver.pool._b64 when a C compiler is there at install time (setup.py);
   frames.py falls back to Record.data without it, or with MLDSERVER_NO_EXTENSIONS set.

       >>> from mldserver.pool._b64 import datas
       >>> datas(b'{"records":[{"data":"bWVvdw=="},{"data":null},{"data":"bW\/v"},7]}')
       [b'meow', b'', None, None]

   None for a record means "read it the usual way" (Record.data: pybase64, then
   binascii's lenient reading): data that is not a string of plain, padded, canonical
   base64, a "data" key twice or a key written with an escape, a record that is not an
   object; so the result is always the usual one. None for the whole line: not one this
   reads.

   The line is read with protocol/_cursor.h's JSON cursor, the one the server's scan of
   the same line (protocol/_scan.c) reads it with; the two are separate modules, each
   loaded by the one process that uses it. */

#include "../protocol/_cursor.h"

/* Four tables, one per place in a quad, each value already shifted to its bits of the
   three bytes; a character outside the alphabet sets bit 24 (BAD), so one OR of four
   lookups decodes a quad and one test checks it. */
#define BAD 0x01000000u
static uint32_t D0[256], D1[256], D2[256], D3[256];

static void b64_table(void) {
    const char *alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    for (int i = 0; i < 256; i++) D0[i] = D1[i] = D2[i] = D3[i] = BAD;
    for (uint32_t i = 0; i < 64; i++) {
        unsigned char ch = (unsigned char)alphabet[i];
        D0[ch] = i << 18;
        D1[ch] = i << 12;
        D2[ch] = i << 6;
        D3[ch] = i;
    }
}

/* Strict base64 (the standard alphabet, padded, canonical trailing bits) into a new
   bytes object; NULL with no exception set for anything else: the caller reads that
   record the usual way (pybase64, then binascii's lenient reading), which decides. */
static PyObject *b64_decode(const unsigned char *s, Py_ssize_t n) {
    if (n % 4) return NULL;
    Py_ssize_t pad = n && s[n - 1] == '=' ? (s[n - 2] == '=' ? 2 : 1) : 0;
    Py_ssize_t size = n / 4 * 3 - pad;
    PyObject *out = PyBytes_FromStringAndSize(NULL, size);
    if (out == NULL) return NULL;
    unsigned char *o = (unsigned char *)PyBytes_AS_STRING(out);
    Py_ssize_t full = pad ? n - 4 : n;
    uint32_t bad = 0;
    for (Py_ssize_t i = 0; i < full; i += 4) {
        uint32_t v = D0[s[i]] | D1[s[i + 1]] | D2[s[i + 2]] | D3[s[i + 3]];
        bad |= v;
        o[0] = (unsigned char)(v >> 16);
        o[1] = (unsigned char)(v >> 8);
        o[2] = (unsigned char)v;
        o += 3;
    }
    if (pad) {
        const unsigned char *q = s + full;
        if (pad == 2) {
            uint32_t v = D0[q[0]] | D1[q[1]];
            bad |= v | ((v & 0xffff) ? BAD : 0);  /* bits past the last byte: not canonical */
            o[0] = (unsigned char)(v >> 16);
        } else {
            uint32_t v = D0[q[0]] | D1[q[1]] | D2[q[2]];
            bad |= v | ((v & 0xff) ? BAD : 0);
            o[0] = (unsigned char)(v >> 16);
            o[1] = (unsigned char)(v >> 8);
        }
    }
    if (bad & BAD) {
        Py_DECREF(out);
        return NULL;
    }
    return out;
}

/* One record's data: a new reference to its bytes (b"" where "data" is absent, null
   or empty), Py_None where it must be read the usual way (not a string of plain
   base64, a key written twice or with an escape), or NULL on a line this does not read
   or an exception. */
static PyObject *record_data(Cursor *c) {
    const char *s, *v = NULL;
    Py_ssize_t n, v_n = 0;
    int seen = 0, odd = 0;
    ws(c);
    if (c->p >= c->end) return NULL;
    if (*c->p != '{') return skip(c) ? NULL : Py_NewRef(Py_None);
    c->p++;
    ws(c);
    if (c->p < c->end && *c->p == '}') {
        c->p++;
        return PyBytes_FromStringAndSize(NULL, 0);
    }
    for (;;) {
        ws(c);
        int escaped = 0, id = known_key(c);
        if (id == OTHER) {
            if (c->p >= c->end || *c->p != '"') return NULL;
            if (string(c, &s, &n, &escaped)) return NULL;
            ws(c);
            if (c->p >= c->end || *c->p != ':') return NULL;
            c->p++;
            if (!escaped) id = which(s, n);
        }
        ws(c);
        if (escaped) odd = 1; /* a key that may read as "data" */
        if (id == DATA) {
            if (seen) odd = 1;
            seen = 1;
            if (c->p < c->end && *c->p == '"') {
                int esc;
                if (string(c, &v, &v_n, &esc)) return NULL;
                if (esc) odd = 1;
            } else {
                const char *w = c->p;
                if (skip(c)) return NULL;
                if (!is(w, c->p - w, "null")) odd = 1;
            }
        } else if (skip(c)) {
            return NULL;
        }
        int end = next(c, '}');
        if (end < 0) return NULL;
        if (end) break;
    }
    if (odd) return Py_NewRef(Py_None);
    if (v == NULL || v_n == 0) return PyBytes_FromStringAndSize(NULL, 0);
    PyObject *data = b64_decode((const unsigned char *)v, v_n);
    if (data == NULL && !PyErr_Occurred()) return Py_NewRef(Py_None);
    return data;
}

static PyObject *datas(PyObject *self, PyObject *arg) {
    Py_buffer line;
    if (PyObject_GetBuffer(arg, &line, PyBUF_SIMPLE)) return NULL;
    Cursor c = {line.buf, (const char *)line.buf + line.len};
    PyObject *out = PyList_New(0);
    if (out == NULL) goto fail;
    int at = records_array(&c);
    if (at < 0) goto none;
    if (at == 0) goto done;
    for (;;) {
        PyObject *data = record_data(&c);
        if (data == NULL) {
            if (PyErr_Occurred()) goto fail;
            goto none;
        }
        int failed = PyList_Append(out, data);
        Py_DECREF(data);
        if (failed) goto fail;
        int end = next(&c, ']');
        if (end < 0) goto none;
        if (end) break;
    }
done:
    PyBuffer_Release(&line);
    return out;
none:
    PyBuffer_Release(&line);
    Py_XDECREF(out);
    Py_RETURN_NONE;
fail:
    PyBuffer_Release(&line);
    Py_XDECREF(out);
    return NULL;
}

static PyMethodDef methods[] = {
    {"datas", datas, METH_O,
     "datas(line) -> [bytes | None, ...] | None: every record's data in a processRecords line, "
     "base64-decoded in one pass (None: read that record the usual way); None for a line this "
     "does not read"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_b64", NULL, -1, methods};

PyMODINIT_FUNC PyInit__b64(void) {
    b64_table();
    return PyModule_Create(&module);
}
