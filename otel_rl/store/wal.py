"""What of a store's write-ahead log DuckDB will replay, read from the file before DuckDB opens it."""

import logging
import re
import shutil
import struct
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

log = logging.getLogger(__name__)

# DuckDB 2.0's WAL: a header object (binary serializer: field 100 = entry type 98 "WAL_VERSION", ...,
# ended by the field id 0xFFFF), then entries of [u64 size][u64 checksum][size bytes]. Replay stops
# without a word at the first entry that does not fit in the file (a partial write), and refuses the whole
# file at a checksum mismatch. Measured on 2.0.1: a WAL truncated anywhere replays its complete entries and
# is then deleted; a damaged header (or one naming another database) replays nothing, silently, and the
# next commit overwrites the file.
_HEADER_MAX_BYTES = 256
_WAL_VERSION_ENTRY, _WAL_VERSION = 98, 2
_IDENTIFIER_BYTES, _DB_IDENTIFIER_OFFSET = 16, 124
_ENTRY_HEADER = struct.Struct("<QQ")


class StoreDamaged(RuntimeError):
    """The store cannot be opened because its WAL is damaged: `otel-rl store recover` salvages it."""


@dataclass(frozen=True)
class WalState:
    """A WAL's size and the part of it DuckDB replays (`replayable` bytes from the start, in `entries`)."""

    path: Path
    size: int
    replayable: int
    entries: int
    header_ok: bool

    @property
    def dropped(self) -> int:
        """Bytes after the replayable part: not replayed, and gone once DuckDB opens the store."""
        return self.size - self.replayable

    def describe(self) -> str:
        """One line for a user: what replays and what does not."""
        if not self.header_ok:
            return (
                f"the WAL {self.path} ({self.size} bytes) has a damaged header: DuckDB replays none of it, "
                "so every commit since the last checkpoint is lost"
            )
        if not self.dropped:
            return f"the WAL {self.path} is {self.size} bytes of {self.entries} complete entries"
        return (
            f"the WAL {self.path} is {self.size} bytes but replay stops at byte {self.replayable} "
            f"(after {self.entries} entries): the last {self.dropped} bytes are dropped. After a crash "
            "during a write this is the one commit that was never acknowledged; otherwise the WAL was "
            "damaged and the acknowledged data in those bytes is lost"
        )


def wal_path(db: Path) -> Path:
    return db.with_name(db.name + ".wal")


def read_wal(db: Path) -> WalState | None:
    """The WAL of the store file `db` as DuckDB will replay it; None when there is none (a clean close)."""
    path = wal_path(db)
    if not path.is_file() or path.stat().st_size == 0:
        return None
    size = path.stat().st_size
    starts = entry_starts(path)
    if starts is None:
        return WalState(path, size, replayable=0, entries=0, header_ok=False)
    return WalState(path, size, replayable=starts[-1], entries=len(starts) - 1, header_ok=True)


def entry_starts(path: Path) -> list[int] | None:
    """The offset of each complete entry of a WAL file, then the end of the last; None if DuckDB ignores
    the file: its header is damaged, or names another database than the store file beside it."""
    size = path.stat().st_size
    with path.open("rb") as wal:
        header_end = _header_end(wal.read(_HEADER_MAX_BYTES), path)
        if header_end is None:
            return None
        starts = [header_end]
        # Only the entry headers are read (a seek past each payload): a 256 MB WAL is walked in milliseconds.
        while starts[-1] + _ENTRY_HEADER.size <= size:
            wal.seek(starts[-1])
            entry_size, _checksum = _ENTRY_HEADER.unpack(wal.read(_ENTRY_HEADER.size))
            end_of_entry = starts[-1] + _ENTRY_HEADER.size + entry_size
            if entry_size == 0 or end_of_entry > size:
                break
            starts.append(end_of_entry)
    return starts


def _header_end(head: bytes, path: Path) -> int | None:
    """Where the header object ends, if it is what DuckDB 2.0 writes: field 100 = 98 (WAL_VERSION),
    101 = 2 (the version), 102 = the database identifier (a count, then as many LEB128 bytes: the file's
    main header holds it at _DB_IDENTIFIER_OFFSET), optionally 103, then the end marker 0xFFFF."""
    fields: dict[int, object] = {}
    position = 0
    while position + 2 <= len(head):
        (field_id,) = struct.unpack_from("<H", head, position)
        position += 2
        if field_id == 0xFFFF:
            break
        if field_id in fields or field_id not in (100, 101, 102, 103):
            return None
        value, position = _leb128(head, position)
        if field_id == 102:
            identifier = bytearray()
            for _ in range(min(value, 64)):
                byte, position = _leb128(head, position)
                identifier.append(byte & 0xFF)
            value = bytes(identifier)
        fields[field_id] = value
    else:
        return None
    if fields.get(100) != _WAL_VERSION_ENTRY or fields.get(101) != _WAL_VERSION:
        return None
    db = path.with_name(path.name.removesuffix(".wal"))
    with db.open("rb") as file:
        file.seek(_DB_IDENTIFIER_OFFSET)
        if file.read(_IDENTIFIER_BYTES) != fields.get(102):
            return None
    return position


def _leb128(data: bytes, position: int) -> tuple[int, int]:
    value = shift = 0
    while position < len(data):
        byte = data[position]
        position += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            break
    return value, position


def damaged_at(error: Exception) -> int | None:
    """The byte offset of the damaged entry in DuckDB's replay error, if it names one."""
    found = re.search(r"Corrupt WAL file: entry at byte position (\d+)", str(error))
    return int(found.group(1)) if found else None


def is_replay_error(error: Exception) -> bool:
    return "Failure while replaying WAL file" in str(error)


def keep_copy(path: Path, label: str) -> Path:
    """Copy `path` beside itself as `<name>.<UTC time>.<label>` (for forensics and recovery)."""
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S.%fZ")
    copy = path.with_name(f"{path.name}.{stamp}.{label}")
    shutil.copy2(path, copy)
    return copy


def check_before_open(db: Path) -> WalState | None:
    """Read the WAL before DuckDB replays it; when replay would drop part of it, say so loudly and keep a
    copy (DuckDB deletes or overwrites the WAL once the store is open, and with it the evidence)."""
    state = read_wal(db)
    if state is None or not state.dropped:
        return state
    copy = keep_copy(state.path, "unreplayed")
    log.error(
        "STORE DAMAGE: %s. A copy of the whole WAL is kept at %s; see `otel-rl store check`.",
        state.describe(),
        copy,
    )
    return state


def damaged_store_message(db: Path, error: Exception) -> str:
    """What to tell a user whose store does not open because its WAL is damaged."""
    state = read_wal(db)
    size = f" ({state.size} bytes: every commit since the last checkpoint)" if state else ""
    where = damaged_at(error)
    at = f" at byte {where}" if where is not None else ""
    return (
        f"the store {db} cannot be opened: its WAL {wal_path(db)}{size} is damaged{at} and DuckDB refuses "
        f"to replay it ({error}). Nothing has been changed. Stop every process using the store, then run "
        f"`otel-rl store check --db '{db}'` to see what is readable and `otel-rl store recover --db '{db}'` "
        "to keep a copy of the damaged files, replay the WAL up to the damage and open the store without the "
        "rest"
    )
