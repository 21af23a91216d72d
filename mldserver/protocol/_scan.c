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
   wrong. The line is one simdjson has already accepted (valid JSON and UTF-8); the scan
   still never reads past its end whatever it is given.

   Why native: the line is mostly the records' base64 data, which the scan skips many
   bytes a step (SSE2 and memchr: string); in Python the same column cost 0.3 us a
   record (pysimdjson's get per record and the join), a third of the server's time with a sink.

   In a handler process, datas(line) decodes every record's base64 data from the line's
   bytes in one pass (pool/frames.py: the first record.data a handler reads), where
   Python made a str per record and called pybase64 on each:

       >>> datas(b'{"records":[{"data":"bWVvdw=="},{"data":null},{"data":"bW\/v"},7]}')
       [b'meow', b'', None, None]

   None for a record means "read it the usual way" (Record.data: pybase64, then
   binascii's lenient reading): data that is not a string of plain, padded, canonical
   base64, a "data" key twice or a key written with an escape, a record that is not an
   object; so the result is always the usual one. None for the whole line: not one this
   reads. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#ifdef __SSE2__
#include <emmintrin.h>
#endif

typedef struct {
    const char *p, *end;
} Cursor;

static void ws(Cursor *c) {
    while (c->p < c->end && (*c->p == ' ' || *c->p == '\t' || *c->p == '\n' || *c->p == '\r')) c->p++;
}

/* The first quote or backslash in the next 64 bytes at q: end if the string runs to
   the end of the line within them, NULL if there is none and more follows (a long
   string). A line is mostly strings: short ones (keys, sequence numbers, partition
   keys) are read sixteen bytes a step where SSE2 is there (every x86-64), where a memchr
   call per string cost more than the string; a long one (a record's data) is left to
   glibc's memchr, which reads more a step than this loop (``string``). */
static inline const char *short_run(const char *q, const char *end) {
    const char *limit = end - q > 64 ? q + 64 : end;
#ifdef __SSE2__
    const __m128i quote = _mm_set1_epi8('"'), backslash = _mm_set1_epi8('\\');
    for (; limit - q >= 16; q += 16) {
        __m128i v = _mm_loadu_si128((const __m128i *)q);
        int mask = _mm_movemask_epi8(_mm_or_si128(_mm_cmpeq_epi8(v, quote), _mm_cmpeq_epi8(v, backslash)));
        if (mask) return q + __builtin_ctz((unsigned)mask);
    }
#endif
    for (; q < limit; q++)
        if (*q == '"' || *q == '\\') return q;
    return limit == end ? end : NULL;
}

/* A string at c->p (its opening quote): its raw bytes in [*s, *s + *n), and, if
   `escaped` is given, whether it holds a backslash (a key's: values are skipped or
   checked for digits); c->p past its closing quote. -1 if it does not end.

   Its short runs are read by short_run, an escape pair at a time; the rest of a long
   one by memchr for each quote, which ends the string unless an odd run of backslashes
   is before it (each quote found once: linear however many escapes there are). A
   10,000 x 100 B line (3.2 MB) scans in 0.96 ms, against 1.28 ms with a memchr per
   string and 1.07 ms with SSE2 alone; 1,000 x 1 KiB (1.5 MB) in 0.099 ms, against 0.126
   and 0.135 ms. */
static int string(Cursor *c, const char **s, Py_ssize_t *n, int *escaped) {
    const char *start = c->p + 1, *q = start, *end = c->end;
    int backslash = 0;
    for (;;) {
        const char *hit = short_run(q, end);
        if (hit == NULL) { /* a long string: its closing quote by memchr */
            const char *e = q;
            for (;;) {
                e = memchr(e, '"', (size_t)(end - e));
                if (e == NULL) return -1;
                const char *b = e;
                while (b > q && b[-1] == '\\') b--; /* (q follows a whole escape pair, or the opening quote) */
                if ((e - b) % 2 == 0) break;
                e++;
            }
            if (escaped != NULL && !backslash) backslash = memchr(q, '\\', (size_t)(e - q)) != NULL;
            q = e;
            break;
        }
        if (hit >= end) return -1;
        if (*hit == '"') {
            q = hit;
            break;
        }
        backslash = 1;
        q = hit + 2; /* the backslash and the character it escapes (a quote too) */
    }
    *s = start;
    *n = q - start;
    if (escaped != NULL) *escaped = backslash;
    c->p = q + 1;
    return 0;
}

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

static int delimiter(char ch) {
    return ch == ',' || ch == '}' || ch == ']' || ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r';
}

/* Past one value of any kind. */
static int skip(Cursor *c) {
    const char *s;
    Py_ssize_t n;
    ws(c);
    if (c->p >= c->end) return -1;
    if (*c->p == '"') return string(c, &s, &n, NULL);
    if (*c->p == '{' || *c->p == '[') {
        int depth = 0;
        do {
            if (c->p >= c->end) return -1;
            char ch = *c->p;
            if (ch == '"') {
                if (string(c, &s, &n, NULL)) return -1;
                continue;
            }
            if (ch == '{' || ch == '[') depth++;
            else if (ch == '}' || ch == ']') depth--;
            c->p++;
        } while (depth > 0);
        return 0;
    }
    while (c->p < c->end && !delimiter(*c->p)) c->p++;
    return 0;
}

/* A key (an unescaped string) and the colon after it. -1: not one this reads. */
static int key(Cursor *c, const char **s, Py_ssize_t *n) {
    int escaped;
    ws(c);
    if (c->p >= c->end || *c->p != '"' || string(c, s, n, &escaped) || escaped) return -1;
    ws(c);
    if (c->p >= c->end || *c->p != ':') return -1;
    c->p++;
    return 0;
}

static int is_(const char *s, Py_ssize_t n, const char *word, size_t size) {
    return (size_t)n == size && memcmp(s, word, size) == 0;
}
#define is(s, n, word) is_((s), (n), (word), sizeof(word) - 1) /* word: a literal */

/* After a member: 1 at the object's (or array's) close, 0 at a comma, -1 otherwise. */
static int next(Cursor *c, char close) {
    ws(c);
    if (c->p >= c->end) return -1;
    if (*c->p == close) {
        c->p++;
        return 1;
    }
    if (*c->p != ',') return -1;
    c->p++;
    return 0;
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

/* The keys of a record the scans look for, by number (OTHER: any other key). */
enum { OTHER, ACTION, ARRIVAL, DATA, PARTITION_KEY, SEQUENCE_NUMBER, SUB_SEQUENCE_NUMBER };

/* Which of those a key read by ``key`` is. */
static int which(const char *s, Py_ssize_t n) {
    if (is(s, n, "sequenceNumber")) return SEQUENCE_NUMBER;
    if (is(s, n, "subSequenceNumber")) return SUB_SEQUENCE_NUMBER;
    if (is(s, n, "approximateArrivalTimestamp")) return ARRIVAL;
    if (is(s, n, "data")) return DATA;
    return OTHER; /* (action and partitionKey: read as any other key is) */
}

/* The keys of a record as the daemon writes them, every time: on a match, c->p past
   the key's closing quote and its colon, and which key it is; else OTHER and nothing
   moved. Compared whole (quotes and colon included: "dataX" is not "data"), not
   searched for their closing quote as ``key`` does. Alternated on one machine, a
   10,000 x 100 B line's sequence numbers took 1.27 to 1.45 ms against 1.44 to 1.95
   with ``key`` alone (1,000 x 1 KiB: 0.14 to 0.17 against 0.16 to 0.17 ms), and its
   data (``datas``) 1.85 to 2.07 against 2.13 to 2.38 ms (0.83 to 0.90 against 0.98 to
   1.06). A key written otherwise (an escape, a space before the colon) or another key
   is read by ``key`` (and ``which``). */
#define KNOWN(word, id)                                                      \
    if ((size_t)(end - p) >= sizeof("\"" word "\":") - 1 &&                \
        memcmp(p, "\"" word "\":", sizeof("\"" word "\":") - 1) == 0) {   \
        c->p = p + sizeof("\"" word "\":") - 1;                              \
        return id;                                                           \
    }

static int known_key(Cursor *c) {
    const char *p = c->p, *end = c->end;
    if (end - p < 2 || *p != '"') return OTHER;
    switch (p[1]) {
    case 'a':
        KNOWN("action", ACTION)
        KNOWN("approximateArrivalTimestamp", ARRIVAL)
        break;
    case 'd':
        KNOWN("data", DATA)
        break;
    case 'p':
        KNOWN("partitionKey", PARTITION_KEY)
        break;
    case 's':
        KNOWN("sequenceNumber", SEQUENCE_NUMBER)
        KNOWN("subSequenceNumber", SUB_SEQUENCE_NUMBER)
        break;
    }
    return OTHER;
}
#undef KNOWN

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

/* The cursor at the first element of the line's "records" array: 1 there, 0 when the
   array is empty, -1 on a line this does not read. */
static int records_array(Cursor *c) {
    const char *s;
    Py_ssize_t n;
    ws(c);
    if (c->p >= c->end || *c->p != '{') return -1;
    c->p++;
    for (;;) {
        if (key(c, &s, &n)) return -1;
        if (is(s, n, "records")) break;
        if (skip(c) || next(c, '}')) return -1; /* the object's end before "records": none */
    }
    ws(c);
    if (c->p >= c->end || *c->p != '[') return -1;
    c->p++;
    ws(c);
    return c->p < c->end && *c->p == ']' ? 0 : 1;
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
    PyObject *result = NULL;
    if (failed) {
        result = Py_NewRef(Py_None);
        goto done;
    }
    int uniform = 1;
    for (Py_ssize_t i = 1; i <= o.n && uniform; i++)
        uniform = o.ends[i] - o.ends[i - 1] == o.ends[1];
    PyObject *joined = PyUnicode_New(o.size, 127);
    if (joined == NULL) goto done;
    if (o.size) memcpy(PyUnicode_DATA(joined), o.digits, (size_t)o.size);
    PyObject *ends;
    if (uniform) {
        ends = Py_NewRef(Py_None);
    } else {
        ends = PyBytes_FromStringAndSize((const char *)o.ends, (Py_ssize_t)((o.n + 1) * sizeof *o.ends));
        if (ends == NULL) {
            Py_DECREF(joined);
            goto done;
        }
    }
    PyObject *arrivals = PyBytes_FromStringAndSize((const char *)o.arrivals, (Py_ssize_t)(o.n * sizeof *o.arrivals));
    if (arrivals == NULL) {
        Py_DECREF(joined);
        Py_DECREF(ends);
        goto done;
    }
    result = Py_BuildValue("(NnNN)", joined, o.n, ends, arrivals);
done:
    PyMem_RawFree(o.digits);
    PyMem_RawFree(o.ends);
    PyMem_RawFree(o.arrivals);
    return result;
}

/* -- every record's data, decoded from the line in one pass (a handler process's) -- */

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
    {"sequence_numbers", sequence_numbers, METH_O,
     "sequence_numbers(line) -> (joined, n, ends or None, arrivals) | None: every record's "
     "sequenceNumber in a processRecords line, joined (ends: n + 1 native int64 offsets when their "
     "widths differ), and its approximateArrivalTimestamp (n native int64: -1 absent or null, "
     "-3 not a plain integer)"},
    {"datas", datas, METH_O,
     "datas(line) -> [bytes | None, ...] | None: every record's data in a processRecords line, "
     "base64-decoded in one pass (None: read that record the usual way); None for a line this "
     "does not read"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_scan", NULL, -1, methods};

PyMODINIT_FUNC PyInit__scan(void) {
    b64_table();
    return PyModule_Create(&module);
}
