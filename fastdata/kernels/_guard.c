/* fastdata's fault guard: shard maps that survive their file being cut short.
 *
 * Reading a page of a file mapping past the file's end raises SIGBUS, which kills the process:
 * a shard cut short (or rewritten in place) while a loader's batches are in flight. For the
 * address ranges of the shards' maps registered here, the handler maps a page of zeros over
 * the faulting page and counts the fault; the read goes on, and the loader, seeing the count
 * move, checks its shards and raises an OSError naming the one that changed. A fault anywhere
 * else goes to the handler there was before (the default: the process dies, as it would). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#if defined(__unix__) || defined(__APPLE__)
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>
#define GUARDS 65536
static uintptr_t guard_lo[GUARDS], guard_hi[GUARDS];
static int guard_top;                   /* slots in use are below it; free ones have lo == hi */
static long guard_faults, guard_page;
static struct sigaction guard_old;
static int guard_installed;

static void on_sigbus(int sig, siginfo_t *info, void *context) {
    uintptr_t a = (uintptr_t)info->si_addr;
    int top = __atomic_load_n(&guard_top, __ATOMIC_ACQUIRE);
    for (int i = 0; i < top; i++) {
        if (guard_lo[i] <= a && a < guard_hi[i]) {
            void *page = (void *)(a - a % (uintptr_t)guard_page);
            if (mmap(page, guard_page, PROT_READ | PROT_WRITE,
                     MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS, -1, 0) != MAP_FAILED) {
                __atomic_add_fetch(&guard_faults, 1, __ATOMIC_SEQ_CST);
                return;                 /* the read is retried, and reads zeros */
            }
            break;
        }
    }
    sigaction(SIGBUS, &guard_old, NULL);  /* not ours: the fault repeats under the old handler */
    (void)sig; (void)context;
}

static PyObject *guard(PyObject *self, PyObject *args) {
    unsigned long long addr, len;
    if (!PyArg_ParseTuple(args, "KK", &addr, &len)) return NULL;
    if (!guard_installed) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_sigaction = on_sigbus;
        sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
        sigemptyset(&sa.sa_mask);
        guard_page = sysconf(_SC_PAGESIZE);
        if (sigaction(SIGBUS, &sa, &guard_old)) return PyErr_SetFromErrno(PyExc_OSError);
        guard_installed = 1;
    }
    for (int i = 0; i < GUARDS; i++) {
        if (i < guard_top && guard_lo[i] != guard_hi[i]) continue;
        guard_lo[i] = (uintptr_t)addr;
        guard_hi[i] = (uintptr_t)(addr + len);
        if (i >= guard_top) __atomic_store_n(&guard_top, i + 1, __ATOMIC_RELEASE);
        return PyLong_FromLong(i);
    }
    return PyLong_FromLong(-1);         /* full: that map is not guarded */
}

static PyObject *unguard(PyObject *self, PyObject *args) {
    int i;
    if (!PyArg_ParseTuple(args, "i", &i)) return NULL;
    if (i >= 0 && i < guard_top) guard_hi[i] = guard_lo[i];
    Py_RETURN_NONE;
}

static PyObject *faults(PyObject *self, PyObject *args) {
    return PyLong_FromLong(__atomic_load_n(&guard_faults, __ATOMIC_SEQ_CST));
}
#define GUARD_METHODS \
    {"guard", guard, METH_VARARGS, "guard(addr, length) -> slot: see fastdata/shards/mapped.py"}, \
    {"unguard", unguard, METH_VARARGS, "unguard(slot)"}, \
    {"faults", faults, METH_NOARGS, "faults(): faults in guarded maps so far"},
#else
#define GUARD_METHODS
#endif


static PyMethodDef methods[] = {GUARD_METHODS {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_guard",
                                    "fastdata's fault guard (see fastdata/shards/mapped.py)", -1,
                                    methods};

PyMODINIT_FUNC PyInit__guard(void) { return PyModule_Create(&module); }
