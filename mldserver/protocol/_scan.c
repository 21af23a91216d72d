/* Every record's sequence number read from a processRecords line in one native pass:
   the server's positions for a batch a sink is downstream of (shard/batches.py), without
   a Python object per record. Built into the package as mldserver.protocol._scan when a
   C compiler is there at install time (setup.py); lazy.py falls back to pysimdjson's
   columns without it, and whenever this says None.

       >>> from mldserver.protocol._scan import sequence_numbers
       >>> sequence_numbers(b'{"action":"processRecords","records":[{"data":"bWVvdw==",'
       ...                  b'"sequenceNumber":"17","subSequenceNumber":0},'
       ...                  b'{"sequenceNumber":"18"}],"millisBehindLatest":0}')
       ('1718', 2, None, b'...')          # the numbers joined, how many, one width (2),
                                          # each arrival time (n int64: -1, -1 here)
       >>> sequence_numbers(b'{"records":[{"sequenceNumber":"9","approximateArrivalTimestamp":5},'
       ...                  b'{"sequenceNumber":"10"}]}')
       ('910', 2, b'...', b'...')         # widths differ: n + 1 int64 ends, from 0; 5, -1

   In the same pass, each record's approximateArrivalTimestamp: the event time of the
   rows a handler process emitted without one is filled in by the server from these
   (pool/calls.py), so the handler process never reads it (-1: absent or null; -3: not a
   plain integer of at most 18 digits, read the usual way, which says what is wrong).

   The usual batch only, as Position.batch takes it: every record an object with one
   "sequenceNumber", a string of ASCII digits, and "subSequenceNumber" absent, null or
   0. Anything else (a record that is not an object, a key written with an escape, a
   key twice in a record, a sub-sequence number of a KPL record, nested "records"
   missing) gives None, and the caller reads the line its usual way, which says what is
   wrong. The line is one the server has already accepted (valid JSON and UTF-8: head,
   below, or pysimdjson); the scan still never reads past its end whatever it is given.

   ``head`` serves the check that comes first, when the line is decoded (_check.h):
   the line accepted, how many records, where the last one is, millisBehindLatest.
   With a sink downstream the server asks it for the positions too, and the check reads
   them as it checks each record (``checked_record``), in its one pass over the line:

       >>> head(line, True)               # (2, 102, 125, 0, ('1718', 2, None, b'...')):
                                          # (the first line above) what head(line) says, then sequence_numbers(line)

   Two passes, the check's and this scan's, were a tenth of the server's CPU with the
   file sink at 32 shards (perf); the second one read the line from memory again.

   Why native: the line is mostly the records' base64 data, which the scan skips many
   bytes a step (SSE2 and memchr: string); in Python the same column cost 0.3 us a
   record (pysimdjson's get per record and the join), a third of the server's time with a sink.

   The JSON cursor it reads the line with (strings, keys, skipping values) is
   _cursor.h's, which pool/_b64.c (a handler process's base64) includes too. */

#include "_check.h"

/* Are the n bytes at s all ASCII digits? */
static int digits(const char *s, Py_ssize_t n) {
    Py_ssize_t i = 0;
#ifdef __SSE2__
    const __m128i below = _mm_set1_epi8('0' - 1), above = _mm_set1_epi8('9' + 1);
    for (; n - i >= 16; i += 16) {  /* (a byte past 127 compares as negative: not a digit) */
        __m128i v = _mm_loadu_si128((const __m128i *)(s + i));
        if (_mm_movemask_epi8(_mm_and_si128(_mm_cmpgt_epi8(v, below), _mm_cmplt_epi8(v, above))) != 0xffff)
            return 0;
    }
#endif
    for (; i < n; i++)
        if (s[i] < '0' || s[i] > '9') return 0;
    return 1;
}

typedef struct {
    char *digits;
    Py_ssize_t size, capacity;
    int64_t *ends;
    Py_ssize_t n, ends_capacity;
    int64_t *arrivals; /* each record's approximateArrivalTimestamp (ends_capacity of them) */
} Out;

/* What a record's approximateArrivalTimestamp reads as: its value when it is a plain
   integer of at most 18 digits (a row's event time, checked against the range by the
   caller), NO_TIME when it is absent or null, ODD_TIME for anything else (a float, a
   string, a negative number: the caller reads that record its usual way, which says
   what is wrong). */
#define NO_TIME (-1)
#define ODD_TIME (-3)

