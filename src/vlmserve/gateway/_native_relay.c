/* The relay's data path in C: streamed answers pumped from replica to client with no Python per chunk.
 *
 * Why: at 256 streams the gateway's CPU per chunk was within 1-3 % of vllm-router's, with the
 * same system calls (one read, one write per chunk); the rest was Python and asyncio work per
 * event, which compiling the Python (Cython, mypyc) cut by at most 4 % (docs/benchmarks.md).
 * Here a stream, once its first token is accounted, leaves the relay's Python: the pump reads the
 * replica's socket, passes whole chunked frames to the client's socket as they came, and reports
 * once, at the end. See native_pump.py for the Python side and the guarantees kept.
 *
 * The pump has its own epoll set of the streams' sockets, and the event loop watches that set's
 * descriptor like any other: when some pumped socket is ready the loop calls `run_once`, which
 * serves every ready socket in C and returns the streams that ended. One thread, no locks: a
 * pump thread of its own measured dearer per request (thread wake-ups and switches on a busy
 * core) than the one Python call per loop wake-up this costs.
 *
 * Per stream the pump keeps what relay.py keeps: the incomplete frame (held until whole, so a
 * cut stream still ends on a frame boundary), the last block that mentioned "usage" and the one
 * before it when that ended inside an SSE event, a block counter for the idle watchdog, and the
 * bytes the client's socket has not taken yet (while any wait, the replica is not read: memory
 * per stream stays bounded by one read). Events carry a slot index and a generation, so an event
 * for a stream that was cancelled (its slot perhaps reused) within the same batch is dropped.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#define READ_SIZE 65536
#define MAX_HELD (16 * 1024 * 1024) /* a frame longer than this is refused, not buffered */
#define MAX_SIZE_LINE 1024           /* as upstream.walk_frames */
#define MAX_EVENTS 256

enum end_code { END_NONE = 0, END_COMPLETED = 1, END_UPSTREAM_FAILED = 2, END_CLIENT_GONE = 3, END_CANCELLED = 4 };
enum failure { FAIL_NONE = 0, FAIL_SIZE_LINE_LONG, FAIL_BAD_SIZE_LINE, FAIL_NO_CRLF, FAIL_CLOSED, FAIL_ERRNO, FAIL_FRAME_TOO_LONG };

typedef struct {
    unsigned char *data;
    size_t len, cap;
} buf_t;

typedef struct stream {
    uint32_t gen;
    int in_use;         /* the slot holds a stream (running or done, results not taken) */
    int running;        /* its fds are registered in the pump's epoll set and owned by the pump */
    int up_fd, client_fd; /* the pump's own duplicates; closed when the stream ends */
    int up_registered;  /* the replica's socket is polled (not while the client's socket is full) */
    int end, failure, err;
    int trailing;       /* bytes came after the body's end: the connection must not be reused */
    uint64_t chunks;
    buf_t held, pending, usage_prev, usage_block, unfinished, bad_line;
    int body_ended;     /* the terminating chunk was seen; waiting for the client to take the rest */
    int done_listed;
} stream_t;

typedef struct {
    PyObject_HEAD
    int epfd;
    stream_t *slots;
    size_t nslots;
    size_t *done;  /* slot indices of ended streams, results not yet taken */
    size_t ndone, done_cap;
    unsigned char *readbuf;
} Pump;

static const unsigned char TERMINATOR[] = "0\r\n\r\n";

static int buf_set(buf_t *b, const unsigned char *src, size_t n) {
    if (n > b->cap) {
        unsigned char *p = realloc(b->data, n);
        if (p == NULL) return -1;
        b->data = p;
        b->cap = n;
    }
    if (n) memcpy(b->data, src, n);
    b->len = n;
    return 0;
}

static int buf_append(buf_t *b, const unsigned char *src, size_t n) {
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->len + n) cap *= 2;
        unsigned char *p = realloc(b->data, cap);
        if (p == NULL) return -1;
        b->data = p;
        b->cap = cap;
    }
    memcpy(b->data + b->len, src, n);
    b->len += n;
    return 0;
}

static void buf_free(buf_t *b) {
    free(b->data);
    b->data = NULL;
    b->len = b->cap = 0;
}

static uint64_t event_key(size_t slot, uint32_t gen, int client_side) {
    return ((uint64_t)slot << 33) | ((uint64_t)gen << 1) | (uint64_t)client_side;
}

