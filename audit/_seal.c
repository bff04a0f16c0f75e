/*
 * kvgov.audit._seal: one link of the audit hash chain, compiled.
 *
 * What it computes is specified in audit/chain.py's module docstring (chain format 2)
 * and done in pure Python by kvgov.audit.sealer.Sealer, which stays the specification
 * and the fallback:
 *
 *     hash = SHA-256(prev || prefix seq "," time_us "," head "," request "," bids ","
 *                    details "]")
 *
 * where prefix is canonical_prefix(stream) as UTF-8 bytes ('["kvgov-audit-2","<stream>",'),
 * head the JSON of the event's scope fields without brackets (the sealer keeps it per
 * scope), request the JSON of its request fields (sequence_id .. policy_revision)
 * without brackets, written here, and bids and details their JSON texts. The request
 * fields are written as Python's json module writes them in format 2 (its C encoder,
 * non-ASCII characters raw): a str with '"', '\\' and the controls below U+0020
 * escaped (\b \t \n \f \r, the others \u00xx in lower case), an int in decimal, None
 * as null, True and False as true and false. Any other value (a float: AuditEvent
 * never puts one there) raises TypeError and the sealer hashes that event the pure
 * way. A str that is not valid Unicode (a lone surrogate) raises UnicodeEncodeError,
 * as the pure path does when it encodes the text.
 *
 * ids_json writes a block-id tuple's JSON (each id in decimal): the pure path's
 * BlockIdsJson keeps the text of ids below 2**18 and encodes larger ones with the json
 * module, several times slower, where a large pool's ids reach past it.
 *
 * Why compiled: the audit writer seals every event; the pure path spends about 1.8 us
 * an event assembling the text, encoding it and calling hashlib (docs/performance.md),
 * this about 0.4. The verifier (kvgov.audit.verify) re-derives every hash from the
 * stored fields with the pure code, so a trail this module sealed is checked by the
 * other implementation whenever it is verified; tests/audit/test_seal_native.py checks
 * the two against each other and against the known-answer vectors byte for byte.
 * SHA-256 is OpenSSL's, the library Python's hashlib loads. The GIL is held (a call is
 * under a microsecond).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdio.h>
#include <string.h>

#ifndef OPENSSL_SUPPRESS_DEPRECATED
#define OPENSSL_SUPPRESS_DEPRECATED
#endif
#include <openssl/sha.h>

#define HASH_BYTES 32

/* Bytes of escaped text gathered before they go to SHA256_Update. */
#define CHUNK 512

typedef struct {
    SHA256_CTX sha;
    unsigned char buf[CHUNK];
    size_t used;
} Feed;

static void
feed_flush(Feed *f)
{
    if (f->used) {
        SHA256_Update(&f->sha, f->buf, f->used);
        f->used = 0;
    }
}

static void
feed(Feed *f, const void *data, size_t len)
{
    if (len >= CHUNK) {
        feed_flush(f);
        SHA256_Update(&f->sha, data, len);
        return;
    }
    if (f->used + len > CHUNK) {
        feed_flush(f);
    }
    memcpy(f->buf + f->used, data, len);
    f->used += len;
}

static void
feed_byte(Feed *f, unsigned char c)
{
    if (f->used == CHUNK) {
        feed_flush(f);
    }
    f->buf[f->used++] = c;
}

/* A str's UTF-8 text as it is (head, bids, details: already JSON). */
static int
feed_text(Feed *f, PyObject *s, const char *what)
{
    Py_ssize_t n;
    const char *p;

    if (!PyUnicode_Check(s)) {
        PyErr_Format(PyExc_TypeError, "%s must be a str", what);
        return -1;
    }
    p = PyUnicode_AsUTF8AndSize(s, &n);
    if (p == NULL) {
        return -1;
    }
    feed(f, p, (size_t)n);
    return 0;
}

static int
feed_int(Feed *f, PyObject *v)
{
    long long x;
    int overflow = 0;
    char num[24];
    int n;

    x = PyLong_AsLongLongAndOverflow(v, &overflow);
    if (x == -1 && PyErr_Occurred()) {
        return -1;
    }
    if (overflow) {  /* beyond 64 bits: not a value an event holds; the pure path writes it */
        PyErr_SetString(PyExc_TypeError, "an integer beyond 64 bits");
        return -1;
    }
    n = snprintf(num, sizeof num, "%lld", x);
    feed(f, num, (size_t)n);
    return 0;
}

