/* kafkakv.map._bulk: the ops records of many puts and removes at once, in C.
 *
 * update_records(record_type, keys, values, partitions, origin, next_seqs, stride, limit)
 *     -> (by_partition, bad)
 *
 * The same as bulk.py's py_update_records, which tests/map/test_bulk.py holds it to: for each
 * row, a record (record_type(key, op, (), None, None, None), a tuple built directly) whose
 * value is the ops record msgspec would encode for [PUT, origin, seq, value], or [REMOVE,
 * origin, seq] for a None value, appended to by_partition[partition]; seq is next_seqs[p],
 * which then moves on by ``stride``. ``bad`` is the first row whose key and op together are
 * over ``limit`` bytes (-1: none); then nothing else is returned and next_seqs is as given.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "_msgpack.h" /* src/kafkakv/_msgpack.h */

#define OP_PUT 1
#define OP_REMOVE 5

/* The ops record of one put (value) or remove (value NULL). */
static PyObject *
encode_update(const char *origin, Py_ssize_t origin_size, uint64_t seq, const char *value,
              Py_ssize_t value_size)
{
    Py_ssize_t size = 1 + 1 + bin_size(origin_size) + uint_size(seq);
    if (value != NULL) {
        size += bin_size(value_size);
    }
    PyObject *op = PyBytes_FromStringAndSize(NULL, size);
    if (op == NULL) {
        return NULL;
    }
    unsigned char *p = (unsigned char *)PyBytes_AS_STRING(op);
    *p++ = value != NULL ? 0x94 : 0x93; /* a fixarray of 4 or 3 */
    *p++ = value != NULL ? OP_PUT : OP_REMOVE;
    p = put_bin(p, origin, origin_size);
    p = put_uint(p, seq);
    if (value != NULL) {
        put_bin(p, value, value_size);
    }
    return op;
}

static int
check_list(PyObject *o, const char *what)
{
    if (!PyList_CheckExact(o)) {
        PyErr_Format(PyExc_TypeError, "update_records(): %s must be a list", what);
        return -1;
    }
    return 0;
}

