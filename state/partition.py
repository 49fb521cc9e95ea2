"""Key layout of one partition group inside the worker's store:
    g/<group>/ckpt                   checkpoint (JSON)
    g/<group>/w/<stream>/<seq>       window block appended by batch <seq> (Arrow IPC)
    g/<group>/m/<stream>/<seq>       outer/semi/anti joins: refs of <stream>'s rows batch <seq>
                                     matched for the first time (Arrow IPC; engine/outer.py)
Fixed-width numbers keep RocksDB's byte order equal to numeric order."""

from __future__ import annotations


def group_prefix(group: int) -> bytes:
    return f"g/{group:05d}/".encode()


def checkpoint_key(group: int) -> bytes:
    return group_prefix(group) + b"ckpt"


def window_prefix(group: int, stream: int) -> bytes:
    return group_prefix(group) + f"w/{stream:02d}/".encode()


def window_block_key(group: int, stream: int, seq: int) -> bytes:
    return window_prefix(group, stream) + f"{seq:012d}".encode()


def marks_prefix(group: int, stream: int) -> bytes:
    return group_prefix(group) + f"m/{stream:02d}/".encode()


def marks_key(group: int, stream: int, seq: int) -> bytes:
    return marks_prefix(group, stream) + f"{seq:012d}".encode()


def seq_of(key: bytes) -> int:
    return int(key.rsplit(b"/", 1)[1])


def window_block_of(key: bytes) -> tuple[int, int] | None:
    """(stream, seq) of a window block key; None for any other key (the checkpoint)."""
    parts = key.split(b"/")
    if len(parts) != 5 or parts[2] != b"w":
        return None
    return int(parts[3]), int(parts[4])


def group_of(key: bytes) -> int:
    """The partition group a state key belongs to."""
    return int(key.split(b"/", 2)[1])
