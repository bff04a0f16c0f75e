/*
 * kvgov.govern._blocks: the per-block loops of the governor's bookkeeping, compiled.
 *
 * Five functions, each the specification's loop in Python run in C:
 *
 *   assign(table, ids, value)     table[i] = value for every id (Owners.assign, the
 *                                 retention tables of kvgov.govern.retention.Deadlines)
 *   group(table, ids, clear)      kvgov.govern.ownership.Owners.group
 *   assign_unowned(table, ids, owner)
 *                                 the owner of every block of ``ids`` without one
 *                                 (kvgov.govern.ownership.Owners.assign_unowned)
 *   page_ids(slots, start, step, unit, stop=-1)
 *                                 [slot // unit for slot in slots[start:stop:step]]
 *   zero(fills, chunks)           every block of the int64 arrays ``chunks`` zeroed in
 *                                 every byte array of ``fills`` (the SGLang binding's
 *                                 PageZeroer on the CPU), the ids returned in order
 *
 * The pure paths stay the specification and the fallback (kvgov.govern.native says
 * which one runs); tests/govern/test_blocks_native.py checks each function against its
 * pure path on random input, and that bad input raises with nothing changed.
 *
 * Why compiled: the SGLang binding's scheduler thread does this bookkeeping for every
 * page a request's match, insert and eviction touch; in Python each page costs a few
 * hundred nanoseconds of interpreter around an index and a store (docs/performance.md,
 * "SGLang's radix cache"). The GIL is held throughout: a call is a microsecond or two.
 *
 * Every function validates all of its input before it changes anything: an id out of
 * range raises IndexError, and the table, the arrays and the result are as before.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <string.h>

/* ``ids`` (any sequence of ints) as a C array, each checked in 0..size-1. NULL on error. */
static Py_ssize_t *
checked_ids(PyObject *ids, Py_ssize_t size, Py_ssize_t *count)
{
    PyObject *seq = PySequence_Fast(ids, "block ids must be a sequence of ints");
    Py_ssize_t n, i;
    Py_ssize_t *out;

    if (seq == NULL) {
        return NULL;
    }
    n = PySequence_Fast_GET_SIZE(seq);
    out = PyMem_Malloc((size_t)(n > 0 ? n : 1) * sizeof(Py_ssize_t));
    if (out == NULL) {
        Py_DECREF(seq);
        PyErr_NoMemory();
        return NULL;
    }
    for (i = 0; i < n; i++) {
        PyObject *item = PySequence_Fast_GET_ITEM(seq, i);
        Py_ssize_t v;

        if (!PyLong_Check(item)) {
            PyErr_Format(PyExc_TypeError, "a block id must be an int, not %.100s",
                         Py_TYPE(item)->tp_name);
            goto fail;
        }
        v = PyLong_AsSsize_t(item);
        if (v == -1 && PyErr_Occurred()) {
            PyErr_Clear();
            v = -1;
        }
        if (v < 0 || v >= size) {
            PyErr_Format(PyExc_IndexError, "block id %R out of range 0..%zd", item, size - 1);
            goto fail;
        }
        out[i] = v;
    }
    Py_DECREF(seq);
    *count = n;
    return out;
fail:
    Py_DECREF(seq);
    PyMem_Free(out);
    return NULL;
}

/* A list of ints from a C array. */
static PyObject *
int_list(const Py_ssize_t *ids, Py_ssize_t n)
{
    PyObject *list = PyList_New(n);
    Py_ssize_t i;

    if (list == NULL) {
        return NULL;
    }
    for (i = 0; i < n; i++) {
        PyObject *v = PyLong_FromSsize_t(ids[i]);
        if (v == NULL) {
            Py_DECREF(list);
            return NULL;
        }
        PyList_SET_ITEM(list, i, v);
    }
    return list;
}

PyDoc_STRVAR(group_doc,
"group(table, ids, clear) -> list[tuple[object, Sequence[int]]]\n\n"
"Block ids grouped by their entry in ``table`` (a list) in first-seen order; ``clear``\n"
"sets their entries to None. Where every entry equals the first (as list.count\n"
"compares) there is one group, holding ``ids`` itself; otherwise entries are grouped\n"
"by identity. Raises IndexError (nothing cleared) for an id out of range.");

