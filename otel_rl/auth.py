"""Bearer tokens: the admin token of a server and rollout-scoped keys stored (hashed) in the store."""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from otel_rl.store import Store

TOKEN_FILE = Path(".otel_rl") / "token"
ROLLOUT_KEY_PREFIX = "orl-rk-"
MAX_TOKEN_FILE_BYTES = 4096  # a token is a line; anything larger is the wrong file


class Unauthorized(PermissionError):
    """A missing or unknown bearer token (HTTP 401, gRPC UNAUTHENTICATED)."""


class Forbidden(PermissionError):
    """A valid token that may not do this (HTTP 403, gRPC PERMISSION_DENIED)."""


@dataclass(frozen=True)
class Principal:
    """Who a request is from: the admin, or the agent of one rollout."""

    admin: bool
    rollout_id: str | None = None
    # The rollout identity the key was issued with (otel_rl.* keys: attempt, group, task, split): what its
    # records may say. Kept in memory: after a restart, a key's records are held to its rollout id alone.
    identity: Mapping[str, str] = field(default_factory=dict)


ADMIN = Principal(admin=True)


def admin_token(
    explicit: str | None,
    token_file: Path = TOKEN_FILE,
    *,
    explicit_file: Path | None = None,
    environ: Mapping[str, str] = os.environ,
) -> tuple[str, str]:
    """The admin token and where it came from: the argument, `explicit_file` (--token-file), OTEL_RL_TOKEN,
    the file named by OTEL_RL_TOKEN_FILE, `token_file`, or a new one.

    A new token is written to `token_file` (mode 600) so that local clients find it. A token file named
    by a flag or OTEL_RL_TOKEN_FILE must exist and hold a token (ValueError otherwise).
    """
    if explicit and explicit_file:
        raise ValueError("give the admin token once: --token or --token-file, not both")
    if explicit:
        return explicit, "--token"
    if explicit_file:
        return read_token_file(explicit_file), f"--token-file {explicit_file}"
    found = token_from_environment(environ)
    if found:
        return found
    if token_file.is_file():
        return read_token_file(token_file), str(token_file)
    token = secrets.token_urlsafe(32)
    token_file.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(token_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    return token, f"{token_file} (new)"


def token_from_environment(environ: Mapping[str, str] = os.environ) -> tuple[str, str] | None:
    """OTEL_RL_TOKEN, else the content of the file OTEL_RL_TOKEN_FILE names, and which; None if neither."""
    if environ.get("OTEL_RL_TOKEN"):
        return environ["OTEL_RL_TOKEN"], "OTEL_RL_TOKEN"
    if environ.get("OTEL_RL_TOKEN_FILE"):
        path = Path(environ["OTEL_RL_TOKEN_FILE"])
        return read_token_file(path), f"OTEL_RL_TOKEN_FILE {path}"
    return None


def client_token(explicit: str | None = None, environ: Mapping[str, str] = os.environ) -> str | None:
    """The token a client of the server sends: `explicit`, else OTEL_RL_TOKEN, else OTEL_RL_TOKEN_FILE's
    file, else the .otel_rl/token a local `otel-rl serve` wrote; None when there is none."""
    if explicit:
        return explicit
    found = token_from_environment(environ)
    if found:
        return found[0]
    return read_token_file(TOKEN_FILE) if TOKEN_FILE.is_file() else None


def read_token_file(path: Path) -> str:
    """The token in a file (surrounding whitespace dropped); ValueError naming the file if it holds none."""
    try:
        with path.open("rb") as f:
            content = f.read(MAX_TOKEN_FILE_BYTES + 1)
    except OSError as exc:
        raise ValueError(f"cannot read the token file {path}: {exc.strerror}") from None
    if len(content) > MAX_TOKEN_FILE_BYTES:
        raise ValueError(f"the token file {path} is over {MAX_TOKEN_FILE_BYTES} bytes: not a token")
    token = content.decode(errors="replace").strip()
    if not token or any(c.isspace() for c in token):
        raise ValueError(f"the token file {path} must hold one token on one line")
    return token


def bearer(header: str | None) -> str | None:
    """The token of an `Authorization: Bearer <token>` header value."""
    if not header:
        return None
    # OTEL_EXPORTER_OTLP_HEADERS values are percent-encoded (the OTel spec), and some exporters send them
    # undecoded: JavaScript's (Claude Code, opencode) send `Bearer%20<key>`. Keys never hold a '%'.
    scheme, _, token = header.strip().replace("%20", " ", 1).partition(" ")
    if scheme.lower() != "bearer":
        return None
    return token.strip() or None


def key_hash(key: str) -> str:
    """The stored form of a rollout key (keys are random, so a plain hash is enough)."""
    return hashlib.sha256(key.encode()).hexdigest()


class Auth:
    """Checks bearer tokens against the admin token and the rollout keys of one store."""

    def __init__(self, store: Store, admin_token: str, *, admin_token_source: str = str(TOKEN_FILE)) -> None:
        self._store = store
        self._admin_token = admin_token.encode()
        self._admin_token_whereabouts = admin_token_whereabouts(admin_token_source)
        self._lock = threading.Lock()
        self._rollout_keys = store.rollout_keys()
        self._identities: dict[str, dict[str, str]] = {}  # key hash -> identity it was issued with

    def issue_rollout_key(self, rollout_id: str, identity: Mapping[str, str] | None = None) -> str:
        """A new key that acts for `rollout_id` only, with the rest of its `identity` (otel_rl.* keys); it
        survives restarts (its hash is in the store; the identity beyond the rollout id does not)."""
        if not rollout_id:
            raise ValueError("a rollout key needs a rollout id")
        from otel_rl.input_rules import check_id, check_identity  # pydantic: not in a harness's light install

        check_id(rollout_id, "the rollout id")  # the rule of every route, for the whole identity
        check_identity(identity or {})
        key = ROLLOUT_KEY_PREFIX + secrets.token_urlsafe(24)
        hashed = key_hash(key)
        self._store.add_rollout_key(hashed, rollout_id)
        with self._lock:
            self._rollout_keys[hashed] = rollout_id
            if identity:
                self._identities[hashed] = dict(identity)
        return key

    def authenticate(self, authorization: str | None, *, admin_only: bool = False) -> Principal:
        """The principal of an Authorization header value; Unauthorized if missing or unknown, saying which
        credentials the route (`admin_only` or not) accepts and where they are."""
        token = bearer(authorization)
        if token is None:
            accepted = self._accepted(admin_only)
            raise Unauthorized(f"missing bearer token: send 'Authorization: Bearer <token>' with {accepted}")
        if hmac.compare_digest(token.encode(), self._admin_token):
            return ADMIN
        hashed = key_hash(token)
        rollout_id = self._rollout_keys.get(hashed)
        if rollout_id is None:
            raise Unauthorized(f"unknown bearer token: this route accepts {self._accepted(admin_only)}")
        return Principal(admin=False, rollout_id=rollout_id, identity=self._identities.get(hashed, {}))

    def _accepted(self, admin_only: bool) -> str:
        admin = f"the admin token ({self._admin_token_whereabouts})"
        if admin_only:
            return f"{admin} only"
        return f"{admin} or a rollout key ({ROLLOUT_KEY_PREFIX}..., issued by the rollout controller)"

    def require_admin(self, authorization: str | None) -> Principal:
        """The admin principal, or Unauthorized / Forbidden."""
        principal = self.authenticate(authorization, admin_only=True)
        if not principal.admin:
            raise Forbidden("this endpoint needs the admin token, not a rollout key")
        return principal


def admin_token_whereabouts(source: str) -> str:
    """Where a user finds the admin token, from the source `admin_token` reported: a file's path (relative
    to the folder the server started in), or the flag or variable that gave it."""
    source = source.removesuffix(" (new)")
    if source in ("--token", "OTEL_RL_TOKEN"):
        return f"given to the server as {source}"
    name, _, path = source.partition(" ")
    if name in ("--token-file", "OTEL_RL_TOKEN_FILE"):
        return f"in the file {path} ({name})"
    return f"in the file {source}, in the folder where otel-rl serve started"


def admin_required(auth: Auth) -> Callable[..., Principal]:
    """A FastAPI dependency: the admin principal, else 401 (no or an unknown token) or 403 (a rollout key).

    A dependency runs before the body is validated: a request without the token hears 401, never what is
    wrong with its body.
    """
    from fastapi import Header, HTTPException

    def admin(authorization: str | None = Header(default=None)) -> Principal:
        try:
            return auth.require_admin(authorization)
        except Unauthorized as exc:
            raise HTTPException(401, str(exc), headers={"WWW-Authenticate": "Bearer"}) from None
        except Forbidden as exc:
            raise HTTPException(403, str(exc)) from None

    return admin
