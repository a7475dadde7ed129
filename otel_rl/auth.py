"""Bearer tokens: the admin token of a server and rollout-scoped keys stored (hashed) in the store."""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from otel_rl.attributes import ATTEMPT_ID, ROLLOUT_ID

if TYPE_CHECKING:  # the store needs DuckDB, which a harness's light install (otel_rl.sdk) lacks
    from otel_rl.store import Store
    from otel_rl.store.keys import StoredKey

TOKEN_FILE = Path(".otel_rl") / "token"
ROLLOUT_KEY_PREFIX = "orl-rk-"
MAX_TOKEN_FILE_BYTES = 4096  # a token is a line; anything larger is the wrong file
# Far longer than an attempt's timeout (and the controller revokes the key when the attempt ends); short
# enough that a key left in a finished harness's environment dies the same day.
DEFAULT_KEY_LIFETIME_S = 6 * 3600.0


class Unauthorized(PermissionError):
    """A missing or unknown bearer token (HTTP 401, gRPC UNAUTHENTICATED)."""


class Forbidden(PermissionError):
    """A valid token that may not do this (HTTP 403, gRPC PERMISSION_DENIED)."""


@dataclass(frozen=True)
class Principal:
    """Who a request is from: the admin, or the agent of one attempt of one rollout."""

    admin: bool
    rollout_id: str | None = None
    # The identity the key was issued with (otel_rl.* keys: rollout, attempt, group, task, split): what its
    # calls are attributed to and what its records may say.
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
    """Checks bearer tokens against the admin token and the rollout keys of one store.

    A rollout key acts for one attempt of one rollout: a key issued for a new attempt of the rollout revokes
    the keys of its earlier attempts, the controller revokes an attempt's key when the attempt ends, the
    admin may revoke any, and every key expires `key_lifetime_s` after it was issued. Revocations are stored.
    """

    def __init__(
        self,
        store: Store,
        admin_token: str,
        *,
        key_lifetime_s: float = DEFAULT_KEY_LIFETIME_S,
        admin_token_source: str = str(TOKEN_FILE),
    ) -> None:
        if key_lifetime_s <= 0:
            raise ValueError(f"--rollout-key-lifetime must be > 0 seconds, not {key_lifetime_s:g}")
        self._store = store
        self._admin_token = admin_token.encode()
        self._admin_token_whereabouts = admin_token_whereabouts(admin_token_source)
        self.key_lifetime_s = key_lifetime_s
        self._lock = threading.Lock()  # guards the two maps below
        self._keys = store.rollout_keys(key_lifetime_s)
        self._by_rollout: dict[str, set[str]] = {}  # rollout id -> its key hashes
        for stored in self._keys.values():
            self._by_rollout.setdefault(stored.rollout_id, set()).add(stored.key_hash)

    def issue_rollout_key(self, rollout_id: str, identity: Mapping[str, str] | None = None) -> str:
        """A new key that acts for `rollout_id` only, with the rest of its `identity` (otel_rl.* keys); its
        hash, attempt and identity are stored (it survives restarts). With an attempt id, the rollout's keys
        of other attempts are revoked first: an attempt that was retried can no longer call or report."""
        from otel_rl.store.keys import StoredKey

        if not rollout_id:
            raise ValueError("a rollout key needs a rollout id")
        from otel_rl.input_rules import check_id, check_identity  # pydantic: not in a harness's light install

        check_id(rollout_id, "the rollout id")  # the rule of every route, for the whole identity
        check_identity(identity or {})
        full = {**(identity or {}), ROLLOUT_ID: rollout_id}
        attempt_id = full.get(ATTEMPT_ID)
        if attempt_id is not None:
            superseded = f"its attempt was superseded by attempt {attempt_id}"
            self._revoke(rollout_id, lambda k: k.attempt_id != attempt_id, superseded)
        key = ROLLOUT_KEY_PREFIX + secrets.token_urlsafe(24)
        stored = StoredKey(key_hash(key), rollout_id, attempt_id, full, time.time() + self.key_lifetime_s)
        self._store.add_rollout_key(stored)  # stored before it works: a key the store lost never works
        with self._lock:
            self._keys[stored.key_hash] = stored
            self._by_rollout.setdefault(rollout_id, set()).add(stored.key_hash)
        return key

    def revoke_rollout_keys(self, rollout_id: str, attempt_id: str | None, reason: str) -> int:
        """Revoke the valid keys of a rollout (of one of its attempts, with `attempt_id`); how many."""
        return self._revoke(rollout_id, lambda k: attempt_id is None or k.attempt_id == attempt_id, reason)

    def _revoke(self, rollout_id: str, matches: Callable[[StoredKey], bool], reason: str) -> int:
        """Refuse the rollout's valid keys that match, at once here and for good in the store."""
        now = time.time()
        with self._lock:
            keys = [self._keys[h] for h in self._by_rollout.get(rollout_id, ())]
            revoked = [k for k in keys if k.revoked is None and k.expires_at > now and matches(k)]
            for k in revoked:
                self._keys[k.key_hash] = replace(k, revoked=reason)
        if revoked:
            self._store.revoke_rollout_keys([k.key_hash for k in revoked], reason)
        return len(revoked)

    def authenticate(self, authorization: str | None, *, admin_only: bool = False) -> Principal:
        """The principal of an Authorization header value; Unauthorized if missing, unknown, revoked or
        expired, saying which credentials the route (`admin_only` or not) accepts and where they are."""
        token = bearer(authorization)
        if token is None:
            accepted = self._accepted(admin_only)
            raise Unauthorized(f"missing bearer token: send 'Authorization: Bearer <token>' with {accepted}")
        if hmac.compare_digest(token.encode(), self._admin_token):
            return ADMIN
        stored = self._keys.get(key_hash(token))
        if stored is None:
            raise Unauthorized(f"unknown bearer token: this route accepts {self._accepted(admin_only)}")
        if stored.revoked is not None or stored.expires_at <= time.time():
            attempt = f", attempt {stored.attempt_id}" if stored.attempt_id else ""
            why = stored.revoked or f"it expired at {_utc(stored.expires_at)} (--rollout-key-lifetime)"
            raise Unauthorized(
                f"the rollout key of rollout {stored.rollout_id}{attempt} is no longer valid: {why}"
            )
        return Principal(admin=False, rollout_id=stored.rollout_id, identity=stored.identity)

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


def _utc(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).isoformat(timespec="seconds")


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
