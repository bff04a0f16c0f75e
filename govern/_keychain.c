/*
 * kvgov.govern._keychain: the block-key chain of kvgov.govern.keys, compiled.
 *
 * What it computes is specified in govern/keys.py's module docstring:
 *
 *     CacheKey_i = HMAC-SHA256(secret, CacheKey_{i-1} || ScopeDigest || token_bytes_i
 *                                      [|| ExtraKeys_i])
 *
 * HMAC (RFC 2104) is spelled out as the pure path spells it: the secret's two pad
 * blocks are hashed once, in the constructor, and each key copies those two SHA-256
 * states. SHA-256 is OpenSSL's (the library Python's hashlib already loads), through
 * its low-level SHA256_* calls: a state copy is a memcpy there, where the EVP API
 * allocates per copy. The pure path (KeyDeriver in keys.py) stays the specification
 * and the fallback; tests/govern/test_keychain_native.py checks this module against
 * it and against the known-answer vectors, byte for byte.
 *
 * Why compiled: a 1,024-token request has 64 keys; in Python each costs about 0.8 us
 * of interpreter overhead around 4 SHA-256 compressions, here about 0.2 us in all
 * (docs/performance.md). The GIL is held throughout: a call is a few microseconds,
 * and releasing it would hand the scheduler's thread to the audit writer for a
 * whole switch interval.
 *
 * Secret hygiene: the pad states are the secret's equivalent. They live only in
 * this object and are wiped (OPENSSL_cleanse) when it is freed; per-call copies
 * live on the stack and are wiped before a call returns; the object has no method
 * or attribute that returns them, and it cannot be pickled or copied.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <string.h>

/* SHA256_Init/Update/Final are deprecated in OpenSSL 3.0 (still built, and the only
 * API whose state copy does not allocate): use them without the deprecation notes. */
#ifndef OPENSSL_SUPPRESS_DEPRECATED
#define OPENSSL_SUPPRESS_DEPRECATED
#endif
#include <openssl/crypto.h>
#include <openssl/sha.h>

#define KEY_BYTES 32
#define PAD_BYTES 64

typedef struct {
    PyObject_HEAD
    SHA256_CTX inner; /* SHA-256 state after (secret ^ ipad) */
    SHA256_CTX outer; /* SHA-256 state after (secret ^ opad) */
    int ready;
} Chain;

static int
Chain_init(Chain *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"secret", NULL};
    Py_buffer secret;
    unsigned char block[PAD_BYTES], pad[PAD_BYTES];
    int i;

    if (!PyArg_ParseTupleAndKeywords(args, kwds, "y*:Chain", kwlist, &secret)) {
        return -1;
    }
    if (self->ready) {
        PyBuffer_Release(&secret);
        PyErr_SetString(PyExc_TypeError, "a Chain is initialised once");
        return -1;
    }
    memset(block, 0, sizeof block);
    if (secret.len > PAD_BYTES) {
        SHA256((const unsigned char *)secret.buf, (size_t)secret.len, block);
    }
    else {
        memcpy(block, secret.buf, (size_t)secret.len);
    }
    PyBuffer_Release(&secret);
    for (i = 0; i < PAD_BYTES; i++) {
        pad[i] = block[i] ^ 0x36;
    }
    SHA256_Init(&self->inner);
    SHA256_Update(&self->inner, pad, PAD_BYTES);
    for (i = 0; i < PAD_BYTES; i++) {
        pad[i] = block[i] ^ 0x5c;
    }
    SHA256_Init(&self->outer);
    SHA256_Update(&self->outer, pad, PAD_BYTES);
    OPENSSL_cleanse(block, sizeof block);
    OPENSSL_cleanse(pad, sizeof pad);
    self->ready = 1;
    return 0;
}