/* Unregister and close the pump's duplicates; the stream's results wait for run_once/cancel. */
static void release_fds(Pump *p, stream_t *s) {
    if (!s->running) return;
    s->running = 0;
    if (s->up_registered) epoll_ctl(p->epfd, EPOLL_CTL_DEL, s->up_fd, NULL);
    s->up_registered = 0;
    epoll_ctl(p->epfd, EPOLL_CTL_DEL, s->client_fd, NULL);
    close(s->up_fd);
    close(s->client_fd);
    s->up_fd = s->client_fd = -1;
    buf_free(&s->pending);
}

static void finish(Pump *p, size_t slot, int end) {
    stream_t *s = &p->slots[slot];
    if (s->end == END_NONE) s->end = end;
    release_fds(p, s);
    if (!s->done_listed) {
        if (p->ndone == p->done_cap) {
            size_t cap = p->done_cap ? p->done_cap * 2 : 64;
            size_t *d = realloc(p->done, cap * sizeof(size_t));
            if (d == NULL) return; /* out of memory: cancel() still finds the stream */
            p->done = d;
            p->done_cap = cap;
        }
        s->done_listed = 1;
        p->done[p->ndone++] = slot;
    }
}

static void fail(Pump *p, size_t slot, int failure, int err) {
    stream_t *s = &p->slots[slot];
    s->failure = failure;
    s->err = err;
    finish(p, slot, END_UPSTREAM_FAILED);
}

/* Parse a size line as upstream.walk_frames accepts engines' lines: optional blanks, hex digits,
 * optional blanks, then an optional ";extension". Returns -1 when it is not one. */
static long long parse_size(const unsigned char *line, size_t n) {
    size_t i = 0, end = n;
    for (size_t k = 0; k < n; k++) {
        if (line[k] == ';') { end = k; break; }
    }
    while (i < end && (line[i] == ' ' || line[i] == '\t')) i++;
    while (end > i && (line[end - 1] == ' ' || line[end - 1] == '\t')) end--;
    if (i == end || end - i > 15) return -1;
    long long v = 0;
    for (; i < end; i++) {
        unsigned char c = line[i];
        int d;
        if (c >= '0' && c <= '9') d = c - '0';
        else if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
        else if (c >= 'A' && c <= 'F') d = c - 'A' + 10;
        else return -1;
        v = v * 16 + d;
    }
    return v;
}

/* Walk chunked framing from a frame boundary: as upstream.walk_frames. Returns 0, or a failure. */
static int walk(const unsigned char *d, size_t n, size_t *boundary, long long *end, buf_t *bad_line) {
    size_t i = 0;
    *end = -1;
    for (;;) {
        const unsigned char *eolp = NULL;
        for (size_t k = i; k + 1 < n; k++) {
            if (d[k] == '\r' && d[k + 1] == '\n') { eolp = d + k; break; }
            if (k - i > MAX_SIZE_LINE) break;
        }
        if (eolp == NULL) {
            *boundary = i;
            return n - i > MAX_SIZE_LINE ? FAIL_SIZE_LINE_LONG : 0;
        }
        size_t eol = (size_t)(eolp - d);
        long long size = parse_size(d + i, eol - i);
        if (size < 0) {
            buf_set(bad_line, d + i, eol - i < 40 ? eol - i : 40);
            *boundary = i;
            return FAIL_BAD_SIZE_LINE;
        }
        if (size == 0) {
            *boundary = i;
            if (eol + 4 <= n && d[eol + 2] == '\r' && d[eol + 3] == '\n') {
                *end = (long long)(eol + 4);
            } else if (eol + 4 <= n) {
                const unsigned char *t = memmem(d + eol + 2, n - eol - 2, "\r\n\r\n", 4);
                if (t != NULL) *end = (long long)(t - d) + 4;
            }
            return 0;
        }
        if (size > MAX_HELD) {
            *boundary = i;
            return FAIL_FRAME_TOO_LONG;
        }
        size_t following = eol + 2 + (size_t)size;
        if (following + 2 > n) {
            *boundary = i;
            return 0;
        }
        if (d[following] != '\r' || d[following + 1] != '\n') {
            *boundary = i;
            return FAIL_NO_CRLF;
        }
        i = following + 2;
    }
}

