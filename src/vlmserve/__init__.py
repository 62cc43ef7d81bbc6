"""vlmserve: from VLM weights on disk to a service that is proven deployable."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("vlmserve")
except PackageNotFoundError:  # running from a source tree without install
    __version__ = "0.0.0+src"