static void
Chain_dealloc(Chain *self)
{
    OPENSSL_cleanse(&self->inner, sizeof self->inner);
    OPENSSL_cleanse(&self->outer, sizeof self->outer);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* One key: HMAC(secret, parent || digest || tokens || extra) into out; ctx is scratch. */
static void
derive_one(const Chain *self, SHA256_CTX *ctx, const unsigned char *parent, size_t parent_len,
           const unsigned char *digest, size_t digest_len, const unsigned char *tokens,
           size_t tokens_len, const unsigned char *extra, size_t extra_len, unsigned char *out)
{
    unsigned char inner[KEY_BYTES];

    memcpy(ctx, &self->inner, sizeof *ctx);
    SHA256_Update(ctx, parent, parent_len);
    SHA256_Update(ctx, digest, digest_len);
    SHA256_Update(ctx, tokens, tokens_len);
    if (extra_len) {
        SHA256_Update(ctx, extra, extra_len);
    }
    SHA256_Final(inner, ctx);
    memcpy(ctx, &self->outer, sizeof *ctx);
    SHA256_Update(ctx, inner, KEY_BYTES);
    SHA256_Final(out, ctx);
}

static int
check_ready(const Chain *self)
{
    if (!self->ready) {
        PyErr_SetString(PyExc_TypeError, "Chain used before __init__");
        return -1;
    }
    return 0;
}

/* The byte offset of block `first` and the step, or -1 with ValueError set where the
 * arguments are out of range or `packed` holds fewer than first + count blocks (no keys,
 * count 0, is an empty chain wherever it starts). */
static int
block_range(Py_ssize_t block_size, Py_ssize_t count, Py_ssize_t first, Py_ssize_t packed_len,
            Py_ssize_t *step, Py_ssize_t *start)
{
    if (block_size <= 0 || count < 0 || first < 0) {
        PyErr_SetString(PyExc_ValueError,
                        "block_size must be positive, count and first not negative");
        return -1;
    }
    if (block_size > PY_SSIZE_T_MAX / 4 || first > PY_SSIZE_T_MAX - count ||
        (count > 0 && (first + count) > packed_len / (4 * block_size))) {
        PyErr_SetString(PyExc_ValueError, "packed holds fewer than first + count full blocks");
        return -1;
    }
    *step = 4 * block_size;
    *start = first * *step;
    return 0;
}

/* The chain over count blocks from byte offset start: extras NULL (no extra keys) or a
 * PySequence_Fast of count bytes objects. A new list of count keys, or NULL. */
static PyObject *
chain_keys(Chain *self, const Py_buffer *parent, const Py_buffer *packed,
           const Py_buffer *digest, Py_ssize_t step, Py_ssize_t offset, Py_ssize_t count,
           PyObject *extras)
{
    PyObject *keys = PyList_New(count);
    SHA256_CTX ctx;
    const unsigned char *prev = (const unsigned char *)parent->buf;
    size_t prev_len = (size_t)parent->len;
    Py_ssize_t i;

    if (keys == NULL) {
        return NULL;
    }
    for (i = 0; i < count; i++, offset += step) {
        PyObject *key = PyBytes_FromStringAndSize(NULL, KEY_BYTES);
        const unsigned char *extra = NULL;
        size_t extra_len = 0;
        unsigned char *out;
        if (key == NULL) {
            Py_CLEAR(keys);
            break;
        }
        if (extras != NULL) {
            PyObject *item = PySequence_Fast_GET_ITEM(extras, i);
            extra = (const unsigned char *)PyBytes_AS_STRING(item);
            extra_len = (size_t)PyBytes_GET_SIZE(item);
        }
        out = (unsigned char *)PyBytes_AS_STRING(key);
        derive_one(self, &ctx, prev, prev_len, (const unsigned char *)digest->buf,
                   (size_t)digest->len, (const unsigned char *)packed->buf + offset,
                   (size_t)step, extra, extra_len, out);
        PyList_SET_ITEM(keys, i, key);
        prev = out;
        prev_len = KEY_BYTES;
    }
    OPENSSL_cleanse(&ctx, sizeof ctx);
    return keys;
}

PyDoc_STRVAR(derive_chain_doc,
             "derive_chain(parent, packed, digest, block_size, count, first) -> list[bytes]\n\n"
             "Keys of count consecutive full blocks from block first, as KeyDeriver.derive_chain.");

static PyObject *
Chain_derive_chain(Chain *self, PyObject *args)
{
    Py_buffer parent, packed, digest;
    Py_ssize_t block_size, count, first, step, offset;
    PyObject *keys = NULL;

    if (check_ready(self) < 0) {
        return NULL;
    }
    if (!PyArg_ParseTuple(args, "y*y*y*nnn:derive_chain", &parent, &packed, &digest,
                          &block_size, &count, &first)) {
        return NULL;
    }
    if (block_range(block_size, count, first, packed.len, &step, &offset) == 0) {
        keys = chain_keys(self, &parent, &packed, &digest, step, offset, count, NULL);
    }
    PyBuffer_Release(&parent);
    PyBuffer_Release(&packed);
    PyBuffer_Release(&digest);
    return keys;
}

PyDoc_STRVAR(derive_chain_extras_doc,
             "derive_chain_extras(parent, packed, digest, block_size, extras, first) -> list[bytes]\n\n"
             "Keys of len(extras) consecutive full blocks, each with its encoded extra keys, as\n"
             "KeyDeriver.derive_chain_extras.");

static PyObject *
Chain_derive_chain_extras(Chain *self, PyObject *args)
{
    Py_buffer parent, packed, digest;
    Py_ssize_t block_size, count, first, step, offset, i;
    PyObject *extras, *seq = NULL, *keys = NULL;

    if (check_ready(self) < 0) {
        return NULL;
    }
    if (!PyArg_ParseTuple(args, "y*y*y*nOn:derive_chain_extras", &parent, &packed, &digest,
                          &block_size, &extras, &first)) {
        return NULL;
    }
    seq = PySequence_Fast(extras, "extras must be a sequence of bytes");
    if (seq == NULL) {
        goto done;
    }
    count = PySequence_Fast_GET_SIZE(seq);
    if (block_range(block_size, count, first, packed.len, &step, &offset) < 0) {
        goto done;
    }
    for (i = 0; i < count; i++) {
        if (!PyBytes_Check(PySequence_Fast_GET_ITEM(seq, i))) {
            PyErr_SetString(PyExc_TypeError, "extras must be a sequence of bytes");
            goto done;
        }
    }
    keys = chain_keys(self, &parent, &packed, &digest, step, offset, count, seq);
done:
    Py_XDECREF(seq);
    PyBuffer_Release(&parent);
    PyBuffer_Release(&packed);
    PyBuffer_Release(&digest);
    return keys;
}

static PyObject *
Chain_reduce(Chain *Py_UNUSED(self), PyObject *Py_UNUSED(ignored))
{
    PyErr_SetString(PyExc_TypeError, "a Chain holds a secret: it cannot be pickled or copied");
    return NULL;
}

static PyObject *
Chain_repr(Chain *Py_UNUSED(self))
{
    return PyUnicode_FromString("Chain(secret=<hidden>)");
}

static PyMethodDef Chain_methods[] = {
    {"derive_chain", (PyCFunction)Chain_derive_chain, METH_VARARGS, derive_chain_doc},
    {"derive_chain_extras", (PyCFunction)Chain_derive_chain_extras, METH_VARARGS,
     derive_chain_extras_doc},
    {"__reduce__", (PyCFunction)Chain_reduce, METH_NOARGS, NULL},
    {"__reduce_ex__", (PyCFunction)Chain_reduce, METH_O, NULL},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject ChainType = {
    .ob_base = PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "kvgov.govern._keychain.Chain",
    .tp_doc = PyDoc_STR("Chain(secret): HMAC-SHA256 block-key chains under one secret."),
    .tp_basicsize = sizeof(Chain),
    .tp_itemsize = 0,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Chain_init,
    .tp_dealloc = (destructor)Chain_dealloc,
    .tp_repr = (reprfunc)Chain_repr,
    .tp_methods = Chain_methods,
};

static struct PyModuleDef keychain_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "kvgov.govern._keychain",
    .m_doc = "kvgov's block-key chain in C (the specification and fallback: kvgov.govern.keys).",
    .m_size = -1,
};

PyMODINIT_FUNC
PyInit__keychain(void)
{
    PyObject *module;

    if (PyType_Ready(&ChainType) < 0) {
        return NULL;
    }
    module = PyModule_Create(&keychain_module);
    if (module == NULL) {
        return NULL;
    }
    Py_INCREF(&ChainType);
    if (PyModule_AddObject(module, "Chain", (PyObject *)&ChainType) < 0) {
        Py_DECREF(&ChainType);
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
