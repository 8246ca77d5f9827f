"""Bearer tokens per role, from a tokens file that stores only their SHA-256 hashes.

Roles and what they may call (``PERMISSIONS``)::

    qveil.v1.ValueService   query, admin, auditor
    qveil.v1.AdminService   admin
    qveil.v1.AuditService   auditor
    grpc.health.v1.Health and reflection: no token (standard probes; reflection only by flag)

Tokens file (TOML; ``qveil serve --add-token ROLE --tokens-file F`` appends an entry and prints
the new token once)::

    [[token]]
    role = "admin"
    name = "ops"                       # free text, for logs
    sha256 = "3f5a...64 hex digits"    # sha256(token) as hex

Tokens are 256-bit random strings (``secrets.token_urlsafe(32)``), so a plain SHA-256 is not
brute-forceable and no slow KDF is needed. The presented token is hashed and compared with
``hmac.compare_digest`` against EVERY entry (no early exit), so timing reveals neither which
entry matched nor how much of a hash did.

Without a tokens file the server must listen on loopback only: anyone may query, nobody may
administer or audit (PERMISSION_DENIED). With one, every call needs a valid token
(UNAUTHENTICATED otherwise) whose role the service allows (PERMISSION_DENIED otherwise).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import tomllib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import tomli_w

from qveil.errors import InvalidArgument, PermissionDenied, Unauthenticated

__all__ = [
    "PERMISSIONS",
    "ROLES",
    "Authorizer",
    "Principal",
    "TokenEntry",
    "add_token",
    "hash_token",
    "load_tokens",
]

ROLES = ("query", "admin", "auditor")

PERMISSIONS: dict[str, frozenset[str]] = {
    "qveil.v1.ValueService": frozenset({"query", "admin", "auditor"}),
    "qveil.v1.AdminService": frozenset({"admin"}),
    "qveil.v1.AuditService": frozenset({"auditor"}),
}


@dataclass(frozen=True, slots=True)
class TokenEntry:
    role: str
    name: str
    digest: bytes  # sha256(token)


@dataclass(frozen=True, slots=True)
class Principal:
    """Who is calling: ``role`` None means anonymous (servers without a tokens file)."""

    role: str | None
    name: str


ANONYMOUS = Principal(role=None, name="anonymous")


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def load_tokens(path: str | Path) -> tuple[TokenEntry, ...]:
    """Parse a tokens file; InvalidArgument naming the bad entry."""
    p = Path(path)
    try:
        data = tomllib.loads(p.read_text())
    except FileNotFoundError:
        raise InvalidArgument(f"tokens file {str(p)!r} does not exist") from None
    except tomllib.TOMLDecodeError as exc:
        raise InvalidArgument(f"tokens file {str(p)!r} is not valid TOML: {exc}") from None
    entries = []
    for i, item in enumerate(data.get("token", [])):
        role, digest = item.get("role"), str(item.get("sha256", "")).lower()
        if role not in ROLES:
            raise InvalidArgument(
                f"tokens file {str(p)!r}: entry {i} has role {role!r}; expected one of {ROLES}"
            )
        if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
            raise InvalidArgument(
                f"tokens file {str(p)!r}: entry {i} needs sha256 = 64 hex "
                "digits (the file stores hashes, never tokens)"
            )
        entries.append(
            TokenEntry(role=role, name=str(item.get("name", f"#{i}")), digest=bytes.fromhex(digest))
        )
    if not entries:
        raise InvalidArgument(f"tokens file {str(p)!r} has no [[token]] entries")
    return tuple(entries)


def add_token(path: str | Path, role: str, name: str = "") -> str:
    """Append a new random token of ``role`` to the tokens file (created 0600) and return
    the token; only its hash is written."""
    if role not in ROLES:
        raise InvalidArgument(f"role {role!r} is not one of {ROLES}")
    token = secrets.token_urlsafe(32)
    p = Path(path)
    # the values are written by a TOML writer (tomli-w): a quote, backslash or newline in the
    # name is escaped, never spliced into the file
    entry = tomli_w.dumps({"role": role, "name": name or role, "sha256": hash_token(token)})
    fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    with os.fdopen(fd, "a") as fh:
        fh.write("\n[[token]]\n" + entry)
    return token


class Authorizer:
    """Checks the ``authorization: Bearer <token>`` metadata of a call against the table."""

    def __init__(self, entries: Iterable[TokenEntry] | None) -> None:
        self._entries = tuple(entries) if entries is not None else None

    @property
    def enabled(self) -> bool:
        return self._entries is not None

    def authenticate(self, authorization: str | None) -> Principal:
        if self._entries is None:
            return ANONYMOUS
        if not authorization:
            raise Unauthenticated(
                "missing bearer token (the 'authorization: Bearer <token>' header or gRPC metadata)"
            )
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise Unauthenticated("malformed authorization; expected 'Bearer <token>'")
        digest = hashlib.sha256(token.strip().encode()).digest()
        found: TokenEntry | None = None
        for entry in self._entries:  # every entry, no early exit
            if hmac.compare_digest(entry.digest, digest):
                found = entry
        if found is None:
            raise Unauthenticated("invalid bearer token")
        return Principal(role=found.role, name=found.name)

    def authorize(self, service: str, authorization: str | None) -> Principal:
        """The caller's principal if it may call ``service``; else raise."""
        principal = self.authenticate(authorization)
        allowed = PERMISSIONS.get(service, frozenset())
        if principal.role is None:
            if "query" in allowed:
                return principal
            raise PermissionDenied(
                f"{service} needs the admin or auditor role; this server has no tokens file, "
                "so nobody may administer or audit (start it with --tokens-file)"
            )
        if principal.role not in allowed:
            raise PermissionDenied(
                f"role {principal.role!r} may not call {service} (allowed: "
                f"{', '.join(sorted(allowed))})"
            )
        return principal