static PyObject *
update_records(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 8) {
        PyErr_SetString(PyExc_TypeError,
                        "update_records(record_type, keys, values, partitions, origin, "
                        "next_seqs, stride, limit) takes 8 arguments");
        return NULL;
    }
    PyObject *type = args[0], *keys = args[1], *values = args[2], *parts = args[3];
    PyObject *origin = args[4], *next_seqs = args[5];
    if (!PyType_Check(type) || !PyType_IsSubtype((PyTypeObject *)type, &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "update_records(): record_type must be a tuple type");
        return NULL;
    }
    if (check_list(keys, "keys") < 0 || check_list(values, "values") < 0 ||
        check_list(parts, "partitions") < 0 || check_list(next_seqs, "next_seqs") < 0) {
        return NULL;
    }
    if (!PyBytes_CheckExact(origin)) {
        PyErr_SetString(PyExc_TypeError, "update_records(): origin must be bytes");
        return NULL;
    }
    long long stride = PyLong_AsLongLong(args[6]);
    if (stride == -1 && PyErr_Occurred()) {
        return NULL;
    }
    Py_ssize_t limit = PyLong_AsSsize_t(args[7]);
    if (limit == -1 && PyErr_Occurred()) {
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(keys), count = PyList_GET_SIZE(next_seqs);
    if (PyList_GET_SIZE(values) != n || PyList_GET_SIZE(parts) != n) {
        PyErr_SetString(PyExc_ValueError, "update_records(): keys, values and partitions differ "
                                          "in length");
        return NULL;
    }
    if (stride <= 0) {
        PyErr_SetString(PyExc_ValueError, "update_records(): stride must be positive");
        return NULL;
    }
    const char *o = PyBytes_AS_STRING(origin);
    Py_ssize_t origin_size = PyBytes_GET_SIZE(origin);
    PyTypeObject *record_type = (PyTypeObject *)type;
    /* The seqs, read once, moved on here, written back only when every row went in. */
    uint64_t *seqs = PyMem_Malloc((size_t)(count ? count : 1) * sizeof(uint64_t));
    PyObject **lists = PyMem_Calloc((size_t)(count ? count : 1), sizeof(PyObject *));
    PyObject *out = NULL, *result = NULL, *empty = NULL;
    Py_ssize_t bad = -1;
    if (seqs == NULL || lists == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t p = 0; p < count; p++) {
        unsigned long long s = PyLong_AsUnsignedLongLong(PyList_GET_ITEM(next_seqs, p));
        if (s == (unsigned long long)-1 && PyErr_Occurred()) {
            goto done;
        }
        seqs[p] = s;
    }
    out = PyDict_New();
    empty = PyTuple_New(0);
    if (out == NULL || empty == NULL) {
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *key = PyList_GET_ITEM(keys, i), *value = PyList_GET_ITEM(values, i);
        Py_ssize_t p = PyLong_AsSsize_t(PyList_GET_ITEM(parts, i));
        if (p == -1 && PyErr_Occurred()) {
            goto done;
        }
        if (p < 0 || p >= count) {
            PyErr_Format(PyExc_ValueError, "update_records(): row %zd's partition %zd is not "
                                           "one of %zd", i, p, count);
            goto done;
        }
        if (!PyBytes_CheckExact(key) || (value != Py_None && !PyBytes_CheckExact(value))) {
            PyErr_Format(PyExc_TypeError, "update_records(): row %zd: a key must be bytes, a "
                                          "value bytes or None", i);
            goto done;
        }
        const char *v = value == Py_None ? NULL : PyBytes_AS_STRING(value);
        Py_ssize_t value_size = value == Py_None ? 0 : PyBytes_GET_SIZE(value);
        PyObject *op = encode_update(o, origin_size, seqs[p], v, value_size);
        if (op == NULL) {
            goto done;
        }
        if (PyBytes_GET_SIZE(key) + PyBytes_GET_SIZE(op) > limit) {
            Py_DECREF(op);
            bad = i;
            break;
        }
        seqs[p] += (uint64_t)stride;
        PyObject *record = record_type->tp_alloc(record_type, 6);
        if (record == NULL) {
            Py_DECREF(op);
            goto done;
        }
        PyTuple_SET_ITEM(record, 0, Py_NewRef(key));
        PyTuple_SET_ITEM(record, 1, op);
        PyTuple_SET_ITEM(record, 2, Py_NewRef(empty));
        PyTuple_SET_ITEM(record, 3, Py_NewRef(Py_None));
        PyTuple_SET_ITEM(record, 4, Py_NewRef(Py_None));
        PyTuple_SET_ITEM(record, 5, Py_NewRef(Py_None));
        if (lists[p] == NULL) {
            lists[p] = PyList_New(0);
            PyObject *number = lists[p] == NULL ? NULL : PyLong_FromSsize_t(p);
            if (number == NULL || PyDict_SetItem(out, number, lists[p]) < 0) {
                Py_XDECREF(number);
                Py_DECREF(record);
                goto done;
            }
            Py_DECREF(number);
        }
        int appended = PyList_Append(lists[p], record);
        Py_DECREF(record);
        if (appended < 0) {
            goto done;
        }
    }
    if (bad >= 0) {
        PyDict_Clear(out);
    }
    else {
        for (Py_ssize_t p = 0; p < count; p++) {
            PyObject *s = PyLong_FromUnsignedLongLong(seqs[p]);
            if (s == NULL || PyList_SetItem(next_seqs, p, s) < 0) {
                goto done;
            }
        }
    }
    result = Py_BuildValue("(On)", out, bad);
done:
    if (lists != NULL) {
        for (Py_ssize_t p = 0; p < count; p++) {
            Py_XDECREF(lists[p]);
        }
    }
    PyMem_Free(lists);
    PyMem_Free(seqs);
    Py_XDECREF(out);
    Py_XDECREF(empty);
    return result;
}

static PyMethodDef bulk_methods[] = {
    {"update_records", (PyCFunction)(void (*)(void))update_records, METH_FASTCALL,
     PyDoc_STR("update_records(record_type, keys, values, partitions, origin, next_seqs, "
               "stride, limit): (records by partition, first row over limit or -1).")},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef bulk_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "kafkakv.map._bulk",
    .m_doc = PyDoc_STR("The ops records of many puts and removes at once (see "
                       "kafkakv.map.bulk)."),
    .m_size = -1,
    .m_methods = bulk_methods,
};

PyMODINIT_FUNC
PyInit__bulk(void)
{
    PyObject *module = PyModule_Create(&bulk_module);
    if (module == NULL) {
        return NULL;
    }
    PyObject *all = Py_BuildValue("[s]", "update_records");
    if (all == NULL || PyModule_AddObject(module, "__all__", all) < 0) {
        Py_XDECREF(all);
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
