/* The server's check of a processRecords line, in one native pass: is it strict JSON
   (RFC 8259) of the usual kind, and what the conversation needs of it (how many
   records, where the last one is, millisBehindLatest), with no Python object made and
   no copy of the line. Included by _scan.c, whose ``head`` serves it:

       >>> from mldserver.protocol._scan import head
       >>> head(b'{"action":"processRecords","records":[{"sequenceNumber":"7"},'
       ...      b'{"sequenceNumber":"8"}],"millisBehindLatest":5}')
       (2, 61, 83, 5)            # 2 records, the last at line[61:83], millisBehindLatest 5
       >>> head(b'{"action":"processRecords","records":[],"millisBehindLatest":null}')
       (0, -1, -1, None)
       >>> head(b'{"action":"processRecords","records":[{"data":"\\u00e9"}]}')
       None                      # not read here: pysimdjson reads it (protocol/lazy.py)

   It reads only what pysimdjson would accept and read the same way, and says None for
   everything else, which pysimdjson then reads as before (and the eager decoder after
   it, which says what is wrong). Read here: ASCII only; strings without a control
   character, escaped by one character only (\" \\ \/ \b \f \n \r \t: no \u); numbers
   that are integers of at most 18 digits, not -0 (no fraction, no exponent: the
   readers' floats may differ); nesting at most CHECK_DEPTH deep; one top-level object
   with at most CHECK_KEYS keys, none twice and none escaped, "action" the string
   "processRecords", "records" an array, "millisBehindLatest" absent, null or an
   integer. What the daemon writes is all of that; a partition key past ASCII is not.

   Why: pysimdjson copied the line (its padding) and built its structure to read the
   same three things, some 0.26 ms for a 1.5 MB line of 1,000 x 1 KiB, against the
   0.08 ms this pass and the sequence numbers' (_scan.c) each take. Most of a line is
   the records' base64 data: its strings are read sixteen bytes a step (SSE2), each
   checked for a quote, a backslash, a control byte or a byte past ASCII at once.

   The cursor (ws, next) is _cursor.h's; the scans after this one (the sequence numbers
   when this did not read them with `Head.record`, the data in a handler process:
   pool/_b64.c) read only lines this, or pysimdjson, has accepted. It never reads past
   the line's end, whatever it is given. */

#ifndef MLDSERVER_CHECK_H
#define MLDSERVER_CHECK_H

#include "_cursor.h"

#define CHECK_DEPTH 64 /* deeper nesting: pysimdjson reads it (its limit is 1024) */
#define CHECK_KEYS 16  /* more top-level keys: pysimdjson reads the line */

typedef struct {
    Py_ssize_t n;                 /* records */
    const char *last, *last_end;  /* the last record's value, when n > 0 */
    int has_mbl;                  /* millisBehindLatest an integer (else absent or null) */
    int64_t mbl;
    /* With `record`, each element of "records" is checked by it (given `ctx`, and the
       depth checked_value would have been given) instead of by checked_value: _scan.c
       reads every record's position in the same pass (``head(line, True)``). */
    int (*record)(Cursor *c, int depth, void *ctx);
    void *ctx;
} Head;

/* The first byte at or after q that a plain string does not hold (a quote, a
   backslash, a control byte, a byte past ASCII), or end. Read 32 bytes a step with
   AVX2 where the processor has it (chosen once: check_init), else 16 with SSE2 (every
   x86-64), else one at a time. */
#if defined(__GNUC__) && defined(__x86_64__)
#include <immintrin.h>
#define CHECK_AVX2 1
__attribute__((target("avx2"))) static const char *plain_run_avx2(const char *q, const char *end) {
    const __m256i quote = _mm256_set1_epi8('"'), bs = _mm256_set1_epi8('\\'), space = _mm256_set1_epi8(' ');
    for (; end - q >= 32; q += 32) {
        __m256i v = _mm256_loadu_si256((const __m256i *)q);
        /* (signed: a byte past 127 compares below ' ', as a control byte does) */
        __m256i hit = _mm256_or_si256(_mm256_or_si256(_mm256_cmpeq_epi8(v, quote), _mm256_cmpeq_epi8(v, bs)),
                                      _mm256_cmpgt_epi8(space, v));
        unsigned mask = (unsigned)_mm256_movemask_epi8(hit);
        if (mask) return q + __builtin_ctz(mask);
    }
    return q;
}
#endif
static int check_avx2 = 0;

