"""The compiled parts: the relay's native data path (src/vlmserve/gateway/_native_relay.c).

Optional by design: where they cannot be built (no C compiler, not Linux) the install goes on and
the gateway does the same in Python (for the relay, `--relay python` behaviour; `auto` picks
what is there)."""

import sys

from setuptools import Extension, setup

native = [Extension("vlmserve.gateway._native_relay", ["src/vlmserve/gateway/_native_relay.c"],
                    extra_compile_args=["-O2", "-std=gnu11"], optional=True)]
setup(ext_modules=native if sys.platform.startswith("linux") else [])