/* A str as JSON, the way json.encoder.encode_basestring (C) writes it. */
static int
feed_json_str(Feed *f, PyObject *s)
{
    static const char hex[] = "0123456789abcdef";
    Py_ssize_t n, i, run = 0;
    const unsigned char *p;

    p = (const unsigned char *)PyUnicode_AsUTF8AndSize(s, &n);
    if (p == NULL) {
        return -1;
    }
    feed_byte(f, '"');
    for (i = 0; i < n; i++) {
        unsigned char c = p[i];
        char esc[6];
        size_t len = 2;

        if (c >= 0x20 && c != '"' && c != '\\') {
            continue;  /* UTF-8 continuation and lead bytes are >= 0x80: raw */
        }
        feed(f, p + run, (size_t)(i - run));
        run = i + 1;
        esc[0] = '\\';
        switch (c) {
        case '"': esc[1] = '"'; break;
        case '\\': esc[1] = '\\'; break;
        case '\b': esc[1] = 'b'; break;
        case '\f': esc[1] = 'f'; break;
        case '\n': esc[1] = 'n'; break;
        case '\r': esc[1] = 'r'; break;
        case '\t': esc[1] = 't'; break;
        default:
            esc[1] = 'u';
            esc[2] = '0';
            esc[3] = '0';
            esc[4] = hex[c >> 4];
            esc[5] = hex[c & 0xf];
            len = 6;
        }
        feed(f, esc, len);
    }
    feed(f, p + run, (size_t)(n - run));
    feed_byte(f, '"');
    return 0;
}

static int
feed_json_scalar(Feed *f, PyObject *v)
{
    if (v == Py_None) {
        feed(f, "null", 4);
        return 0;
    }
    if (v == Py_True) {
        feed(f, "true", 4);
        return 0;
    }
    if (v == Py_False) {
        feed(f, "false", 5);
        return 0;
    }
    if (PyUnicode_Check(v)) {
        return feed_json_str(f, v);
    }
    if (PyLong_Check(v)) {
        return feed_int(f, v);
    }
    PyErr_Format(PyExc_TypeError, "a request field of type %.100s", Py_TYPE(v)->tp_name);
    return -1;
}

PyDoc_STRVAR(link_doc,
"link(prev, prefix, seq, time_us, head, request, bids, details) -> bytes\n"
"\n"
"The chain hash of one event (format 2): SHA-256 of prev and the event's canonical\n"
"text, assembled as Sealer.seal assembles it (see the module source).\n"
"\n"
"prev: the previous hash (32 bytes); prefix: canonical_prefix(stream) as UTF-8 bytes;\n"
"seq, time_us: ints; head: the scope fields' JSON without brackets; request: the\n"
"request fields, a tuple of str, int or None; bids, details: their JSON texts.\n"
"Raises TypeError for a value it does not write (the caller hashes it the pure way).");

static PyObject *
seal_link(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    Py_buffer prev, prefix;
    PyObject *request;
    Feed f;
    Py_ssize_t i, n;
    unsigned char out[HASH_BYTES];
    PyObject *result = NULL;

    (void)module;
    if (nargs != 8) {
        PyErr_Format(PyExc_TypeError, "link() takes 8 arguments (%zd given)", nargs);
        return NULL;
    }
    if (PyObject_GetBuffer(args[0], &prev, PyBUF_SIMPLE) < 0) {
        return NULL;
    }
    if (prev.len != HASH_BYTES) {
        PyBuffer_Release(&prev);
        PyErr_SetString(PyExc_ValueError, "prev must be 32 bytes");
        return NULL;
    }
    if (PyObject_GetBuffer(args[1], &prefix, PyBUF_SIMPLE) < 0) {
        PyBuffer_Release(&prev);
        return NULL;
    }
    request = args[5];
    if (!PyTuple_Check(request)) {
        PyErr_SetString(PyExc_TypeError, "request must be a tuple");
        goto done;
    }
    SHA256_Init(&f.sha);
    f.used = 0;
    feed(&f, prev.buf, HASH_BYTES);
    feed(&f, prefix.buf, (size_t)prefix.len);
    if (!PyLong_Check(args[2]) || feed_int(&f, args[2]) < 0) {
        if (!PyErr_Occurred()) {
            PyErr_SetString(PyExc_TypeError, "seq must be an int");
        }
        goto done;
    }
    feed_byte(&f, ',');
    if (!PyLong_Check(args[3]) || feed_int(&f, args[3]) < 0) {
        if (!PyErr_Occurred()) {
            PyErr_SetString(PyExc_TypeError, "time_us must be an int");
        }
        goto done;
    }
    feed_byte(&f, ',');
    if (feed_text(&f, args[4], "head") < 0) {
        goto done;
    }
    feed_byte(&f, ',');
    n = PyTuple_GET_SIZE(request);
    for (i = 0; i < n; i++) {
        if (i) {
            feed_byte(&f, ',');
        }
        if (feed_json_scalar(&f, PyTuple_GET_ITEM(request, i)) < 0) {
            goto done;
        }
    }
    feed_byte(&f, ',');
    if (feed_text(&f, args[6], "bids") < 0) {
        goto done;
    }
    feed_byte(&f, ',');
    if (feed_text(&f, args[7], "details") < 0) {
        goto done;
    }
    feed_byte(&f, ']');
    feed_flush(&f);
    SHA256_Final(out, &f.sha);
    result = PyBytes_FromStringAndSize((const char *)out, HASH_BYTES);
done:
    PyBuffer_Release(&prefix);
    PyBuffer_Release(&prev);
    return result;
}