static void check_init(void) {
#ifdef CHECK_AVX2
    __builtin_cpu_init();
    check_avx2 = __builtin_cpu_supports("avx2");
#endif
}

static inline const char *plain_run(const char *q, const char *end) {
#ifdef CHECK_AVX2
    if (check_avx2) q = plain_run_avx2(q, end);
#endif
#ifdef __SSE2__
    const __m128i quote = _mm_set1_epi8('"'), bs = _mm_set1_epi8('\\'), space = _mm_set1_epi8(' ');
    for (; end - q >= 16; q += 16) {
        __m128i v = _mm_loadu_si128((const __m128i *)q);
        __m128i hit = _mm_or_si128(_mm_or_si128(_mm_cmpeq_epi8(v, quote), _mm_cmpeq_epi8(v, bs)),
                                   _mm_cmplt_epi8(v, space));
        int mask = _mm_movemask_epi8(hit);
        if (mask) return q + __builtin_ctz((unsigned)mask);
    }
#endif
    while (q < end && *q != '"' && *q != '\\' && (unsigned char)*q >= 0x20 && (unsigned char)*q < 0x80) q++;
    return q;
}

/* A string at c->p (its opening quote), checked; c->p past its closing quote, and
   *escaped (if given) whether it holds an escape. -1: not one read here. */
static int checked_string(Cursor *c, int *escaped) {
    const char *q = c->p + 1, *end = c->end;
    int backslash = 0;
    for (;;) {
        q = plain_run(q, end);
        if (q >= end) return -1;
        if (*q == '"') break;
        if (*q != '\\' || end - q < 2) return -1; /* a control byte, a byte past ASCII */
        switch (q[1]) {
        case '"': case '\\': case '/': case 'b': case 'f': case 'n': case 'r': case 't':
            break;
        default: /* \u (its surrogates: pysimdjson says), or no escape at all */
            return -1;
        }
        backslash = 1;
        q += 2;
    }
    if (escaped != NULL) *escaped = backslash;
    c->p = q + 1;
    return 0;
}

/* An integer of at most 18 digits at c->p, not -0, followed by the end of its value;
   c->p past it. -1: not one read here (a fraction, an exponent, a leading zero). */
static int checked_integer(Cursor *c, int64_t *value) {
    const char *p = c->p, *end = c->end;
    int negative = p < end && *p == '-';
    p += negative;
    const char *first = p;
    int64_t v = 0;
    for (; p < end && *p >= '0' && *p <= '9'; p++) {
        if (p - first == 18) return -1;
        v = v * 10 + (*p - '0');
    }
    Py_ssize_t n = p - first;
    if (n == 0 || (n > 1 && *first == '0') || (negative && v == 0)) return -1;
    if (p < end && !delimiter(*p)) return -1;
    *value = negative ? -v : v;
    c->p = p;
    return 0;
}

/* true, false or null at c->p (which one: *which, its first letter); c->p past it. */
static int checked_literal(Cursor *c, char *which) {
    const char *p = c->p, *end = c->end;
    size_t size = *p == 'f' ? 5 : 4;
    const char *word = *p == 't' ? "true" : *p == 'f' ? "false" : "null";
    if ((size_t)(end - p) < size || memcmp(p, word, size) != 0) return -1;
    if ((size_t)(end - p) > size && !delimiter(p[size])) return -1;
    if (which != NULL) *which = *p;
    c->p = p + size;
    return 0;
}

static int checked_value(Cursor *c, int depth);

/* What checked_object tells a caller that reads members as it checks them: each
   member's key (known_key's or which's number; ESCAPED for a key written with an
   escape, which no reader here compares) and its value's bytes, once checked. */
#define ESCAPED (-1)
typedef void (*Member)(int key, const char *value, Py_ssize_t size, void *ctx);

/* An object at c->p (its opening brace), every key and value checked at `depth`; each
   member told to `member` (given `ctx`) when it is not NULL. */