static void set_polling(Pump *p, size_t slot, int client_full) {
    stream_t *s = &p->slots[slot];
    struct epoll_event ev;
    ev.events = EPOLLRDHUP | (client_full ? EPOLLOUT : 0);
    ev.data.u64 = event_key(slot, s->gen, 1);
    epoll_ctl(p->epfd, EPOLL_CTL_MOD, s->client_fd, &ev);
    if (client_full && s->up_registered) {
        epoll_ctl(p->epfd, EPOLL_CTL_DEL, s->up_fd, NULL);
        s->up_registered = 0;
    } else if (!client_full && !s->up_registered && !s->body_ended) {
        ev.events = EPOLLIN;
        ev.data.u64 = event_key(slot, s->gen, 0);
        epoll_ctl(p->epfd, EPOLL_CTL_ADD, s->up_fd, &ev);
        s->up_registered = 1;
    }
}

/* Write what the client's socket takes now; the rest waits in `pending`. Returns -1 when the
 * client is gone (the stream is finished), 1 when bytes wait, 0 when all went out. */
static int send_out(Pump *p, size_t slot, const unsigned char *data, size_t n) {
    stream_t *s = &p->slots[slot];
    size_t off = 0;
    while (off < n) {
        ssize_t w = send(s->client_fd, data + off, n - off, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w > 0) { off += (size_t)w; continue; }
        if (w < 0 && errno == EINTR) continue;
        if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
        finish(p, slot, END_CLIENT_GONE);
        return -1;
    }
    if (off == n) return 0;
    if (buf_set(&s->pending, data + off, n - off) < 0) {
        finish(p, slot, END_CLIENT_GONE);
        return -1;
    }
    set_polling(p, slot, 1);
    return 1;
}

static int ends_event(const unsigned char *d, size_t n) {
    return n >= 4 && memcmp(d + n - 4, "\n\n\r\n", 4) == 0;
}

/* What relay._take does with a block, for the whole frames in d[0:n]. */
static void take(Pump *p, size_t slot, const unsigned char *d, size_t n) {
    stream_t *s = &p->slots[slot];
    size_t boundary;
    long long end;
    int failure = walk(d, n, &boundary, &end, &s->bad_line);
    if (failure) {
        fail(p, slot, failure, 0);
        return;
    }
    const unsigned char *out = d;
    size_t out_len = boundary;
    if (out_len) {
        if (memmem(out, out_len, "\"usage\"", 7) != NULL) {
            buf_set(&s->usage_prev, s->unfinished.data, s->unfinished.len);
            buf_set(&s->usage_block, out, out_len);
        }
        if (ends_event(out, out_len)) s->unfinished.len = 0;
        else buf_set(&s->unfinished, out, out_len);
    }
    if (end >= 0) {
        if ((size_t)end < n) s->trailing = 1;
        s->body_ended = 1;
        if (s->up_registered) {
            epoll_ctl(p->epfd, EPOLL_CTL_DEL, s->up_fd, NULL);
            s->up_registered = 0;
        }
        /* the frames and the terminator in one write when they fit (the common last block) */
        unsigned char small[8192];
        int r;
        if (out_len + 5 <= sizeof small) {
            memcpy(small, out, out_len);
            memcpy(small + out_len, TERMINATOR, 5);
            r = send_out(p, slot, small, out_len + 5);
        } else {
            r = send_out(p, slot, out, out_len);
            if (r == 0) r = send_out(p, slot, TERMINATOR, 5);
            else if (r == 1) buf_append(&s->pending, TERMINATOR, 5);
        }
        if (r == 0) finish(p, slot, END_COMPLETED);
        s->held.len = 0;
        return;
    }
    if (n - boundary > MAX_HELD) {
        fail(p, slot, FAIL_FRAME_TOO_LONG, 0);
        return;
    }
    if (out_len && send_out(p, slot, out, out_len) < 0) return;
    if (s->held.data != d || boundary) {
        if (s->held.data == d) {
            memmove(s->held.data, d + boundary, n - boundary);
            s->held.len = n - boundary;
        } else {
            buf_set(&s->held, d + boundary, n - boundary);
        }
    }
}