static int64_t arrival(const char *v, Py_ssize_t n) {
    if (is(v, n, "null")) return NO_TIME;
    if (n == 0 || n > 18 || (n > 1 && v[0] == '0')) return ODD_TIME;
    int64_t t = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (v[i] < '0' || v[i] > '9') return ODD_TIME;
        t = t * 10 + (v[i] - '0');
    }
    return t;
}

/* Room for `records` sequence numbers of `size` digits in all. Runs without the GIL:
   the raw allocator only (pymalloc's needs the GIL). */
static int reserve(Out *o, Py_ssize_t records, Py_ssize_t size) {
    if (size > o->capacity) {
        char *digits = PyMem_RawRealloc(o->digits, (size_t)size);
        if (digits == NULL) return -1;
        o->digits = digits;
        o->capacity = size;
    }
    if (records + 1 > o->ends_capacity) {
        int64_t *ends = PyMem_RawRealloc(o->ends, (size_t)(records + 1) * sizeof *ends);
        if (ends == NULL) return -1;
        o->ends = ends;
        int64_t *arrivals = PyMem_RawRealloc(o->arrivals, (size_t)(records + 1) * sizeof *arrivals);
        if (arrivals == NULL) return -1;
        o->arrivals = arrivals;
        o->ends_capacity = records + 1;
    }
    return 0;
}

/* One more sequence number, and its arrival time; what is short of room doubled. */
static int append(Out *o, const char *s, Py_ssize_t n, int64_t at) {
    if (o->size + n > o->capacity || o->n + 2 > o->ends_capacity) {
        Py_ssize_t records = o->n + 2 > o->ends_capacity ? (o->ends_capacity + 2) * 2 : o->ends_capacity - 1;
        if (reserve(o, records, o->size + n > o->capacity ? (o->capacity + n) * 2 : o->capacity)) return -1;
    }
    memcpy(o->digits + o->size, s, (size_t)n);
    o->size += n;
    o->ends[0] = 0;
    o->arrivals[o->n] = at;
    o->ends[++o->n] = o->size;
    return 0;
}

/* The usual values, read where they are (most records): "0" for a sub-sequence
   number, a plain integer for an arrival time, each followed by the record's next
   comma or its close. 1 and c->p past it on a match; else 0 and nothing moved (the
   value is read by ``skip``, then checked). */
static int plain_zero(Cursor *c) {
    const char *p = c->p;
    if (c->end - p < 2 || p[0] != '0' || (p[1] != ',' && p[1] != '}')) return 0;
    c->p = p + 1;
    return 1;
}

static int plain_time(Cursor *c, int64_t *t) {
    const char *p = c->p, *end = c->end, *v = p;
    int64_t value = 0;
    for (; p < end && p - v < 18 && *p >= '0' && *p <= '9'; p++) value = value * 10 + (*p - '0');
    Py_ssize_t n = p - v;
    if (n == 0 || n > 18 || (n > 1 && v[0] == '0') || p >= end || (*p != ',' && *p != '}')) return 0;
    *t = value;
    c->p = p;
    return 1;
}

/* One record object at c->p: its sequence number and arrival time appended. -1: not
   the usual record. */
static int record(Cursor *c, Out *o) {
    const char *s, *seq = NULL;
    Py_ssize_t n, seq_n = 0;
    int seen_sub = 0, seen_at = 0;
    int64_t at = NO_TIME;
    ws(c);
    if (c->p >= c->end || *c->p != '{') return -1;
    c->p++;
    ws(c);
    if (c->p < c->end && *c->p == '}') return -1; /* {}: no sequence number */
    for (;;) {
        ws(c);
        int id = known_key(c);
        if (id == OTHER) {
            if (key(c, &s, &n)) return -1;
            id = which(s, n);
        }
        ws(c);
        if (id == SEQUENCE_NUMBER) {
            if (seq != NULL || c->p >= c->end || *c->p != '"' || string(c, &seq, &seq_n, NULL)) return -1;
            if (seq_n == 0 || !digits(seq, seq_n)) return -1;
        } else if (id == SUB_SEQUENCE_NUMBER) {
            if (seen_sub) return -1;
            seen_sub = 1;
            if (!plain_zero(c)) {
                const char *v = c->p;
                if (skip(c) || (!is(v, c->p - v, "0") && !is(v, c->p - v, "null"))) return -1;
            }
        } else if (id == ARRIVAL) {
            if (seen_at) return -1;
            seen_at = 1;
            if (!plain_time(c, &at)) {
                const char *v = c->p;
                if (skip(c)) return -1;
                at = arrival(v, c->p - v);
            }
        } else if (skip(c)) {
            return -1;
        }
        int end = next(c, '}');
        if (end < 0) return -1;
        if (end) break;
    }
    if (seq == NULL) return -1;
    return append(o, seq, seq_n, at);
}