static int checked_object(Cursor *c, int depth, Member member, void *ctx) {
    if (depth > CHECK_DEPTH) return -1;
    c->p++;
    ws(c);
    if (c->p < c->end && *c->p == '}') {
        c->p++;
        return 0;
    }
    for (;;) {
        ws(c);
        int key = known_key(c); /* (a record's usual keys: compared whole, with their colon) */
        if (key == OTHER) {
            const char *k = c->p + 1;
            int escaped;
            if (c->p >= c->end || *c->p != '"' || checked_string(c, &escaped)) return -1;
            if (member != NULL) key = escaped ? ESCAPED : which(k, c->p - 1 - k);
            ws(c);
            if (c->p >= c->end || *c->p != ':') return -1;
            c->p++;
        }
        ws(c);
        const char *v = c->p;
        if (checked_value(c, depth)) return -1;
        if (member != NULL) member(key, v, c->p - v, ctx);
        int end = next(c, '}');
        if (end) return end > 0 ? 0 : -1;
    }
}

/* An array at c->p (its opening bracket), every value checked; with `head`, how many
   and where the last one is. */
static int checked_array(Cursor *c, int depth, Head *head) {
    if (depth > CHECK_DEPTH) return -1;
    c->p++;
    ws(c);
    if (c->p < c->end && *c->p == ']') {
        c->p++;
        return 0;
    }
    for (;;) {
        ws(c);
        const char *start = c->p;
        if (head != NULL && head->record != NULL ? head->record(c, depth, head->ctx) : checked_value(c, depth))
            return -1;
        if (head != NULL) {
            head->n++;
            head->last = start;
            head->last_end = c->p;
        }
        int end = next(c, ']');
        if (end) return end > 0 ? 0 : -1;
    }
}

static int checked_value(Cursor *c, int depth) {
    int64_t ignored;
    ws(c);
    if (c->p >= c->end) return -1;
    switch (*c->p) {
    case '"': return checked_string(c, NULL);
    case '{': return checked_object(c, depth + 1, NULL, NULL);
    case '[': return checked_array(c, depth + 1, NULL);
    case 't': case 'f': case 'n': return checked_literal(c, NULL);
    default: return checked_integer(c, &ignored);
    }
}

/* The whole line checked, and what the conversation needs of it in `head`. -1: not a
   line read here. */
static int check_line(Cursor *c, Head *head) {
    const char *keys[CHECK_KEYS];
    Py_ssize_t sizes[CHECK_KEYS];
    int count = 0, action = 0, records = 0;
    ws(c);
    if (c->p >= c->end || *c->p != '{') return -1;
    c->p++;
    for (;;) {
        ws(c);
        const char *k = c->p + 1, *v;
        int escaped;
        if (c->p >= c->end || *c->p != '"' || checked_string(c, &escaped) || escaped) return -1;
        Py_ssize_t size = c->p - 1 - k;
        for (int i = 0; i < count; i++)
            if (sizes[i] == size && memcmp(keys[i], k, (size_t)size) == 0) return -1; /* a key twice */
        if (count == CHECK_KEYS) return -1;
        keys[count] = k;
        sizes[count++] = size;
        ws(c);
        if (c->p >= c->end || *c->p != ':') return -1;
        c->p++;
        ws(c);
        if (c->p >= c->end) return -1;
        if (is(k, size, "action")) {
            v = c->p + 1;
            if (*c->p != '"' || checked_string(c, &escaped) || escaped || !is(v, c->p - 1 - v, "processRecords"))
                return -1;
            action = 1;
        } else if (is(k, size, "records")) {
            if (*c->p != '[' || checked_array(c, 1, head)) return -1;
            records = 1;
        } else if (is(k, size, "millisBehindLatest")) {
            char which = 0;
            if (*c->p == 'n' || *c->p == 't' || *c->p == 'f') {
                if (checked_literal(c, &which) || which != 'n') return -1; /* a boolean: the eager decoder says */
            } else {
                if (checked_integer(c, &head->mbl)) return -1;
                head->has_mbl = 1;
            }
        } else if (checked_value(c, 0)) {
            return -1;
        }
        int end = next(c, '}');
        if (end < 0) return -1;
        if (end) break;
    }
    ws(c);
    return c->p == c->end && action && records ? 0 : -1;
}

#endif /* MLDSERVER_CHECK_H */
