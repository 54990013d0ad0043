/* kafkakv._gcpause: the collector's pause of kafkakv.gcpause, with its __enter__ and __exit__
 * in C.
 *
 * The same behaviour as py_gc_paused in gcpause.py, which tests/test_gcpause.py runs on the
 * same cases: one pause per process, lasting while any thread is inside a block; the collector
 * comes back on only if it was on when the first block began; a forked child keeps only the
 * blocks of the thread that forked. The counts need no lock of their own: nothing here
 * releases the GIL, so each method runs whole. A replica's follower enters two blocks on every
 * wake-up (the apply and, inside it, the log's read); in Python each of their methods was a
 * function call on the path from another process's write to a listener.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

static Py_ssize_t open_blocks = 0;       /* blocks open now, in every thread */
static int resume = 0;                   /* the collector was on when the first of them began */
static _Thread_local Py_ssize_t mine = 0; /* this thread's open blocks: what survives a fork */

typedef struct {
    PyObject_HEAD
} Pause;

static PyObject *the_pause = NULL; /* every gc_paused() is this one object: it has no state */

static PyObject *
pause_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    if (PyTuple_GET_SIZE(args) || (kwargs != NULL && PyDict_GET_SIZE(kwargs))) {
        PyErr_SetString(PyExc_TypeError, "gc_paused() takes no arguments");
        return NULL;
    }
    return Py_NewRef(the_pause);
}

static PyObject *
pause_enter(PyObject *self, PyObject *Py_UNUSED(unused))
{
    if (open_blocks == 0) {
        resume = PyGC_Disable(); /* whether it was on */
    }
    open_blocks++;
    mine++;
    Py_RETURN_NONE;
}

static PyObject *
pause_exit(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (open_blocks > 0) {
        open_blocks--;
    }
    if (mine > 0) {
        mine--;
    }
    if (open_blocks == 0 && resume) {
        PyGC_Enable();
    }
    Py_RETURN_NONE; /* exceptions pass */
}

static PyMethodDef pause_methods[] = {
    {"__enter__", pause_enter, METH_NOARGS, "Pause the collector (if it is on)."},
    {"__exit__", (PyCFunction)(void (*)(void))pause_exit, METH_FASTCALL,
     "Leave the block: the last one out turns the collector on again, if it was on."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject PauseType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "kafkakv._gcpause.gc_paused",
    .tp_basicsize = sizeof(Pause),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "with gc_paused(): the cyclic collector is off while any thread is inside.",
    .tp_new = pause_new,
    .tp_methods = pause_methods,
};

static PyObject *
after_fork_in_child(PyObject *module, PyObject *Py_UNUSED(unused))
{
    /* The forking thread is the only one left: the blocks of the others never end here.
     * The collector comes back on only where those blocks were what kept it off. */
    Py_ssize_t forgotten = open_blocks;
    open_blocks = mine;
    if (forgotten && open_blocks == 0 && resume) {
        PyGC_Enable();
    }
    Py_RETURN_NONE;
}

static PyMethodDef module_methods[] = {
    {"after_fork_in_child", after_fork_in_child, METH_NOARGS,
     "Forget the blocks of threads that did not fork (call in a forked child)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    .m_name = "kafkakv._gcpause",
    .m_doc = "The collector's pause of kafkakv.gcpause, in C.",
    .m_size = -1,
    .m_methods = module_methods,
};

PyMODINIT_FUNC
PyInit__gcpause(void)
{
    if (PyType_Ready(&PauseType) < 0) {
        return NULL;
    }
    PyObject *module = PyModule_Create(&module_def);
    if (module == NULL) {
        return NULL;
    }
    the_pause = PauseType.tp_alloc(&PauseType, 0);
    PyObject *all = Py_BuildValue("[ss]", "after_fork_in_child", "gc_paused");
    if (the_pause == NULL || all == NULL ||
        PyModule_AddObjectRef(module, "gc_paused", (PyObject *)&PauseType) < 0 ||
        PyModule_AddObject(module, "__all__", all) < 0) {
        Py_CLEAR(the_pause);
        Py_XDECREF(all);
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