/* The "records" array's sequence numbers, or -1. The outputs are sized once, from
   the first record: the records that many of its length would make, and a tenth more
   (growing them a doubling at a time copied them a dozen times a line: a tenth of the
   scan). */
static int scan(Cursor *c, Out *o) {
    int at = records_array(c);
    if (at <= 0) return at;
    const char *first = c->p;
    if (record(c, o)) return -1;
    Py_ssize_t records = (c->end - first) / (c->p - first + 1) + 1;
    records += records / 10;
    Py_ssize_t size = records * o->size; /* (never more than the line: a short first record) */
    if (reserve(o, records, size < c->end - first ? size : c->end - first)) return -1;
    for (;;) {
        int end = next(c, ']');
        if (end < 0) return -1;
        if (end) return 0;
        if (record(c, o)) return -1;
    }
}

/* The records array's elements as _check.h checks them, one at a time, while what
   ``record`` reads is read in the same pass (``head(line, True)``): `usual` drops to 0
   at the first record ``record`` would refuse, and the rest are only checked. */
typedef struct {
    Out *o;
    int usual;
} Reading;

/* What ``record`` would read of one record, gathered member by member as the check
   tells them (checked_object's `member`); usual drops to 0 where ``record`` would
   refuse the record. */
typedef struct {
    const char *seq;
    Py_ssize_t seq_n;
    int seen_sub, seen_at, usual;
    int64_t at;
} Positions;

static void position_member(int key, const char *v, Py_ssize_t n, void *ctx) {
    Positions *p = ctx;
    switch (key) {
    case ESCAPED:
        p->usual = 0;
        break;
    case SEQUENCE_NUMBER:
        if (p->seq != NULL || *v != '"' || n < 3 || !digits(v + 1, n - 2)) p->usual = 0;
        p->seq = v + 1;
        p->seq_n = n - 2;
        break;
    case SUB_SEQUENCE_NUMBER:
        if (p->seen_sub || (!is(v, n, "0") && !is(v, n, "null"))) p->usual = 0;
        p->seen_sub = 1;
        break;
    case ARRIVAL:
        if (p->seen_at) p->usual = 0;
        p->seen_at = 1;
        p->at = arrival(v, n);
        break;
    }
}

/* One element of "records" at c->p: checked as checked_value would check it at
   `depth`, and, while the batch is the usual one, its sequence number and arrival time
   appended as ``record`` reads them (the same records refused: not an object, no
   sequence number, one twice, a key with an escape, a sub-sequence number other than 0
   or null). -1: not a line read here. */
static int checked_record(Cursor *c, int depth, void *ctx) {
    Reading *r = ctx;
    ws(c);
    if (r->usual && (c->p >= c->end || *c->p != '{')) r->usual = 0;
    if (!r->usual) return checked_value(c, depth);
    const char *first = c->p;
    Positions p = {.at = NO_TIME, .usual = 1};
    if (checked_object(c, depth + 1, position_member, &p)) return -1;
    if (!p.usual || p.seq == NULL || append(r->o, p.seq, p.seq_n, p.at)) { /* (no memory: read the usual way) */
        r->usual = 0;
        return 0;
    }
    if (r->o->n == 1) { /* sized once, from the first record, as ``scan`` does */
        Py_ssize_t records = (c->end - first) / (c->p - first + 1) + 1;
        records += records / 10;
        Py_ssize_t size = records * r->o->size;
        if (reserve(r->o, records, size < c->end - first ? size : c->end - first)) r->usual = 0;
    }
    return 0;
}

/* What ``sequence_numbers`` says of what was read into `o`: (joined, n, ends or
   None, arrivals), or NULL with an exception set. */
