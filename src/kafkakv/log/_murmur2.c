/* kafkakv.log._murmur2: Kafka's murmur2 and the Java client's default partition of a key, in C.
 *
 * The same results and errors as py_murmur2 and py_partition_for in partitioner.py, which
 * tests/log/test_partitioner.py compares on the Kafka client's own test vectors and on random
 * keys. A sharded map places every key it reads or writes with it: in Python a 16-byte key
 * costs microseconds, here tens of nanoseconds.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#include "_murmur2.h" /* src/kafkakv/_murmur2.h: murmur2_hash */

/* The key's bytes: what py_partition_for accepts (bytes, bytearray, memoryview), else the
 * TypeError it raises. */
static int
key_view(PyObject *key, const char *caller, Py_buffer *view)
{
    if (!PyBytes_Check(key) && !PyByteArray_Check(key) && !PyMemoryView_Check(key)) {
        PyErr_Format(PyExc_TypeError, "%s needs a bytes key, not %s", caller,
                     Py_TYPE(key)->tp_name);
        return -1;
    }
    return PyObject_GetBuffer(key, view, PyBUF_C_CONTIGUOUS);
}

/* A partition count: 0 with *count set (-1: more partitions than any hash can reach, so a
 * key's partition is its hash), or -1 with what py_partition_for raises set. */
static int
count_arg(PyObject *arg, long long *count)
{
    int overflow = 0;
    long long n = PyLong_AsLongLongAndOverflow(arg, &overflow);
    if (n == -1 && PyErr_Occurred()) {
        return -1;
    }
    if (overflow < 0 || (overflow == 0 && n < 1)) {
        PyObject *shown = PyObject_Str(arg);
        if (shown != NULL) {
            PyErr_Format(PyExc_ValueError, "partitions must be >= 1, not %U", shown);
            Py_DECREF(shown);
        }
        return -1;
    }
    *count = overflow > 0 ? -1 : n;
    return 0;
}

/* The partition of a key of hash h among count partitions (see count_arg): Java's
 * toPositive, then the remainder. */
static PyObject *
place(uint32_t h, long long count)
{
    h &= 0x7fffffffu;
    return count < 0 ? PyLong_FromUnsignedLong(h) : PyLong_FromLongLong((long long)h % count);
}

static PyObject *
murmur2(PyObject *module, PyObject *data)
{
    Py_buffer view;
    if (PyObject_GetBuffer(data, &view, PyBUF_C_CONTIGUOUS) < 0) {
        return NULL;
    }
    uint32_t h = murmur2_hash(view.buf, view.len);
    PyBuffer_Release(&view);
    return PyLong_FromLong((long)(int32_t)h);
}

static PyObject *
partition_for(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_Format(PyExc_TypeError, "partition_for() takes 2 arguments (key, partitions), "
                                      "%zd given", nargs);
        return NULL;
    }
    Py_buffer view;
    if (key_view(args[0], "partition_for", &view) < 0) {
        return NULL;
    }
    long long count;
    if (count_arg(args[1], &count) < 0) {
        PyBuffer_Release(&view);
        return NULL;
    }
    uint32_t h = murmur2_hash(view.buf, view.len);
    PyBuffer_Release(&view);
    return place(h, count);
}

/* partition_each(keys, partitions, prefix): [partition_for(prefix + key, partitions) for key
 * in keys], without the concatenations and the calls. */
static PyObject *
partition_each(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3) {
        PyErr_Format(PyExc_TypeError, "partition_each() takes 3 arguments (keys, partitions, "
                                      "prefix), %zd given", nargs);
        return NULL;
    }
    long long count;
    if (count_arg(args[1], &count) < 0) {
        return NULL;
    }
    Py_buffer head;
    if (key_view(args[2], "partition_each", &head) < 0) {
        return NULL;
    }
    PyObject *result = NULL, *seq = PySequence_Fast(args[0], "partition_each needs a sequence");
    unsigned char *joined = NULL; /* prefix + key, when there is a prefix */
    Py_ssize_t room = 0;
    if (seq == NULL) {
        goto out;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    result = PyList_New(n);
    if (result == NULL) {
        goto out;
    }
    /* Only now: PyList_New may collect garbage, whose finalizers may resize a list ``seq``
     * is (PySequence_Fast returns a list itself). Nothing below runs Python code. */
    if (PySequence_Fast_GET_SIZE(seq) != n) {
        PyErr_SetString(PyExc_RuntimeError, "partition_each: the keys changed during the call");
        Py_CLEAR(result);
        goto out;
    }
    PyObject **items = PySequence_Fast_ITEMS(seq);
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_buffer key;
        if (key_view(items[i], "partition_for", &key) < 0) {
            Py_CLEAR(result);
            goto out;
        }
        const unsigned char *data = key.buf;
        Py_ssize_t size = key.len;
        if (head.len > 0) {
            size = head.len + key.len;
            if (size > room) {
                unsigned char *grown = PyMem_Realloc(joined, (size_t)size);
                if (grown == NULL) {
                    PyBuffer_Release(&key);
                    PyErr_NoMemory();
                    Py_CLEAR(result);
                    goto out;
                }
                joined = grown;
                room = size;
            }
            memcpy(joined, head.buf, (size_t)head.len);
            memcpy(joined + head.len, key.buf, (size_t)key.len);
            data = joined;
        }
        uint32_t h = murmur2_hash(data, size);
        PyBuffer_Release(&key);
        PyObject *p = place(h, count);
        if (p == NULL) {
            Py_CLEAR(result);
            goto out;
        }
        PyList_SET_ITEM(result, i, p);
    }
out:
    PyMem_Free(joined);
    Py_XDECREF(seq);
    PyBuffer_Release(&head);
    return result;
}

static PyMethodDef murmur2_methods[] = {
    {"murmur2", murmur2, METH_O,
     PyDoc_STR("murmur2(data, /)\n--\n\n"
               "Kafka's Utils.murmur2 of data: the 32-bit hash as a signed Java int.")},
    {"partition_for", (PyCFunction)(void (*)(void))partition_for, METH_FASTCALL,
     PyDoc_STR("partition_for(key, partitions, /)\n--\n\n"
               "The partition the Java client's default partitioner picks for key.")},
    {"partition_each", (PyCFunction)(void (*)(void))partition_each, METH_FASTCALL,
     PyDoc_STR("partition_each(keys, partitions, prefix, /)\n--\n\n"
               "The partition of prefix + key for each of keys.")},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef murmur2_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "kafkakv.log._murmur2",
    .m_doc = PyDoc_STR("Kafka's murmur2 and default partition in C (see "
                       "kafkakv.log.partitioner)."),
    .m_size = -1,
    .m_methods = murmur2_methods,
};

PyMODINIT_FUNC
PyInit__murmur2(void)
{
    PyObject *module = PyModule_Create(&murmur2_module);
    if (module == NULL) {
        return NULL;
    }
    PyObject *all = Py_BuildValue("[sss]", "murmur2", "partition_each", "partition_for");
    if (all == NULL || PyModule_AddObject(module, "__all__", all) < 0) {
        Py_XDECREF(all);
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
