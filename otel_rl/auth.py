"""Bearer tokens: the admin token of a server and rollout-scoped keys stored (hashed) in the store."""

import hashlib
import hmac
import os
import secrets
import threading
from dataclasses import dataclass
from pathlib import Path

from otel_rl.store import Store

TOKEN_FILE = Path(".otel_rl") / "token"
ROLLOUT_KEY_PREFIX = "orl-rk-"


class Unauthorized(PermissionError):
    """A missing or unknown bearer token (HTTP 401, gRPC UNAUTHENTICATED)."""


class Forbidden(PermissionError):
    """A valid token that may not do this (HTTP 403, gRPC PERMISSION_DENIED)."""


@dataclass(frozen=True)
class Principal:
    """Who a request is from: the admin, or the agent of one rollout."""

    admin: bool
    rollout_id: str | None = None


ADMIN = Principal(admin=True)


def admin_token(explicit: str | None, token_file: Path = TOKEN_FILE) -> tuple[str, str]:
    """The admin token and where it came from: the argument, OTEL_RL_TOKEN, the token file, or a new one.

    A new token is written to `token_file` (mode 600) so that local clients find it.
    """
    if explicit:
        return explicit, "--token"
    if os.environ.get("OTEL_RL_TOKEN"):
        return os.environ["OTEL_RL_TOKEN"], "OTEL_RL_TOKEN"
    if token_file.is_file():
        return token_file.read_text().strip(), str(token_file)
    token = secrets.token_urlsafe(32)
    token_file.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(token_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    return token, f"{token_file} (new)"


def bearer(header: str | None) -> str | None:
    """The token of an `Authorization: Bearer <token>` header value."""
    if not header:
        return None
    scheme, _, token = header.strip().partition(" ")
    if scheme.lower() != "bearer":
        return None
    return token.strip() or None


def key_hash(key: str) -> str:
    """The stored form of a rollout key (keys are random, so a plain hash is enough)."""
    return hashlib.sha256(key.encode()).hexdigest()


class Auth:
    """Checks bearer tokens against the admin token and the rollout keys of one store."""

    def __init__(self, store: Store, admin_token: str) -> None:
        self._store = store
        self._admin_token = admin_token.encode()
        self._lock = threading.Lock()
        self._rollout_keys = store.rollout_keys()

    def issue_rollout_key(self, rollout_id: str) -> str:
        """A new key that acts for `rollout_id` only; it survives restarts (its hash is in the store)."""
        if not rollout_id:
            raise ValueError("a rollout key needs a rollout id")
        key = ROLLOUT_KEY_PREFIX + secrets.token_urlsafe(24)
        hashed = key_hash(key)
        self._store.add_rollout_key(hashed, rollout_id)
        with self._lock:
            self._rollout_keys[hashed] = rollout_id
        return key

    def authenticate(self, authorization: str | None) -> Principal:
        """The principal of an Authorization header value; Unauthorized if missing or unknown."""
        token = bearer(authorization)
        if token is None:
            raise Unauthorized("missing bearer token: send 'Authorization: Bearer <token>'")
        if hmac.compare_digest(token.encode(), self._admin_token):
            return ADMIN
        rollout_id = self._rollout_keys.get(key_hash(token))
        if rollout_id is None:
            raise Unauthorized("unknown bearer token")
        return Principal(admin=False, rollout_id=rollout_id)

    def require_admin(self, authorization: str | None) -> Principal:
        """The admin principal, or Unauthorized / Forbidden."""
        principal = self.authenticate(authorization)
        if not principal.admin:
            raise Forbidden("this endpoint needs the admin token, not a rollout key")
        return principal
