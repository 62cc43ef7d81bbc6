# cython: language_level=3
"""relay_core.py's per-chunk path, compiled: the same tests and writes with no interpreter frame.

Built at install (setup.py, optional); relay_core.py says why it exists and falls back to its
Python twin, PyRelayCore, whose behaviour this must match (tests/unit/test_relay_core.py).
At 256 streams each block finds its relay cold in the CPU cache, so what this touches per block
is kept to the relay's first cache line (its C fields), the block and the client's transport:
the progress counter is a C field, the frame's size line is checked by arithmetic rather than
read from relay_frames.FRAME_HEADS, and `write` is looked up on the transport's type.
"""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_CheckExact, PyBytes_GET_SIZE
from libc.string cimport memcmp

from vlmserve.gateway.relay_frames import EVENT_END_FRAME, INLINE_MAX, USAGE_KEY


cdef extern from "string.h":
    void *memmem(const void *haystack, size_t haystacklen, const void *needle, size_t needlelen) nogil


cdef Py_ssize_t _inline_max = INLINE_MAX
cdef bytes _usage_key = USAGE_KEY
cdef bytes _event_end = EVENT_END_FRAME
cdef const char *_hex = b"0123456789abcdef"


cdef inline bint _one_whole_frame(const char *raw, Py_ssize_t size) noexcept nogil:
    """Whether the block is exactly one frame with a lowercase size line of 1-3 digits
    (relay_frames.frame_heads' rule: a k-digit line leaves size - k - 4 payload bytes)."""
    cdef Py_ssize_t digits, payload, low, high, i
    low = 1
    high = 0xF
    for digits in range(1, 4):
        payload = size - digits - 4
        if low <= payload <= high:
            if raw[digits] != b'\r' or raw[digits + 1] != b'\n':
                return False
            for i in range(digits):
                if raw[digits - 1 - i] != _hex[payload & 0xF]:
                    return False
                payload >>= 4
            return True
        low = high + 1
        high = high * 16 + 0xF
    return False


cdef class RelayCore:
    """The base of relay.py's StreamRelay (see relay_core.py)."""

    cdef public bint fast
    cdef public Py_ssize_t chunks
    cdef public object client
    cdef public bytes usage_block
    cdef public bytes usage_prev

    def __cinit__(self, *args, **kwargs):
        self.usage_block = b""
        self.usage_prev = b""

    def data_received(self, data):
        cdef Py_ssize_t size, end_size
        cdef const char *raw
        if self.fast and PyBytes_CheckExact(data):
            size = PyBytes_GET_SIZE(data)
            end_size = PyBytes_GET_SIZE(_event_end)
            raw = PyBytes_AS_STRING(data)
            if (end_size <= size <= _inline_max and _one_whole_frame(raw, size)
                    and memcmp(raw + size - end_size, PyBytes_AS_STRING(_event_end), end_size) == 0):
                self.chunks += 1
                if memmem(raw, size, PyBytes_AS_STRING(_usage_key), PyBytes_GET_SIZE(_usage_key)) != NULL:
                    self.usage_prev = b""
                    self.usage_block = data
                self.client.write(data)
                return
        self.take_block(data)

    def take_block(self, data):
        """Any block but a whole event-ending frame on the inline path (the subclass's)."""
        raise NotImplementedError
