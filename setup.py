"""The one compiled module: the gateway relay's per-chunk path (src/vlmserve/gateway/relay_core.py
says why). `optional`: without a C compiler the install goes on and the Python twin is used."""

from setuptools import Extension, setup

setup(ext_modules=[Extension("vlmserve.gateway._relay_core", ["src/vlmserve/gateway/_relay_core.pyx"], optional=True)])