static PyObject *
blocks_group(PyObject *Py_UNUSED(module), PyObject *args)
{
    PyObject *table, *ids, *result = NULL, *groups = NULL, *first;
    int clear = 0;
    Py_ssize_t *c_ids, n, i, size;
    int one = 1;

    if (!PyArg_ParseTuple(args, "O!Op:group", &PyList_Type, &table, &ids, &clear)) {
        return NULL;
    }
    size = PyList_GET_SIZE(table);
    c_ids = checked_ids(ids, size, &n);
    if (c_ids == NULL) {
        return NULL;
    }
    if (n == 0) {
        PyMem_Free(c_ids);
        return PyList_New(0);
    }
    /* one owner: every entry equal to the first (identity first, as list.count) */
    first = PyList_GET_ITEM(table, c_ids[0]);
    Py_INCREF(first);
    for (i = 1; i < n && one; i++) {
        PyObject *other = PyList_GET_ITEM(table, c_ids[i]);
        int eq;

        if (other == first) {
            continue;
        }
        Py_INCREF(other);
        eq = PyObject_RichCompareBool(other, first, Py_EQ);
        Py_DECREF(other);
        if (eq < 0) {
            Py_DECREF(first);
            PyMem_Free(c_ids);
            return NULL;
        }
        if (PyList_GET_SIZE(table) != size) { /* an owner's __eq__ changed the table */
            Py_DECREF(first);
            PyMem_Free(c_ids);
            PyErr_SetString(PyExc_RuntimeError, "group: the table changed while grouped");
            return NULL;
        }
        one = eq;
    }
    Py_DECREF(first);
    first = PyList_GET_ITEM(table, c_ids[0]);
    result = PyList_New(0);
    if (result == NULL) {
        goto done;
    }
    if (one) {
        PyObject *pair = PyTuple_Pack(2, first, ids);
        if (pair == NULL || PyList_Append(result, pair) < 0) {
            Py_XDECREF(pair);
            Py_CLEAR(result);
            goto done;
        }
        Py_DECREF(pair);
        for (i = 0; clear && i < n; i++) { /* first is held by its pair in result */
            Py_INCREF(Py_None);
            PyList_SetItem(table, c_ids[i], Py_None);
        }
    } else {
        /* id(owner) -> its list of ids; the pairs appended to result as first seen */
        PyObject *last = NULL, *current = NULL;

        groups = PyDict_New();
        if (groups == NULL) {
            Py_CLEAR(result);
            goto done;
        }
        for (i = 0; i < n; i++) {
            PyObject *owner = PyList_GET_ITEM(table, c_ids[i]);
            PyObject *v;

            if (owner != last) {
                PyObject *key = PyLong_FromVoidPtr(owner);
                if (key == NULL) {
                    Py_CLEAR(result);
                    goto done;
                }
                current = PyDict_GetItemWithError(groups, key); /* borrowed */
                if (current == NULL) {
                    PyObject *pair;

                    if (PyErr_Occurred() || (current = PyList_New(0)) == NULL) {
                        Py_DECREF(key);
                        Py_CLEAR(result);
                        goto done;
                    }
                    pair = PyTuple_Pack(2, owner, current);
                    if (pair == NULL || PyDict_SetItem(groups, key, current) < 0
                        || PyList_Append(result, pair) < 0) {
                        Py_XDECREF(pair);
                        Py_DECREF(current);
                        Py_DECREF(key);
                        Py_CLEAR(result);
                        goto done;
                    }
                    Py_DECREF(pair);
                    Py_DECREF(current); /* the dict and the pair hold it */
                }
                Py_DECREF(key);
                last = owner;
            }
            v = PyLong_FromSsize_t(c_ids[i]);
            if (v == NULL || PyList_Append(current, v) < 0) {
                Py_XDECREF(v);
                Py_CLEAR(result);
                goto done;
            }
            Py_DECREF(v);
            if (clear) { /* as the pure loop: a repeated id reads None the second time;
                          * the owner is held by its pair in result, never freed here */
                Py_INCREF(Py_None);
                PyList_SetItem(table, c_ids[i], Py_None);
            }
        }
    }
done:
    Py_XDECREF(groups);
    PyMem_Free(c_ids);
    return result;
}