static void on_upstream(Pump *p, size_t slot) {
    stream_t *s = &p->slots[slot];
    ssize_t r;
    do {
        r = recv(s->up_fd, p->readbuf, READ_SIZE, MSG_DONTWAIT);
    } while (r < 0 && errno == EINTR);
    if (r < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK) return;
        fail(p, slot, FAIL_ERRNO, errno);
        return;
    }
    if (r == 0) {
        fail(p, slot, FAIL_CLOSED, 0);
        return;
    }
    s->chunks++;
    if (s->held.len) {
        if (buf_append(&s->held, p->readbuf, (size_t)r) < 0) {
            fail(p, slot, FAIL_FRAME_TOO_LONG, 0);
            return;
        }
        take(p, slot, s->held.data, s->held.len);
    } else {
        take(p, slot, p->readbuf, (size_t)r);
    }
}

static void on_client(Pump *p, size_t slot, uint32_t events) {
    stream_t *s = &p->slots[slot];
    if (events & EPOLLOUT && s->pending.len) {
        ssize_t w;
        do {
            w = send(s->client_fd, s->pending.data, s->pending.len, MSG_NOSIGNAL | MSG_DONTWAIT);
        } while (w < 0 && errno == EINTR);
        if (w < 0 && errno != EAGAIN && errno != EWOULDBLOCK) {
            finish(p, slot, END_CLIENT_GONE);
            return;
        }
        if (w > 0) {
            memmove(s->pending.data, s->pending.data + w, s->pending.len - (size_t)w);
            s->pending.len -= (size_t)w;
        }
        if (s->pending.len == 0) {
            if (s->body_ended) {
                finish(p, slot, END_COMPLETED);
                return;
            }
            set_polling(p, slot, 0);
        }
        return;
    }
    if (events & (EPOLLRDHUP | EPOLLHUP | EPOLLERR)) finish(p, slot, END_CLIENT_GONE);
}

/* ---- Python ------------------------------------------------------------------------------- */

static PyObject *Pump_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    Pump *p = (Pump *)type->tp_alloc(type, 0);
    if (p == NULL) return NULL;
    p->epfd = epoll_create1(EPOLL_CLOEXEC);
    p->readbuf = malloc(READ_SIZE);
    if (p->epfd < 0 || p->readbuf == NULL) {
        PyErr_SetFromErrno(PyExc_OSError);
        Py_DECREF(p);
        return NULL;
    }
    return (PyObject *)p;
}

static void free_stream(stream_t *s) {
    buf_free(&s->held);
    buf_free(&s->pending);
    buf_free(&s->usage_prev);
    buf_free(&s->usage_block);
    buf_free(&s->unfinished);
    buf_free(&s->bad_line);
    s->in_use = 0;
    s->done_listed = 0;
    s->gen++;
}

static void Pump_dealloc(Pump *p) {
    for (size_t i = 0; i < p->nslots; i++) {
        if (p->slots[i].in_use) {
            release_fds(p, &p->slots[i]);
            free_stream(&p->slots[i]);
        }
    }
    free(p->slots);
    free(p->done);
    free(p->readbuf);
    if (p->epfd >= 0) close(p->epfd);
    Py_TYPE(p)->tp_free((PyObject *)p);
}

static PyObject *Pump_fileno(Pump *p, PyObject *unused) { return PyLong_FromLong(p->epfd); }