PyDoc_STRVAR(ids_json_doc,
"ids_json(ids) -> str\n"
"\n"
"The JSON array of block ids, as the sealer stores and hashes it: each id in decimal,\n"
"comma-separated, no spaces (kvgov.audit.chain.BlockIdsJson's output). ids: a tuple of\n"
"ints, or an array(\"Q\") (a C-contiguous buffer of unsigned 64-bit integers).\n"
"Raises TypeError for anything else, or an id that is not an int within 64 bits (the\n"
"caller falls back).");

/* One id in decimal at p (a minus sign first if negative); returns the end. */
static char *
put_id(char *p, int negative, unsigned long long u)
{
    char digits[20];
    int d = 0;

    if (negative) {
        *p++ = '-';
    }
    do {
        digits[d++] = (char)('0' + (u % 10));
        u /= 10;
    } while (u);
    while (d) {
        *p++ = digits[--d];
    }
    return p;
}

static PyObject *
ids_from_buffer(PyObject *ids)
{
    Py_buffer view;
    Py_ssize_t n, i;
    const unsigned long long *v;
    char *buf, *p;
    PyObject *result;

    if (PyObject_GetBuffer(ids, &view, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) < 0) {
        PyErr_Clear();
        PyErr_SetString(PyExc_TypeError, "ids must be a tuple or an array('Q')");
        return NULL;
    }
    if (view.itemsize != 8 || view.format == NULL
        || !(strcmp(view.format, "Q") == 0 || strcmp(view.format, "L") == 0)) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_TypeError, "ids must be unsigned 64-bit integers");
        return NULL;
    }
    n = view.len / 8;
    v = (const unsigned long long *)view.buf;
    buf = PyMem_Malloc((size_t)n * 21 + 2);
    if (buf == NULL) {
        PyBuffer_Release(&view);
        return PyErr_NoMemory();
    }
    p = buf;
    *p++ = '[';
    for (i = 0; i < n; i++) {
        if (i) {
            *p++ = ',';
        }
        p = put_id(p, 0, v[i]);
    }
    *p++ = ']';
    PyBuffer_Release(&view);
    result = PyUnicode_DecodeASCII(buf, p - buf, NULL);
    PyMem_Free(buf);
    return result;
}

static PyObject *
ids_json(PyObject *module, PyObject *ids)
{
    Py_ssize_t n, i;
    char *buf, *p;
    PyObject *result;

    (void)module;
    if (!PyTuple_Check(ids)) {
        return ids_from_buffer(ids);
    }
    n = PyTuple_GET_SIZE(ids);
    /* 20 digits and a sign or comma an id, and the brackets */
    buf = PyMem_Malloc((size_t)n * 22 + 2);
    if (buf == NULL) {
        return PyErr_NoMemory();
    }
    p = buf;
    *p++ = '[';
    for (i = 0; i < n; i++) {
        PyObject *v = PyTuple_GET_ITEM(ids, i);
        long long x;
        int overflow = 0;

        if (!PyLong_Check(v)) {
            PyMem_Free(buf);
            PyErr_Format(PyExc_TypeError, "a block id of type %.100s", Py_TYPE(v)->tp_name);
            return NULL;
        }
        x = PyLong_AsLongLongAndOverflow(v, &overflow);
        if ((x == -1 && PyErr_Occurred()) || overflow) {
            PyMem_Free(buf);
            if (!PyErr_Occurred()) {
                PyErr_SetString(PyExc_TypeError, "a block id beyond 64 bits");
            }
            return NULL;
        }
        if (i) {
            *p++ = ',';
        }
        p = x < 0 ? put_id(p, 1, 0ULL - (unsigned long long)x) : put_id(p, 0, (unsigned long long)x);
    }
    *p++ = ']';
    result = PyUnicode_DecodeASCII(buf, p - buf, NULL);
    PyMem_Free(buf);
    return result;
}

static PyMethodDef seal_methods[] = {
    {"link", (PyCFunction)(void (*)(void))seal_link, METH_FASTCALL, link_doc},
    {"ids_json", (PyCFunction)ids_json, METH_O, ids_json_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef seal_module = {
    PyModuleDef_HEAD_INIT,
    "kvgov.audit._seal",
    "One link of the audit hash chain, compiled (see kvgov.audit.sealer).",
    -1,
    seal_methods,
    NULL,
    NULL,
    NULL,
    NULL,
};

PyMODINIT_FUNC
PyInit__seal(void)
{
    return PyModule_Create(&seal_module);
}
