"""HTTPS for the gateway: the server's TLS context from a certificate and key file (PEM).

Rules kept: both files or neither; every problem (missing, unreadable, not PEM, key not
matching the certificate) is one line naming the file and what to do, raised before the
gateway binds its port. TLS 1.2 is the oldest version offered (Python's server defaults
otherwise, so ciphers follow the system's OpenSSL policy).
"""

from __future__ import annotations

import os
import ssl
from pathlib import Path

from vlmserve.errors import UserError


def server_ssl_context(certfile: Path | None, keyfile: Path | None) -> ssl.SSLContext | None:
    """The TLS context for `--ssl-certfile`/`--ssl-keyfile`, or None when neither is given."""
    if certfile is None and keyfile is None:
        return None
    if certfile is None or keyfile is None:
        raise UserError("HTTPS needs both --ssl-certfile and --ssl-keyfile: pass both, or neither for plain HTTP")
    for flag, path in (("--ssl-certfile", certfile), ("--ssl-keyfile", keyfile)):
        if not Path(path).is_file():
            raise UserError(f"{flag} {path} does not exist: give the path of a PEM file")
        if not os.access(path, os.R_OK):
            raise UserError(f"{flag} {path} is not readable by this user: fix its permissions")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(certfile=str(certfile), keyfile=str(keyfile), password=_encrypted_key(keyfile))
    except ssl.SSLError as err:
        reason = err.reason or (err.args[1] if len(err.args) > 1 else str(err))
        if reason == "KEY_VALUES_MISMATCH":
            raise UserError(
                f"--ssl-keyfile {keyfile} is not the key of --ssl-certfile {certfile}: pass the matching pair"
            ) from None
        raise UserError(
            f"--ssl-certfile {certfile} with --ssl-keyfile {keyfile} cannot be loaded ({reason}): "
            "give a PEM certificate (chain) and its unencrypted PEM key"
        ) from None
    except OSError as err:
        raise UserError(f"cannot read TLS certificate {certfile} or key {keyfile}: {err.strerror}") from None
    return context


def _encrypted_key(keyfile: Path):  # noqa: ANN202 (returns a nested callback)
    """Called by OpenSSL only for an encrypted key (instead of prompting on the terminal)."""

    def refuse() -> bytes:
        raise UserError(f"--ssl-keyfile {keyfile} is encrypted: give an unencrypted key (openssl pkey -in KEY -out PLAIN)")

    return refuse
