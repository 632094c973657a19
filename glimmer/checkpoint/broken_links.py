"""Symbolic links whose target is gone. A Hugging Face cache snapshot is a directory of links into its `blobs/`;
a blob deleted, or never finished downloading, leaves a link to nothing, which `Path.is_file()` quietly reports
as no file. Every reader names such a link, and where it points, instead of passing over it."""

from __future__ import annotations

import errno
import os
import re
from pathlib import Path

from glimmer.errors import CheckpointError, GlimmerError


def is_broken_link(path: Path) -> bool:
    """A symbolic link whose target does not exist (or a loop of links)."""
    return path.is_symlink() and not path.exists()


def broken_link_problem(path: Path) -> str:
    """`is a symbolic link to <target>, ...: <fix>`, to follow the link's name in an error."""
    if is_link_loop(path):  # its target is there, as a link leading back: "does not exist" would send to a download
        return (f"is a symbolic link to {os.readlink(path)}, which leads into a loop of symbolic links, with no "
                "file at its end: point the link at the file it stands for, or download the checkpoint again "
                "(`hf download REPO`)")
    return (f"is a symbolic link to {os.readlink(path)}, a file that does not exist (a Hugging Face cache whose blob "
            "was deleted, or a download cut short): download the checkpoint again (`hf download REPO`), or restore "
            "the file the link points to")


def is_link_loop(path: Path) -> bool:
    """Whether `path` is a symbolic link that leads, through links, back into itself (ELOOP)."""
    try:
        os.stat(path)
    except OSError as exc:
        return exc.errno == errno.ELOOP
    return False


# what a file cloned without git-lfs holds in place of its content (git-lfs's pointer file spec)
_LFS_POINTER = b"version https://git-lfs.github.com/spec/"


def lfs_pointer_problem(head: bytes) -> str | None:
    """`is a Git LFS pointer ...: <fix>` when `head`, a file's first kilobyte, is a Git LFS pointer; else None."""
    if not head.startswith(_LFS_POINTER):
        return None
    size = re.search(rb"^size (\d+)$", head, re.MULTILINE)
    declared = f" to a file of {int(size.group(1)):,} bytes" if size else ""
    return (f"is a Git LFS pointer{declared}, which was never downloaded: fetch it with `git lfs pull` in its "
            "repository (or download the file with `hf download`)")


def refuse_lfs_pointer(path: Path, error: type[GlimmerError] = CheckpointError) -> None:
    """Raise `error` naming `path` if it is a Git LFS pointer in place of its content (a repository cloned without
    git-lfs), which a reader would otherwise refuse as a damaged file of its format, or as a pickle that runs code."""
    try:
        with path.open("rb") as file:
            problem = lfs_pointer_problem(file.read(1024))
    except OSError:  # the reader names what it cannot read
        return
    if problem is not None:
        raise error(f"{path} {problem}")


def refuse_broken_link(path: Path, error: type[GlimmerError] = CheckpointError) -> None:
    """Raise `error` naming `path` and its missing target if `path` is a broken link: a reader calls it before it
    takes a file that is not there as one the checkpoint does without (generation_config.json, a chat template)."""
    if is_broken_link(path):
        raise error(f"{path} {broken_link_problem(path)}")


def refuse_not_a_file(path: Path, error: type[GlimmerError] = CheckpointError) -> None:
    """`refuse_broken_link`, and raise `error` naming `path` where it is there but no file (a directory): neither is
    taken as a file the checkpoint does without."""
    refuse_broken_link(path, error)
    if path.exists() and not path.is_file():
        raise error(f"{path} is not a file (a directory, or another kind of entry); put the file there, or remove it")
