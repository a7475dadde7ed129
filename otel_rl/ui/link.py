"""The web view's link: it carries the admin token, so it goes only to a file of the user's or where asked."""

import os
from pathlib import Path


def ui_address(host: str, port: int) -> str:
    """The web view's address, without a credential: its page asks for the token."""
    return f"http://{host}:{port}/ui"


def ui_link(host: str, port: int, token: str) -> str:
    """The address with the admin token in its fragment (the page moves it into the tab's session storage:
    a fragment is never sent to a server)."""
    return f"{ui_address(host, port)}#token={token}"


def link_file(db: Path) -> Path:
    """Where the server writes the web view's link: beside its store, one file per store."""
    return db.with_name(db.name + ".ui-link")


def write_private(path: Path, text: str) -> None:
    """Write `text` to `path`, readable and writable by this user only (mode 600, also when it existed)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        os.fchmod(f.fileno(), 0o600)  # a file that existed keeps its mode through O_CREAT
        f.write(text + "\n")


def web_view_line(address: str, link: str, db: Path) -> str:
    """The banner's line on the web view: its address, and the file its link (with the token) is in.

    The link is written to a file only this user can read, never printed: terminals, CI logs and the server's
    log are read by more people than the admin token should be.
    """
    path = link_file(db)
    try:
        write_private(path, link)
    except OSError as error:
        return f"web view: {address} (could not write its link to {path}: {error.strerror}; paste the token)"
    return f"web view: {address} (its link with the admin token: {path}, mode 600)"
