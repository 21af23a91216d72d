/* A cursor over a processRecords line's JSON, shared by the two native passes over it
   (included, not linked: each is its own extension module, for its own process):

   - protocol/_scan.c, in the server: every record's sequence number and arrival time;
   - pool/_b64.c, in a handler process: every record's data, base64-decoded.

       Cursor c = {line, line + size};
       if (records_array(&c) == 1)           // at the "records" array's first element
           for (;;) {
               ... known_key(&c), or key(&c, &s, &n) and which(s, n); skip(&c) ...
               if (next(&c, ']')) break;     // 1: the array's close; 0: a comma; -1: not read
           }

   It reads the usual line only, as the daemon writes it; anything else is -1 (or
   OTHER, for a key), and the caller says None: the line, or the record, is read the
   usual way, which says what is wrong. The line is one the server has already accepted
   (valid JSON and UTF-8: _check.h, or pysimdjson); the cursor still never reads past its
   end whatever it is given. Static functions only (used by the passes, and by
   _check.h's own): nothing here is exported. */

#ifndef MLDSERVER_CURSOR_H
#define MLDSERVER_CURSOR_H

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

#endif /* MLDSERVER_CURSOR_H */