static PyObject *scanned(Out *o) {
    int uniform = 1;
    for (Py_ssize_t i = 1; i <= o->n && uniform; i++)
        uniform = o->ends[i] - o->ends[i - 1] == o->ends[1];
    PyObject *joined = PyUnicode_New(o->size, 127);
    if (joined == NULL) return NULL;
    if (o->size) memcpy(PyUnicode_DATA(joined), o->digits, (size_t)o->size);
    PyObject *ends;
    if (uniform) {
        ends = Py_NewRef(Py_None);
    } else {
        ends = PyBytes_FromStringAndSize((const char *)o->ends, (Py_ssize_t)((o->n + 1) * sizeof *o->ends));
        if (ends == NULL) {
            Py_DECREF(joined);
            return NULL;
        }
    }
    PyObject *arrivals = PyBytes_FromStringAndSize((const char *)o->arrivals, (Py_ssize_t)(o->n * sizeof *o->arrivals));
    if (arrivals == NULL) {
        Py_DECREF(joined);
        Py_DECREF(ends);
        return NULL;
    }
    return Py_BuildValue("(NnNN)", joined, o->n, ends, arrivals);
}

static PyObject *sequence_numbers(PyObject *self, PyObject *arg) {
    Py_buffer line;
    if (PyObject_GetBuffer(arg, &line, PyBUF_SIMPLE)) return NULL;
    Out o = {NULL, 0, 0, NULL, 0, 0, NULL};
    Cursor c = {line.buf, (const char *)line.buf + line.len};
    int failed;
    Py_BEGIN_ALLOW_THREADS
    failed = scan(&c, &o);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&line);
    PyObject *result = failed ? Py_NewRef(Py_None) : scanned(&o);
    PyMem_RawFree(o.digits);
    PyMem_RawFree(o.ends);
    PyMem_RawFree(o.arrivals);
    return result;
}

static PyObject *head(PyObject *self, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"line", "positions", NULL};
    PyObject *arg;
    int positions = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|p:head", keywords, &arg, &positions)) return NULL;
    Py_buffer line;
    if (PyObject_GetBuffer(arg, &line, PyBUF_SIMPLE)) return NULL;
    Out o = {NULL, 0, 0, NULL, 0, 0, NULL};
    Reading r = {&o, 1};
    Head h = {0, NULL, NULL, 0, 0, positions ? checked_record : NULL, &r};
    Cursor c = {line.buf, (const char *)line.buf + line.len};
    int failed;
    Py_BEGIN_ALLOW_THREADS
    failed = check_line(&c, &h);
    Py_END_ALLOW_THREADS
    Py_ssize_t start = h.n ? h.last - (const char *)line.buf : -1, end = h.n ? h.last_end - (const char *)line.buf : -1;
    PyBuffer_Release(&line);
    PyObject *result = NULL, *mbl = NULL;
    if (failed) {
        result = Py_NewRef(Py_None);
        goto done;
    }
    mbl = h.has_mbl ? PyLong_FromLongLong((long long)h.mbl) : Py_NewRef(Py_None);
    if (mbl == NULL) goto done;
    if (!positions) {
        result = Py_BuildValue("(nnnN)", h.n, start, end, mbl);
    } else {
        PyObject *read = r.usual ? scanned(&o) : Py_NewRef(Py_None);
        if (read == NULL) Py_DECREF(mbl);
        else result = Py_BuildValue("(nnnNN)", h.n, start, end, mbl, read);
    }
done:
    PyMem_RawFree(o.digits);
    PyMem_RawFree(o.ends);
    PyMem_RawFree(o.arrivals);
    return result;
}

static PyMethodDef methods[] = {
    {"head", (PyCFunction)(void (*)(void))head, METH_VARARGS | METH_KEYWORDS,
     "head(line, positions=False) -> (n, last_start, last_end, millis_behind_latest) | None: a "
     "processRecords line checked (strict JSON of the usual kind: _check.h), how many records, where "
     "the last one is (-1, -1 when none) and millisBehindLatest (None: absent or null); None for a line "
     "read otherwise. With positions, a fifth item: what sequence_numbers(line) says, read in the same pass"},
    {"sequence_numbers", sequence_numbers, METH_O,
     "sequence_numbers(line) -> (joined, n, ends or None, arrivals) | None: every record's "
     "sequenceNumber in a processRecords line, joined (ends: n + 1 native int64 offsets when their "
     "widths differ), and its approximateArrivalTimestamp (n native int64: -1 absent or null, "
     "-3 not a plain integer)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_scan", NULL, -1, methods};

PyMODINIT_FUNC PyInit__scan(void) {
    check_init();
    return PyModule_Create(&module);
}