PyDoc_STRVAR(assign_doc,
"assign(table, ids, value) -> None\n\n"
"``table[i] = value`` for every id (a list: the owner table, a retention table).\n"
"Raises IndexError (nothing set) for an id out of range.");

static PyObject *
blocks_assign(PyObject *Py_UNUSED(module), PyObject *args)
{
    PyObject *table, *ids, *value, **olds;
    Py_ssize_t *c_ids, n, i;

    if (!PyArg_ParseTuple(args, "O!OO:assign", &PyList_Type, &table, &ids, &value)) {
        return NULL;
    }
    c_ids = checked_ids(ids, PyList_GET_SIZE(table), &n);
    if (c_ids == NULL) {
        return NULL;
    }
    /* the old entries are released once every id is set: a release may run Python code
     * (a last reference's finaliser), which must not see the table half assigned */
    olds = PyMem_Malloc((size_t)(n > 0 ? n : 1) * sizeof(PyObject *));
    if (olds == NULL) {
        PyMem_Free(c_ids);
        return PyErr_NoMemory();
    }
    for (i = 0; i < n; i++) {
        olds[i] = PyList_GET_ITEM(table, c_ids[i]);
        Py_INCREF(value);
        PyList_SET_ITEM(table, c_ids[i], value);
    }
    PyMem_Free(c_ids);
    for (i = 0; i < n; i++) {
        Py_DECREF(olds[i]);
    }
    PyMem_Free(olds);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(assign_unowned_doc,
"assign_unowned(table, ids, owner) -> list[int]\n\n"
"The ids whose entry in ``table`` is None, in order (computed before any is set),\n"
"their entries then set to ``owner``. Raises IndexError (nothing set) for an id out\n"
"of range.");

static PyObject *
blocks_assign_unowned(PyObject *Py_UNUSED(module), PyObject *args)
{
    PyObject *table, *ids, *owner, *result;
    Py_ssize_t *c_ids, n, i, k = 0;

    if (!PyArg_ParseTuple(args, "O!OO:assign_unowned", &PyList_Type, &table, &ids, &owner)) {
        return NULL;
    }
    c_ids = checked_ids(ids, PyList_GET_SIZE(table), &n);
    if (c_ids == NULL) {
        return NULL;
    }
    for (i = 0; i < n; i++) { /* compacted in place: the unowned ones first */
        if (PyList_GET_ITEM(table, c_ids[i]) == Py_None) {
            c_ids[k++] = c_ids[i];
        }
    }
    result = int_list(c_ids, k);
    if (result != NULL) {
        for (i = 0; i < k; i++) {
            Py_INCREF(owner);
            PyList_SetItem(table, c_ids[i], owner); /* the old entry is None */
        }
    }
    PyMem_Free(c_ids);
    return result;
}

/* A 1-D buffer of native 8-byte signed integers (numpy int64). 0, or -1 with an error set. */
static int
int64_buffer(PyObject *obj, Py_buffer *view)
{
    const char *f;

    if (PyObject_GetBuffer(obj, view, PyBUF_STRIDES | PyBUF_FORMAT) < 0) {
        return -1;
    }
    f = view->format != NULL ? view->format : "B";
    if (*f == '@' || *f == '=' || (PY_LITTLE_ENDIAN && *f == '<')) {
        f++;
    }
    if (view->ndim != 1 || view->itemsize != 8 || (strcmp(f, "q") != 0 && strcmp(f, "l") != 0)) {
        PyErr_SetString(PyExc_TypeError, "expected a 1-D array of native int64");
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

static int64_t
int64_at(const Py_buffer *view, Py_ssize_t i)
{
    int64_t v;
    memcpy(&v, (const char *)view->buf + i * view->strides[0], sizeof v);
    return v;
}

PyDoc_STRVAR(page_ids_doc,
"page_ids(slots, start, step, unit, stop=-1) -> list[int]\n\n"
"[slot // unit for slot in slots[start:stop:step]] over a 1-D int64 array (stop -1:\n"
"its end; start and stop clipped to it). Raises ValueError for a step or unit < 1, a\n"
"start or stop < -1, or a negative slot.");

static PyObject *
blocks_page_ids(PyObject *Py_UNUSED(module), PyObject *args)
{
    PyObject *slots, *result = NULL;
    Py_ssize_t start, step, unit, stop = -1, n, count, i, k;
    Py_buffer view;

    if (!PyArg_ParseTuple(args, "Onnn|n:page_ids", &slots, &start, &step, &unit, &stop)) {
        return NULL;
    }
    if (step < 1 || unit < 1 || start < 0 || stop < -1) {
        PyErr_SetString(PyExc_ValueError, "page_ids: start >= 0, step >= 1, unit >= 1, stop >= -1");
        return NULL;
    }
    if (int64_buffer(slots, &view) < 0) {
        return NULL;
    }
    n = view.shape[0];
    if (stop == -1 || stop > n) {
        stop = n;
    }
    count = start < stop ? (stop - start + step - 1) / step : 0;
    for (i = start, k = 0; k < count; i += step, k++) {
        if (int64_at(&view, i) < 0) {
            PyErr_SetString(PyExc_ValueError, "page_ids: a negative slot");
            goto done;
        }
    }
    result = PyList_New(count);
    if (result == NULL) {
        goto done;
    }
    for (i = start, k = 0; k < count; i += step, k++) {
        PyObject *v = PyLong_FromLongLong((long long)(int64_at(&view, i) / unit));
        if (v == NULL) {
            Py_CLEAR(result);
            goto done;
        }
        PyList_SET_ITEM(result, k, v);
    }
done:
    PyBuffer_Release(&view);
    return result;
}

/* One fill target: blocks along ``dim`` (0 or 1) of a writable strided byte buffer,
 * each block's trailing dimensions contiguous. */
typedef struct {
    Py_buffer view;
    Py_ssize_t blocks;    /* shape[dim] */
    Py_ssize_t stride;    /* strides[dim] */
    Py_ssize_t outer;     /* shape[0] where dim is 1, else 1 */
    Py_ssize_t outer_stride;
    Py_ssize_t bytes;     /* one block's bytes */
} Fill;

static int
fill_open(PyObject *pair, Fill *fill)
{
    PyObject *target;
    int dim, k;
    Py_ssize_t expected;

    if (!PyArg_ParseTuple(pair, "Oi:zero's fill (array, dim)", &target, &dim)) {
        return -1;
    }
    if (dim != 0 && dim != 1) {
        PyErr_SetString(PyExc_ValueError, "zero: a fill's dim must be 0 or 1");
        return -1;
    }
    if (PyObject_GetBuffer(target, &fill->view, PyBUF_STRIDES | PyBUF_WRITABLE) < 0) {
        return -1;
    }
    if (fill->view.ndim < dim + 1) {
        PyErr_SetString(PyExc_ValueError, "zero: a fill has fewer dimensions than its dim");
        goto fail;
    }
    expected = fill->view.itemsize;
    for (k = fill->view.ndim - 1; k > dim; k--) {
        if (fill->view.shape[k] > 1 && fill->view.strides[k] != expected) {
            PyErr_SetString(PyExc_ValueError, "zero: a fill's blocks are not contiguous");
            goto fail;
        }
        expected *= fill->view.shape[k];
    }
    fill->bytes = expected;
    fill->blocks = fill->view.shape[dim];
    fill->stride = fill->view.strides[dim];
    fill->outer = dim ? fill->view.shape[0] : 1;
    fill->outer_stride = dim ? fill->view.strides[0] : 0;
    return 0;
fail:
    PyBuffer_Release(&fill->view);
    return -1;
}

PyDoc_STRVAR(zero_doc,
"zero(fills, chunks) -> list[int]\n\n"
"Zero every block named in ``chunks`` (1-D int64 arrays) in every target of ``fills``\n"
"((byte array, dim) pairs: blocks along dim 0 or 1, each block contiguous); returns\n"
"the ids in order. Every id is checked against every target before any byte is\n"
"written (IndexError: nothing zeroed). ``chunks`` empty: only the fills are checked.");

static PyObject *
blocks_zero(PyObject *Py_UNUSED(module), PyObject *args)
{
    PyObject *fills_arg, *chunks_arg, *fills_seq = NULL, *chunks_seq = NULL, *result = NULL;
    Fill *fills = NULL;
    Py_ssize_t nfills = 0, opened = 0, nchunks, total = 0, limit = PY_SSIZE_T_MAX, i, j, k;
    Py_ssize_t *ids = NULL;

    if (!PyArg_ParseTuple(args, "OO:zero", &fills_arg, &chunks_arg)) {
        return NULL;
    }
    fills_seq = PySequence_Fast(fills_arg, "zero: fills must be a sequence of (array, dim)");
    if (fills_seq == NULL) {
        return NULL;
    }
    chunks_seq = PySequence_Fast(chunks_arg, "zero: chunks must be a sequence of int64 arrays");
    if (chunks_seq == NULL) {
        goto done;
    }
    nfills = PySequence_Fast_GET_SIZE(fills_seq);
    fills = PyMem_Calloc((size_t)(nfills > 0 ? nfills : 1), sizeof(Fill));
    if (fills == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (opened = 0; opened < nfills; opened++) {
        if (fill_open(PySequence_Fast_GET_ITEM(fills_seq, opened), &fills[opened]) < 0) {
            goto done;
        }
        if (fills[opened].blocks < limit) {
            limit = fills[opened].blocks;
        }
    }
    nchunks = PySequence_Fast_GET_SIZE(chunks_seq);
    for (j = 0; j < 2; j++) { /* pass 0 counts and checks, pass 1 copies */
        for (i = 0, k = 0; i < nchunks; i++) {
            Py_buffer view;
            Py_ssize_t m;

            if (int64_buffer(PySequence_Fast_GET_ITEM(chunks_seq, i), &view) < 0) {
                goto done;
            }
            for (m = 0; m < view.shape[0]; m++, k++) {
                int64_t v = int64_at(&view, m);
                if (j == 0 && (v < 0 || v >= (int64_t)limit)) {
                    PyErr_Format(PyExc_IndexError, "zero: block id %lld out of range 0..%zd",
                                 (long long)v, limit - 1);
                    PyBuffer_Release(&view);
                    goto done;
                }
                if (j == 1) {
                    ids[k] = (Py_ssize_t)v;
                }
            }
            PyBuffer_Release(&view);
        }
        if (j == 0) {
            total = k;
            ids = PyMem_Malloc((size_t)(total > 0 ? total : 1) * sizeof(Py_ssize_t));
            if (ids == NULL) {
                PyErr_NoMemory();
                goto done;
            }
        } else if (k != total) {
            PyErr_SetString(PyExc_RuntimeError, "zero: a chunk changed size while read");
            goto done;
        }
    }
    result = int_list(ids, total);
    if (result == NULL) {
        goto done;
    }
    for (i = 0; i < nfills; i++) {
        const Fill *f = &fills[i];
        Py_ssize_t o;

        for (o = 0; o < f->outer; o++) {
            char *base = (char *)f->view.buf + o * f->outer_stride;
            for (k = 0; k < total; k++) {
                memset(base + ids[k] * f->stride, 0, (size_t)f->bytes);
            }
        }
    }
done:
    for (i = 0; i < opened; i++) {
        PyBuffer_Release(&fills[i].view);
    }
    PyMem_Free(fills);
    PyMem_Free(ids);
    Py_XDECREF(chunks_seq);
    Py_XDECREF(fills_seq);
    return result;
}

static PyMethodDef blocks_methods[] = {
    {"group", blocks_group, METH_VARARGS, group_doc},
    {"assign", blocks_assign, METH_VARARGS, assign_doc},
    {"assign_unowned", blocks_assign_unowned, METH_VARARGS, assign_unowned_doc},
    {"page_ids", blocks_page_ids, METH_VARARGS, page_ids_doc},
    {"zero", blocks_zero, METH_VARARGS, zero_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef blocks_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "kvgov.govern._blocks",
    .m_doc = "kvgov's per-block bookkeeping loops in C (the specification and fallback: "
             "kvgov.govern.native).",
    .m_size = -1,
    .m_methods = blocks_methods,
};

PyMODINIT_FUNC
PyInit__blocks(void)
{
    return PyModule_Create(&blocks_module);
}