static PyObject *Pump_start(Pump *p, PyObject *args) {
    int up_fd, client_fd;
    if (!PyArg_ParseTuple(args, "ii", &up_fd, &client_fd)) return NULL;
    if (p->epfd < 0) {
        PyErr_SetString(PyExc_RuntimeError, "the pump is closed");
        return NULL;
    }
    /* duplicates: the event loop may close its descriptors (a client gone) while the pump still
     * holds the stream; a duplicate keeps the number from being reused under it */
    int up = fcntl(up_fd, F_DUPFD_CLOEXEC, 0);
    if (up < 0) return PyErr_SetFromErrno(PyExc_OSError);
    int client = fcntl(client_fd, F_DUPFD_CLOEXEC, 0);
    if (client < 0) {
        close(up);
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    size_t slot = p->nslots;
    for (size_t i = 0; i < p->nslots; i++) {
        if (!p->slots[i].in_use) { slot = i; break; }
    }
    if (slot == p->nslots) {
        size_t n = p->nslots ? p->nslots * 2 : 64;
        stream_t *grown = realloc(p->slots, n * sizeof(stream_t));
        if (grown == NULL) {
            close(up);
            close(client);
            return PyErr_NoMemory();
        }
        memset(grown + p->nslots, 0, (n - p->nslots) * sizeof(stream_t));
        p->slots = grown;
        p->nslots = n;
    }
    stream_t *s = &p->slots[slot];
    uint32_t gen = s->gen;
    memset(s, 0, sizeof *s);
    s->gen = gen;
    s->in_use = 1;
    s->running = 1;
    s->up_fd = up;
    s->client_fd = client;
    struct epoll_event ev = {.events = EPOLLRDHUP, .data.u64 = event_key(slot, gen, 1)};
    int bad = epoll_ctl(p->epfd, EPOLL_CTL_ADD, client, &ev) < 0;
    if (!bad) {
        ev.events = EPOLLIN;
        ev.data.u64 = event_key(slot, gen, 0);
        bad = epoll_ctl(p->epfd, EPOLL_CTL_ADD, up, &ev) < 0;
        if (bad) epoll_ctl(p->epfd, EPOLL_CTL_DEL, client, NULL);
        else s->up_registered = 1;
    }
    int err = errno;
    if (bad) {
        s->up_registered = 0;
        epoll_ctl(p->epfd, EPOLL_CTL_DEL, up, NULL);
        epoll_ctl(p->epfd, EPOLL_CTL_DEL, client, NULL);
        s->running = 0;
        close(up);
        close(client);
        free_stream(s);
        errno = err;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    return PyLong_FromUnsignedLongLong(((uint64_t)slot << 32) | gen);
}

static stream_t *lookup(Pump *p, PyObject *arg, size_t *slot_out) {
    unsigned long long handle = PyLong_AsUnsignedLongLong(arg);
    if (handle == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
    size_t slot = (size_t)(handle >> 32);
    uint32_t gen = (uint32_t)(handle & 0xFFFFFFFFu);
    if (slot >= p->nslots || !p->slots[slot].in_use || p->slots[slot].gen != gen) return NULL;
    *slot_out = slot;
    return &p->slots[slot];
}

static PyObject *Pump_chunks(Pump *p, PyObject *arg) {
    size_t slot;
    stream_t *s = lookup(p, arg, &slot);
    uint64_t chunks = s ? s->chunks : 0;
    if (PyErr_Occurred()) return NULL;
    return PyLong_FromUnsignedLongLong(chunks);
}

static PyObject *bytes_of(buf_t *b) { return PyBytes_FromStringAndSize((const char *)b->data, (Py_ssize_t)b->len); }

/* (end, failure, errno, chunks, usage_prev, usage_block, trailing, held, bad_line); frees the slot */
static PyObject *result_of(Pump *p, stream_t *s) {
    PyObject *r = Py_BuildValue("(iiiKNNiNN)", s->end, s->failure, s->err, (unsigned long long)s->chunks,
                                bytes_of(&s->usage_prev), bytes_of(&s->usage_block), s->trailing,
                                bytes_of(&s->held), bytes_of(&s->bad_line));
    free_stream(s);
    return r;
}

static void unlist_done(Pump *p, size_t slot) {
    for (size_t i = 0; i < p->ndone; i++) {
        if (p->done[i] == slot) {
            p->done[i] = p->done[--p->ndone];
            return;
        }
    }
}

static PyObject *Pump_cancel(Pump *p, PyObject *arg) {
    size_t slot;
    stream_t *s = lookup(p, arg, &slot);
    if (s == NULL) {
        if (PyErr_Occurred()) return NULL;
        Py_RETURN_NONE;
    }
    if (s->end == END_NONE) s->end = END_CANCELLED;
    release_fds(p, s);
    if (s->done_listed) unlist_done(p, slot);
    return result_of(p, s);
}

/* Serve every pumped socket that is ready now; return the streams that ended. */
static PyObject *Pump_run_once(Pump *p, PyObject *unused) {
    struct epoll_event events[MAX_EVENTS];
    int n = p->epfd < 0 ? 0 : epoll_wait(p->epfd, events, MAX_EVENTS, 0);
    for (int i = 0; i < n; i++) {
        uint64_t key = events[i].data.u64;
        size_t slot = (size_t)(key >> 33);
        uint32_t gen = (uint32_t)((key >> 1) & 0xFFFFFFFFu);
        if (slot < p->nslots && p->slots[slot].gen == gen && p->slots[slot].running) {
            if (key & 1) on_client(p, slot, events[i].events);
            else on_upstream(p, slot);
        }
    }
    if (p->ndone == 0) return PyList_New(0);
    PyObject *list = PyList_New(0);
    if (list == NULL) return NULL;
    for (size_t i = 0; i < p->ndone; i++) {
        stream_t *s = &p->slots[p->done[i]];
        PyObject *handle = PyLong_FromUnsignedLongLong(((uint64_t)p->done[i] << 32) | s->gen);
        PyObject *r = result_of(p, s);
        PyObject *pair = (handle && r) ? PyTuple_Pack(2, handle, r) : NULL;
        Py_XDECREF(handle);
        Py_XDECREF(r);
        if (pair == NULL || PyList_Append(list, pair) < 0) {
            Py_XDECREF(pair);
            p->ndone = 0; /* what was taken so far is freed; the rest is lost with the error */
            Py_DECREF(list);
            return NULL;
        }
        Py_DECREF(pair);
    }
    p->ndone = 0;
    return list;
}

static PyObject *Pump_running(Pump *p, PyObject *unused) {
    size_t n = 0;
    for (size_t i = 0; i < p->nslots; i++) n += p->slots[i].running;
    return PyLong_FromSize_t(n);
}

/* Drop every stream (their results are lost: cancel them first) and close the epoll set. */
static PyObject *Pump_close(Pump *p, PyObject *unused) {
    for (size_t i = 0; i < p->nslots; i++) {
        if (p->slots[i].in_use) {
            release_fds(p, &p->slots[i]);
            free_stream(&p->slots[i]);
        }
    }
    p->ndone = 0;
    if (p->epfd >= 0) close(p->epfd);
    p->epfd = -1;
    Py_RETURN_NONE;
}

static PyMethodDef Pump_methods[] = {
    {"fileno", (PyCFunction)Pump_fileno, METH_NOARGS, "The epoll set's descriptor: readable when a pumped socket is ready (run_once)."},
    {"start", (PyCFunction)Pump_start, METH_VARARGS, "start(upstream_fd, client_fd) -> handle: pump a stream from now on."},
    {"chunks", (PyCFunction)Pump_chunks, METH_O, "chunks(handle) -> blocks read so far (for the idle watchdog)."},
    {"cancel", (PyCFunction)Pump_cancel, METH_O, "cancel(handle) -> result or None: stop pumping now, whatever the state."},
    {"run_once", (PyCFunction)Pump_run_once, METH_NOARGS, "run_once() -> [(handle, result)]: serve the ready sockets; the streams that ended."},
    {"running", (PyCFunction)Pump_running, METH_NOARGS, "running() -> streams being pumped."},
    {"close", (PyCFunction)Pump_close, METH_NOARGS, "Drop every stream and close the epoll set."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject PumpType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "vlmserve.gateway._native_relay.Pump",
    .tp_basicsize = sizeof(Pump),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Pumps streamed answers from replicas to clients, driven by the event loop (see native_pump.py).",
    .tp_new = Pump_new,
    .tp_dealloc = (destructor)Pump_dealloc,
    .tp_methods = Pump_methods,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_native_relay", "The relay's data path in C (see native_pump.py).", -1, NULL,
};

PyMODINIT_FUNC PyInit__native_relay(void) {
    if (PyType_Ready(&PumpType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    Py_INCREF(&PumpType);
    if (PyModule_AddObject(m, "Pump", (PyObject *)&PumpType) < 0) {
        Py_DECREF(&PumpType);
        Py_DECREF(m);
        return NULL;
    }
    PyModule_AddIntConstant(m, "END_COMPLETED", END_COMPLETED);
    PyModule_AddIntConstant(m, "END_UPSTREAM_FAILED", END_UPSTREAM_FAILED);
    PyModule_AddIntConstant(m, "END_CLIENT_GONE", END_CLIENT_GONE);
    PyModule_AddIntConstant(m, "END_CANCELLED", END_CANCELLED);
    PyModule_AddIntConstant(m, "FAIL_SIZE_LINE_LONG", FAIL_SIZE_LINE_LONG);
    PyModule_AddIntConstant(m, "FAIL_BAD_SIZE_LINE", FAIL_BAD_SIZE_LINE);
    PyModule_AddIntConstant(m, "FAIL_NO_CRLF", FAIL_NO_CRLF);
    PyModule_AddIntConstant(m, "FAIL_CLOSED", FAIL_CLOSED);
    PyModule_AddIntConstant(m, "FAIL_ERRNO", FAIL_ERRNO);
    PyModule_AddIntConstant(m, "FAIL_FRAME_TOO_LONG", FAIL_FRAME_TOO_LONG);
    return m;
}
