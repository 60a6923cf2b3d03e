#!/usr/bin/env python3
"""briq bridge: drives a Jupyter kernel inside a briq sandbox on behalf of briq-operator.

This file is uploaded alone as ``.briq/bridge.py`` and run from ``/work`` as::

    BRIQ_NONCE=NONCE python3 .briq/bridge.py <command> [opts]

with one of the commands setup, start-kernel, probe, run, recall, cancel, save-state,
restore-state, set-env, file-write, file-read, fork-save and fork-load; ``follow`` relays a
running attempt's output (no envelope).

The nonce comes in the environment, never in argv (any process can read any command line).
When the bridge runs as root, the kernel (and so all user code) runs as uid/gid 65534 in
``/work/home``, and everything of the bridge's under ``.briq`` is root-only (PROTOCOL.md
"Users and permissions").

Every command prints exactly one framed JSON envelope on stdout (the contract is
``bridge/PROTOCOL.md``); one too large for briq's stdout capture is written to
``.briq/results/<nonce>.out`` and a small ``spilled`` envelope points at it. Only the standard
library is imported at module level, because ``setup`` has to run before jupyter_client is
installed.

``start-kernel`` also starts the kernel's *runner* (the internal ``serve`` command): a detached
process that keeps one connected kernel client and executes ``run`` requests it receives on the
Unix socket ``<state-dir>/runner.sock``. ``run`` hands its action to the runner when one listens
(without importing jupyter_client at all) and runs it over its own connection otherwise.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib
import json
import os
import re
import select
import signal
import socket
import stat
import struct
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

NONCE_PATTERN = re.compile(r"[A-Za-z0-9]{16,64}")
# The environment variable that carries the nonce; removed from os.environ before anything else
# runs, so no child (pip, the kernel, the runner) inherits it.
NONCE_ENV = "BRIQ_NONCE"

# When the bridge runs as root, the kernel runs as this uid and gid (nobody / nogroup on Debian
# images; no user needs to exist) with no supplementary groups, in USER_DIR (relative to the
# cwd, i.e. /work/home), which is also its HOME.
KERNEL_UID = 65534
KERNEL_GID = 65534
USER_DIR = "home"
# Root-only: the bridge's directory and what is in it. BRIQ_DIR is traversable (0711) so that
# the kernel can open its own connection file in KERNEL_DIR; nothing else there is readable.
BRIQ_DIR = ".briq"
ACTIONS_DIR = ".briq/actions"
UPLOADS_DIR = ".briq/uploads"
FORKS_DIR = ".briq/forks"
PRIVATE_DIRS = (
    ".briq/state",
    ACTIONS_DIR,
    ".briq/results",
    ".briq/journal",
    UPLOADS_DIR,
    FORKS_DIR,
)
KERNEL_DIR = ".briq/kernel"

# Logs and output together, per action (PROTOCOL.md "Budgets").
TEXT_BUDGET = 65_536
# Serialized final answers, "safe:" prefix included.
FINAL_ANSWER_LIMIT = 65_536
PIP_TAIL_LIMIT = 4_000
# Error messages and tracebacks are outside the shared budget but must not blow up the envelope.
ERROR_TEXT_LIMIT = 65_536

# briq keeps only the last 64 KB of a command's stdout: a framed envelope over this many bytes
# goes to .briq/results/<nonce>.out instead, and stdout gets a small `spilled` envelope.
SPILL_THRESHOLD = 32_768
RESULTS_DIR = ".briq/results"
# Spill files the operator did not remove are deleted by the next spill after this long.
SPILL_MAX_AGE_S = 600.0

# Files in and out of the sandbox (PROTOCOL.md "Files"): `file-write` installs a file the
# operator staged as parts in UPLOADS_DIR/<id>/part-NNNNN; `file-read` reads one range of a file.
UPLOAD_PATTERN = re.compile(r"\.briq/uploads/([0-9a-f]{16,64})")
UPLOAD_MAX_PARTS = 100_000
FILE_READ_MAX = 524_288
# Bytes moved through the pipe between the bridge and its child at once.
FILE_CHUNK = 65_536
# How long after the deadline (when the child stops itself) the bridge kills the child.
FILE_KILL_GRACE_S = 2.0
# Staging directories and fork snapshots untouched for this long are removed by the next
# command that makes new ones: the operator moves them on within minutes.
STAGED_MAX_AGE_S = 3_600.0

# Forks (PROTOCOL.md "Forks"): `fork-save` packs the kernel user's directory as a tar cut into
# FORK_PART_BYTES parts (one briq get each) in FORKS_DIR/<snapshot>/, with a manifest written
# last; `fork-load` extracts such a tar, staged by the operator as for `file-write`.
SNAPSHOT_PATTERN = re.compile(r"[0-9a-f]{16,64}")
FORK_PART_BYTES = 1_048_576
FORK_MAX_BYTES = 67_108_864
FORK_MANIFEST = "manifest.json"
FORK_MANIFEST_FIELDS = frozenset(
    ("snapshot", "parts", "size", "sha256", "files", "skipped", "saved", "unsaved", "state_bytes")
)

# The result journal (PROTOCOL.md "Attempts"): one record per attempt id, written before the
# code runs ("accepted") and once it has run ("finished"), so that an attempt delivered twice
# runs once and its result can be asked for again. A record is acknowledged ("acked") when a
# later attempt is accepted: the operator sends an executor's next attempt only once the result
# of every earlier one is written. Only acknowledged records are ever removed, those older than
# JOURNAL_MAX_AGE_S and all but the newest JOURNAL_KEEP, whenever an attempt is accepted; so a
# record the operator has not learnt yet is kept whatever the clock and the count.
JOURNAL_DIR = ".briq/journal"
ATTEMPT_PATTERN = re.compile(r"[0-9a-f]{16,64}")
JOURNAL_KEEP = 256
JOURNAL_MAX_AGE_S = 3_600.0
# How often a second delivery of a running attempt looks for its result (and a follower for
# more live output).
JOURNAL_POLL_S = 0.05

# Live output (PROTOCOL.md "Live output"): whoever collects an attempt's kernel messages appends
# its stream text to `<attempt>.live` in the journal, so that the journal's retention prunes it
# with the attempt's other files. Only the head is relayed, at most LIVE_BUDGET characters (the
# result keeps head and tail): user code that prints gigabytes costs no memory or disk here.
LIVE_BUDGET = 16_384
# Every line of a live file but the last is a stream line or the cut line; the last one is the
# end line, which always starts so (user text is escaped inside a stream line's "text").
LIVE_END_PREFIX = b'{"end":'
# How much of the live file a follower reads at once.
LIVE_READ_BYTES = 65_536

# `cancel` (PROTOCOL.md "Cancel"). How long deliveries of an attempt a cancel claimed before it
# ran wait for the cancelled record it writes at once.
CANCEL_CLAIM_WAIT_S = 5.0
# After the kill of a kernel that ignored the interrupt: how long the runner gets to journal
# the attempt (it notices the kernel gone within PID_CHECK_INTERVAL_S), and to exit.
CANCEL_LOST_WAIT_S = 3.0
# How long the fresh kernel (and its runner) may take to start after such a kill.
CANCEL_RESTART_DEADLINE_S = 30.0

# smolagents 1.26 serialization tags that the host would turn back into numpy arrays or PIL
# images (serialization.py and the patched FinalAnswerTool.forward both emit exactly these).
REJECTED_TAGS = frozenset({"ndarray", "PIL.Image"})
REJECTED_HINT = "return arrays as lists and images as bytes"

# `set-env` (PROTOCOL.md "A claimer's environment"): the claimer's variables are kept in this
# file of the state dir (root-only when the bridge runs as root) and given to every kernel the
# bridge starts, so that a kernel restarted by a cancel or a resume has them too. Names the
# bridge or the interpreter rely on are refused.
ENV_FILE = "claim-env.json"
ENV_NAME_PATTERN = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
ENV_RESERVED = frozenset(
    {
        "HOME",
        "PATH",
        "PYTHONPATH",
        "PYTHONHOME",
        "PYTHONUSERBASE",
        "IPYTHONDIR",
        "PIP_PREFIX",
        "PIP_USER",
        "PIP_TARGET",
        "LD_PRELOAD",
        "LD_LIBRARY_PATH",
    }
)
ENV_RESERVED_PREFIX = "BRIQ_"
ENV_MAX_NAMES = 64
ENV_MAX_BYTES = 65_536
ENV_EXPRESSION_KEY = "briq_env"

# `save-state` / `restore-state` (PROTOCOL.md "Saving and restoring the namespace"): the file,
# relative to the kernel user's directory (its cwd and HOME), that the kernel itself pickles
# its user namespace into and unpickles it from; the bridge never reads it. The kernel's
# summary is untrusted: at most STATE_MAX_NAMES names per list, each an identifier of at most
# STATE_NAME_LENGTH characters, each reason at most STATE_WHY_LIMIT characters.
STATE_FILE = ".briq-state/namespace.pickle"
STATE_MAX_NAMES = 256
STATE_NAME_LENGTH = 256
STATE_WHY_LIMIT = 200
# The `source` of the payload the kernel's snippet puts in the reply to its own request.
STATE_PAYLOAD_SOURCE = "briq_state"

# How long an interrupted kernel gets to become idle again before we report the timeout.
INTERRUPT_GRACE_S = 2.0
# How long an existing kernel gets to answer kernel_info on its control channel.
ANSWER_WAIT_S = 5.0
# How often we look at the kernel's pid while waiting, so a dead kernel is noticed quickly.
PID_CHECK_INTERVAL_S = 0.2

# The runner (`serve`). How much longer than timeout + INTERRUPT_GRACE_S `run` waits for the
# runner's answer before it reports the outcome as unknown (the operator allows 5 s in all).
RUNNER_ANSWER_MARGIN_S = 1.5
# Largest request the runner reads (a path and a few numbers) and largest answer `run` reads
# (a result envelope is at most a few MB of escaped JSON).
RUNNER_MAX_REQUEST_BYTES = 65_536
# Largest action the run client may send (the operator's limit is far lower).
RUNNER_MAX_CODE_BYTES = 16 * 1024 * 1024
RUNNER_MAX_ANSWER_BYTES = 16 * 1024 * 1024
# How long the runner waits for a connected client to send its request.
RUNNER_REQUEST_WAIT_S = 5.0
# How long a ping waits for the runner's answer.
RUNNER_PING_WAIT_S = 1.0
# How long start-kernel waits for a runner it started to answer.
RUNNER_START_WAIT_S = 10.0
# How long a new runner waits for an exiting one to release the runner lock.
RUNNER_LOCK_WAIT_S = 3.0
# How often an idle runner checks that its kernel is still the one in the state dir.
RUNNER_CHECK_INTERVAL_S = 0.5

# (import name, distribution, pip requirement, acceptable release tuple); mirrors the
# requirements that setup installs so that "already importable" means "pip would do nothing".
BASE_PACKAGES: tuple[tuple[str, str, str, Callable[[tuple[int, ...]], bool]], ...] = (
    ("smolagents", "smolagents", "smolagents==1.26.0", lambda v: v[:3] == (1, 26, 0)),
    ("numpy", "numpy", "numpy>=1.26,<3", lambda v: (1, 26) <= v < (3,)),
    ("PIL", "pillow", "pillow", lambda v: True),
    ("ipykernel", "ipykernel", "ipykernel>=6,<8", lambda v: (6,) <= v < (8,)),
    ("jupyter_client", "jupyter-client", "jupyter-client>=8,<9", lambda v: (8,) <= v < (9,)),
)

# Lazy imports: every action is a new `run` process, so modules only some commands need
# (importlib.metadata, tempfile, hashlib, secrets) are imported where they are used.

# CSI sequences (colours, cursor moves), OSC sequences (titles, links) and two-byte escapes.
ANSI_ESCAPE = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]")


# --------------------------------------------------------------------------------------------
# Envelopes
# --------------------------------------------------------------------------------------------


def setup_envelope(ok: bool, installed: bool, message: str, pip_tail: str | None = None) -> dict:
    return {
        "kind": "setup",
        "ok": ok,
        "installed": installed,
        "message": message,
        "pip_tail": pip_tail,
    }


def kernel_envelope(alive: bool, started: bool, pid: int | None, message: str) -> dict:
    return {"kind": "kernel", "alive": alive, "started": started, "pid": pid, "message": message}


def state_envelope(
    ok: bool,
    message: str,
    saved: list[str] | None = None,
    unsaved: list[dict] | None = None,
    size: int = 0,
) -> dict:
    return {
        "kind": "state",
        "ok": ok,
        "saved": saved or [],
        "unsaved": unsaved or [],
        "bytes": size,
        "message": message,
    }


def env_envelope(ok: bool, message: str, names: list[str] | None = None) -> dict:
    return {"kind": "env", "ok": ok, "names": names or [], "message": message}


def file_envelope(
    path: str,
    *,
    size: int | None = None,
    sha256: str | None = None,
    offset: int | None = None,
    data_base64: str | None = None,
    error: dict | None = None,
) -> dict:
    return {
        "kind": "file",
        "ok": error is None,
        "path": path,
        "size": size,
        "sha256": sha256,
        "offset": offset,
        "data_base64": data_base64,
        "error": error,
    }


def fork_envelope(
    message: str,
    *,
    snapshot: str = "",
    parts: int = 0,
    size: int = 0,
    sha256: str = "",
    files: int = 0,
    skipped: int = 0,
    saved: list[str] | None = None,
    unsaved: list[dict] | None = None,
    state_bytes: int = 0,
    error: dict | None = None,
) -> dict:
    return {
        "kind": "fork",
        "ok": error is None,
        "message": message,
        "snapshot": snapshot,
        "parts": parts,
        "size": size,
        "sha256": sha256,
        "files": files,
        "skipped": skipped,
        "saved": saved or [],
        "unsaved": unsaved or [],
        "state_bytes": state_bytes,
        "error": error,
    }


def result_envelope(
    status: str,
    *,
    logs: str = "",
    output: str | None = None,
    truncated: bool = False,
    final_answer: str | None = None,
    error: dict | None = None,
    display_dropped: int = 0,
    duration_ms: int = 0,
) -> dict:
    return {
        "kind": "result",
        "status": status,
        "logs": logs,
        "output": output,
        "truncated": truncated,
        "final_answer": final_answer,
        "error": error,
        "display_dropped": display_dropped,
        "duration_ms": duration_ms,
    }


# IPython compiles each cell under a file named by a hash (`/tmp/ipykernel_1/2747763117.py`):
# a syntax error names that file, which says nothing of the action's code.
_CELL_FILE = re.compile(r"\((?:[^()]*/)?\d+\.py, line (\d+)\)$")


def action_located(message: str) -> str:
    """A compile error's message with the kernel's cell file named as the action's code."""
    return _CELL_FILE.sub(r"(<action>, line \1)", message)


def error_info(name: str, message: str, traceback: str = "") -> dict:
    return {
        "name": clip(strip_ansi(name), 200),
        "message": clip(strip_ansi(message), ERROR_TEXT_LIMIT),
        "traceback": clip(strip_ansi(traceback), ERROR_TEXT_LIMIT),
    }


def _valid_unicode(value: Any) -> Any:
    """Replace lone surrogates: JSON parsers (serde_json among them) reject them as escapes."""
    if isinstance(value, str):
        return value.encode("utf-8", "replace").decode("utf-8")
    if isinstance(value, dict):
        return {key: _valid_unicode(item) for key, item in value.items()}
    return value


def frame(nonce: str, envelope: dict) -> str:
    """The envelope as printed: markers around one JSON line."""
    # ensure_ascii keeps the payload one pure-ASCII line whatever the user printed (newlines,
    # NULs, U+2028 are all escaped), so text inside it can never look like a marker line.
    payload = json.dumps(_valid_unicode(envelope), ensure_ascii=True, separators=(",", ":"))
    # The leading newline puts the marker at a line start even after unterminated chatter.
    return f"\n<<<BRIQ-ENVELOPE {nonce}>>>\n{payload}\n<<<END-BRIQ-ENVELOPE {nonce}>>>\n"


def spilled_envelope(size: int, sha256: str) -> dict:
    return {"kind": "spilled", "bytes": size, "sha256": sha256}


def remove_stale_results(results_dir: Path, keep: Path, now: float) -> None:
    """Delete files in `results_dir` older than SPILL_MAX_AGE_S, except `keep`."""
    try:
        entries = list(os.scandir(results_dir))
    except OSError:
        return
    for entry in entries:
        if entry.name == keep.name:
            continue
        with contextlib.suppress(OSError):  # gone already, or not ours to remove
            if entry.is_file(follow_symlinks=False) and (
                now - entry.stat(follow_symlinks=False).st_mtime > SPILL_MAX_AGE_S
            ):
                os.unlink(entry.path)


def spill(results_dir: Path, nonce: str, data: bytes) -> dict:
    """Write `data` to `<results_dir>/<nonce>.out` atomically; the `spilled` envelope for it."""
    import hashlib
    import tempfile

    bridge_dir(results_dir)
    target = results_dir / f"{nonce}.out"
    remove_stale_results(results_dir, target, time.time())
    # Same directory, then rename: the operator sees either no file or the whole file.
    fd, tmp_name = tempfile.mkstemp(dir=results_dir, prefix=f".{nonce}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        # mkstemp makes it 0600: keep that when the kernel runs as another user, else make it
        # readable like any other upload.
        if not split_users():
            os.chmod(tmp_name, 0o644)
        os.replace(tmp_name, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp_name)
        raise
    return spilled_envelope(len(data), hashlib.sha256(data).hexdigest())


def envelope_text(nonce: str, envelope: dict, results_dir: str | os.PathLike = RESULTS_DIR) -> str:
    """What goes on stdout: the framed envelope, or, when that is over SPILL_THRESHOLD bytes, a
    framed `spilled` envelope pointing at the file that holds it (PROTOCOL.md "Large envelopes").
    Raises OSError when the file cannot be written."""
    text = frame(nonce, envelope)
    data = text.encode("ascii")
    if len(data) <= SPILL_THRESHOLD:
        return text
    return frame(nonce, spill(Path(results_dir), nonce, data))


def stdout_text(nonce: str, kind: str, envelope: dict, exit_code: int) -> tuple[str, int]:
    """What a command prints and its exit code: the envelope's text, or a framed bridge failure
    when a large envelope could not be written to its file."""
    try:
        return envelope_text(nonce, envelope), exit_code
    except OSError as exc:
        problem = clip(f"{type(exc).__name__}: {exc}", 1_000)
        message = f"bridge error: could not write the large envelope to {RESULTS_DIR}: {problem}"
        return frame(nonce, bridge_failure(kind, message)), 1


def write_envelope(
    stream: Any, nonce: str, envelope: dict, results_dir: str | os.PathLike = RESULTS_DIR
) -> None:
    stream.write(envelope_text(nonce, envelope, results_dir))
    stream.flush()


# --------------------------------------------------------------------------------------------
# Text helpers
# --------------------------------------------------------------------------------------------


def strip_ansi(text: str) -> str:
    return ANSI_ESCAPE.sub("", text)


def truncation_marker(dropped: int) -> str:
    return f"\n… [truncated {dropped} characters] …\n"


class ClippedText:
    """Append-only text that only remembers its first and last `keep` characters.

    User code can print gigabytes; the envelope never needs more than a head and a tail, so the
    middle is counted and forgotten as it arrives.
    """

    def __init__(self, keep: int = TEXT_BUDGET) -> None:
        self.keep = keep
        self.head = ""
        self.tail = ""
        self.dropped = 0

    def add(self, text: str) -> None:
        if len(self.head) < self.keep:
            room = self.keep - len(self.head)
            self.head += text[:room]
            text = text[room:]
        if text:
            self.tail += text
            excess = len(self.tail) - self.keep
            if excess > 0:
                self.tail = self.tail[excess:]
                self.dropped += excess

    def __len__(self) -> int:
        return len(self.head) + self.dropped + len(self.tail)

    def render(self, limit: int) -> tuple[str, bool]:
        """The text in at most `limit` characters (marker included) and whether it was cut."""
        total = len(self)
        if total <= limit:
            return self.head + self.tail, False
        # Size the marker for the worst case first, so the final text never exceeds `limit`.
        kept = max(0, limit - len(truncation_marker(total)))
        head_n = kept // 2
        tail_n = kept - head_n
        whole = self.head + self.tail if self.dropped == 0 else None
        head = self.head[:head_n]
        source = whole if whole is not None else self.tail
        tail = source[len(source) - tail_n :] if tail_n else ""
        return head + truncation_marker(total - head_n - tail_n) + tail, True


def clip(text: str, limit: int) -> str:
    clipped = ClippedText(limit)
    clipped.add(text)
    return clipped.render(limit)[0]


def share_budget(logs_len: int, output_len: int, budget: int = TEXT_BUDGET) -> tuple[int, int]:
    """Split the shared budget: whichever side is small stays whole, the other gets the rest."""
    if logs_len + output_len <= budget:
        return logs_len, output_len
    half = budget // 2
    if output_len <= half:
        return budget - output_len, output_len
    if logs_len <= half:
        return logs_len, budget - logs_len
    return budget - half, half


# --------------------------------------------------------------------------------------------
# Users and permissions
# --------------------------------------------------------------------------------------------


class UnsafeLayout(Exception):
    """A file or directory the bridge relies on could have been changed by another user."""


def split_users() -> bool:
    """Whether the kernel runs as KERNEL_UID: exactly when the bridge runs as root."""
    return os.geteuid() == 0


def trusted(st: os.stat_result) -> bool:
    """Owned by our effective uid and writable by nobody else."""
    return st.st_uid == os.geteuid() and not st.st_mode & 0o022


def private_dir(path: str | os.PathLike, mode: int = 0o700) -> None:
    """Make `path` (and missing parents) a real directory of ours with exactly `mode`; raises
    UnsafeLayout when it is a symlink, not a directory, or owned by someone else."""
    path = Path(path)
    path.mkdir(mode=mode, parents=True, exist_ok=True)
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
        raise UnsafeLayout(f"{path} is not a directory owned by uid {os.geteuid()}")
    if stat.S_IMODE(st.st_mode) != mode:
        os.chmod(path, mode)


def bridge_dir(path: str | os.PathLike) -> None:
    """Make the bridge's directory `path`: root-only in root mode (see private_dir)."""
    if split_users():
        private_dir(path)
    else:
        Path(path).mkdir(parents=True, exist_ok=True)


def secure_layout() -> None:
    """As root: /work (the cwd) and .briq may not be writable by anyone else (who could rename
    .briq and plant another bridge.py), and the bridge's files are root-only. Cheap and
    idempotent: every command but `serve` calls it first."""
    here = os.lstat(".")
    if here.st_uid != 0:
        raise UnsafeLayout(f"the working directory {os.getcwd()} is not owned by root")
    if here.st_mode & 0o022:
        os.chmod(".", stat.S_IMODE(here.st_mode) & ~0o022)
    private_dir(BRIQ_DIR, 0o711)
    for name in PRIVATE_DIRS:
        private_dir(name)
    bridge = os.lstat(os.path.join(BRIQ_DIR, "bridge.py"))
    if bridge.st_uid != 0 or not stat.S_ISREG(bridge.st_mode):
        raise UnsafeLayout(f"{BRIQ_DIR}/bridge.py is not a regular file owned by root")
    if stat.S_IMODE(bridge.st_mode) != 0o600:
        os.chmod(os.path.join(BRIQ_DIR, "bridge.py"), 0o600)


def unreachable_by_kernel_user(paths: list[str]) -> str | None:
    """The first of `paths` (or one of their directories) that KERNEL_UID cannot reach, judged
    by mode bits, or None. The kernel user must run the same interpreter and packages."""
    for path in paths:
        current = Path(os.path.realpath(path))
        for directory in [*reversed(current.parents), current]:
            try:
                st = os.stat(directory)
            except OSError:
                break  # it does not exist (an optional path): nothing to reach
            if st.st_uid == KERNEL_UID:
                bits = stat.S_IXUSR if stat.S_ISDIR(st.st_mode) else stat.S_IRUSR
            elif st.st_gid == KERNEL_GID:
                bits = stat.S_IXGRP if stat.S_ISDIR(st.st_mode) else stat.S_IRGRP
            else:
                bits = stat.S_IXOTH if stat.S_ISDIR(st.st_mode) else stat.S_IROTH
            if not st.st_mode & bits:
                return f"{directory} (mode {stat.S_IMODE(st.st_mode):o}, uid {st.st_uid})"
    return None


def user_dir() -> Path:
    """The kernel user's working directory and HOME (created on first use), as an absolute path.
    Refuses one that is not a real directory of KERNEL_UID: /work is root's, so only the bridge
    can have made it."""
    path = Path(USER_DIR).absolute()
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    else:
        os.chown(path, KERNEL_UID, KERNEL_GID)
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != KERNEL_UID:
        raise UnsafeLayout(f"{path} is not a directory owned by uid {KERNEL_UID}")
    return path


def kernel_home() -> Path:
    """The kernel user's directory: its cwd and HOME (/work/home in root mode, else /work)."""
    return user_dir() if split_users() else Path.cwd()


def kernel_user_env(home: Path) -> dict[str, str]:
    """The kernel's environment as KERNEL_UID: ours (the nonce is gone already), with HOME in the
    user dir and pip installing there (a user install; --prefix in a venv, where pip refuses
    --user), that site-packages directory on sys.path."""
    import sysconfig

    env = dict(os.environ)
    env.pop(NONCE_ENV, None)
    base = str(home / ".local")
    env.update(HOME=str(home), PYTHONUSERBASE=base, IPYTHONDIR=str(home / ".ipython"))
    env.pop("PIP_TARGET", None)
    if sys.prefix != sys.base_prefix:  # a venv: user site-packages are not visible there
        env["PIP_PREFIX"] = base
        env.pop("PIP_USER", None)
        site = sysconfig.get_path("purelib", vars={"base": base, "platbase": base})
    else:
        env["PIP_USER"] = "1"
        env.pop("PIP_PREFIX", None)
        site = sysconfig.get_path("purelib", f"{os.name}_user", vars={"userbase": base})
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [site, env.get("PYTHONPATH")]))
    return env


def kernel_connection_copy(state: KernelState) -> Path:
    """A copy of the kernel's connection file that KERNEL_UID can read (the bridge and the runner
    only ever read the root-only original). KERNEL_DIR is root's: the copy cannot be swapped."""
    private_dir(KERNEL_DIR, 0o711)
    copy = Path(KERNEL_DIR, "kernel.json").absolute()
    copy.unlink(missing_ok=True)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
    fd = os.open(copy, flags, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(state.connection_file.read_bytes())
        os.fchown(handle.fileno(), KERNEL_UID, KERNEL_GID)
    return copy


# --------------------------------------------------------------------------------------------
# Kernel state and process liveness
# --------------------------------------------------------------------------------------------


class KernelState:
    """Files in the state dir: connection file, pid and the kernel's own stdout/stderr log."""

    def __init__(self, state_dir: str) -> None:
        self.dir = Path(state_dir).resolve()
        self.connection_file = self.dir / "kernel.json"
        self.pid_file = self.dir / "kernel.pid"
        self.log_file = self.dir / "kernel.log"
        # The claimer's environment, given to every kernel started here (`set-env`).
        self.env_file = self.dir / ENV_FILE
        # The runner (`serve`): its socket, pid, log, and the lock that keeps it alone.
        self.runner_socket = self.dir / "runner.sock"
        self.runner_pid_file = self.dir / "runner.pid"
        self.runner_log_file = self.dir / "runner.log"
        self.runner_lock_file = self.dir / "runner.lock"

    def read_pid(self) -> int | None:
        return read_pid_file(self.pid_file)

    def write_pid(self, pid: int) -> None:
        write_pid_file(self.pid_file, pid)

    def live_pid(self) -> int | None:
        """The kernel's pid if its process is running and the connection file exists."""
        pid = self.read_pid()
        if pid is None or not self.connection_file.exists():
            return None
        return pid if process_is_kernel(pid) else None

    def forget(self) -> None:
        for path in (self.pid_file, self.connection_file):
            path.unlink(missing_ok=True)

    def log_size(self) -> int:
        try:
            return self.log_file.stat().st_size
        except OSError:
            return 0

    def log_tail(self, limit: int = 2_000) -> str:
        try:
            with open(self.log_file, "rb") as log:
                log.seek(0, os.SEEK_END)
                log.seek(max(0, log.tell() - 4 * limit))
                return log.read().decode("utf-8", "replace")[-limit:]
        except OSError:
            return ""

    @contextlib.contextmanager
    def lock(self) -> Iterator[None]:
        """Serialize start-kernel calls so two of them never launch two kernels."""
        import fcntl

        with open(self.dir / "lock", "a") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)


def read_pid_file(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def write_pid_file(path: Path, pid: int) -> None:
    # Write-then-rename: a reader never sees a half-written pid.
    tmp = path.with_suffix(".tmp")
    tmp.write_text(f"{pid}\n")
    os.replace(tmp, path)


def running_cmdline(pid: int) -> bytes | None:
    """The NUL-separated command line of `pid` while it runs (not a zombie), else None; empty
    when there is no procfs to read it from, or the process has only just been spawned."""
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, PermissionError):
        return None
    if not Path("/proc/self").exists():
        return b""  # no procfs: signal 0 is all we can know
    try:
        proc_stat = Path(f"/proc/{pid}/stat").read_text()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    state = proc_stat.rpartition(")")[2].split()[0]
    if state in ("Z", "X", "x"):
        return None
    return cmdline


def process_is_kernel(pid: int) -> bool:
    """True while `pid` is a running (not zombie) ipykernel process.

    The kernel outlives the bridge that started it and is re-parented to PID 1, which in a
    sandbox may never reap it: a SIGKILLed kernel can linger as a zombie that still accepts
    signal 0. After a sandbox restart the pid may also belong to some unrelated process.
    """
    cmdline = running_cmdline(pid)
    # A process that has only just been spawned can show an empty cmdline for a moment: it is
    # still starting, not some other program that reused the pid.
    return cmdline is not None and (not cmdline or b"ipykernel" in cmdline)


def process_is_runner(pid: int) -> bool:
    """True while `pid` is a running (not zombie) bridge `serve` process (a runner)."""
    cmdline = running_cmdline(pid)
    if cmdline is None:
        return False
    arguments = cmdline.split(b"\0")
    return not cmdline or (b"serve" in arguments and b"--kernel-pid" in arguments)


def runs_as_expected_user(pid: int) -> bool:
    """Whether kernel `pid` runs as the user this bridge starts kernels as (KERNEL_UID as root)."""
    if not split_users():
        return True
    try:
        return os.stat(f"/proc/{pid}").st_uid == KERNEL_UID
    except OSError:
        return True  # gone, or no procfs: nothing to judge by


def kill_kernel_group(pid: int) -> None:
    # The kernel leads its own session (start_new_session), so its group holds its children too.
    if not process_is_kernel(pid):
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


# --------------------------------------------------------------------------------------------
# Talking to the kernel
# --------------------------------------------------------------------------------------------


def connect(state: KernelState, **channels: bool) -> Any:
    from jupyter_client.blocking.client import BlockingKernelClient

    client = BlockingKernelClient(connection_file=str(state.connection_file))
    client.load_connection_file()
    wanted = {"shell": False, "iopub": False, "stdin": False, "hb": False, "control": False}
    wanted.update(channels)
    client.start_channels(**wanted)
    return client


def receive(channel: Any, timeout: float) -> dict | None:
    """One message from `channel` within `timeout` seconds, or None."""
    from queue import Empty

    try:
        return channel.get_msg(timeout=max(0.0, timeout))
    except Empty:
        return None
    except ValueError:
        return None  # bad signature or garbled frames: not a message from our kernel


def kernel_answers(
    state: KernelState,
    pid: int,
    until: float,
    channel_name: str,
    failed: Callable[[], bool] = lambda: False,
) -> bool:
    """Ask kernel_info on `channel_name` until the kernel replies, its pid dies, `failed()`
    says it never will, or `until`.

    The control channel is served by its own thread in ipykernel >= 6, so it answers even while
    user code runs; the shell channel proves that a fresh kernel is ready to execute.
    """
    client = connect(state, **{channel_name: True})
    channel = getattr(client, f"{channel_name}_channel")
    sent: set[str] = set()
    next_send = 0.0
    try:
        while (now := time.monotonic()) < until:
            if not process_is_kernel(pid) or failed():
                return False
            if now >= next_send:
                # Re-ask now and then: a request sent before the kernel bound may be lost.
                request = client.session.msg("kernel_info_request")
                channel.send(request)
                sent.add(request["header"]["msg_id"])
                next_send = now + 1.0
            reply = receive(channel, min(PID_CHECK_INTERVAL_S, until - now))
            if reply is not None and reply["parent_header"].get("msg_id") in sent:
                return True
        return False
    finally:
        client.stop_channels()


def drain(client: Any, limit: int = 10_000) -> None:
    """Drop messages already waiting on `client`'s iopub and shell channels.

    A fresh client has none; the runner's long-lived one may hold leftovers of earlier requests
    (kernel_info replies, output that came after a timeout), which belong to nobody now.
    """
    for channel in (client.iopub_channel, client.shell_channel):
        for _ in range(limit):
            if receive(channel, 0) is None:
                break


def await_iopub(client: Any, pid: int, until: float) -> bool:
    """Wait until our fresh iopub subscription receives messages.

    ZeroMQ drops PUB messages until a new SUB connection is established ("slow joiner"), and
    every `run` is a new process with a new subscription: executing before that would lose the
    start of the output. Each kernel_info request makes the kernel publish busy/idle, so the
    first iopub message we see proves the subscription is live. On the runner's long-lived
    client the subscription is live already and this is one round trip proving the kernel is.
    """
    wait = 0.01
    while time.monotonic() < until:
        if not process_is_kernel(pid):
            return False
        client.kernel_info()
        if receive(client.iopub_channel, min(wait, until - time.monotonic())) is not None:
            return True
        wait = min(wait * 2, 0.5)
    return False


class Execution:
    """Everything the kernel reports about one execute_request, gathered as it arrives."""

    def __init__(self, msg_id: str, live: LiveOutput | None = None) -> None:
        self.msg_id = msg_id
        self.logs = ClippedText()
        # Where stream text goes as it arrives, for followers (PROTOCOL.md "Live output").
        self.live = live
        self.output: ClippedText | None = None
        self.error: dict | None = None
        self.display_dropped = 0
        self.idle = False
        self.reply: dict | None = None

    @property
    def done(self) -> bool:
        # Both are needed: idle ends the output, the reply carries the status (e.g. aborted).
        return self.idle and self.reply is not None

    def ours(self, msg: dict) -> bool:
        return msg.get("parent_header", {}).get("msg_id") == self.msg_id

    def on_iopub(self, msg: dict) -> None:
        if not self.ours(msg):
            return
        kind = msg["header"]["msg_type"]
        content = msg["content"]
        if kind == "stream":
            text = str(content.get("text", ""))
            self.logs.add(text)
            if self.live is not None:
                self.live.stream(content.get("name"), text)
        elif kind == "execute_result":
            text = content.get("data", {}).get("text/plain")
            if text is not None:
                self.output = ClippedText()
                self.output.add(text if isinstance(text, str) else "".join(text))
        elif kind in ("display_data", "update_display_data"):
            self.display_dropped += 1
        elif kind == "error" and self.error is None:
            self.error = content
        elif kind == "status" and content.get("execution_state") == "idle":
            self.idle = True

    def on_shell(self, msg: dict) -> None:
        if self.ours(msg) and msg["header"]["msg_type"] == "execute_reply":
            self.reply = msg["content"]


def collect(client: Any, execution: Execution, pid: int, until: float) -> str:
    """Feed kernel messages into `execution` until done ("done"), `until` ("deadline") or the
    kernel process disappears ("lost")."""
    import zmq

    iopub, shell = client.iopub_channel, client.shell_channel
    poller = zmq.Poller()
    poller.register(iopub.socket, zmq.POLLIN)
    poller.register(shell.socket, zmq.POLLIN)
    next_pid_check = 0.0
    while not execution.done:
        now = time.monotonic()
        if now >= until:
            return "deadline"
        if now >= next_pid_check:
            if not process_is_kernel(pid):
                return "lost"
            next_pid_check = now + PID_CHECK_INTERVAL_S
        ready = dict(poller.poll(int(min(until - now, PID_CHECK_INTERVAL_S) * 1000) + 1))
        if iopub.socket in ready and (msg := receive(iopub, 0)) is not None:
            execution.on_iopub(msg)
        if shell.socket in ready and (msg := receive(shell, 0)) is not None:
            execution.on_shell(msg)
    return "done"


# --------------------------------------------------------------------------------------------
# Final answers
# --------------------------------------------------------------------------------------------


def find_rejected_tag(payload: Any) -> str | None:
    """The first ndarray / PIL.Image tag anywhere in parsed JSON (iterative: no depth limit)."""
    pending = [payload]
    while pending:
        item = pending.pop()
        if isinstance(item, dict):
            tag = item.get("__type__")
            if isinstance(tag, str) and tag in REJECTED_TAGS:
                return tag
            pending.extend(item.values())
        elif isinstance(item, list):
            pending.extend(item)
    return None


def final_answer_problem(value: str) -> str | None:
    """Why a FinalAnswerException value must not go to the host, or None when it may."""
    if value.startswith("pickle:"):
        return "pickle-serialized final answers are refused; only 'safe:' JSON is accepted"
    if not value.startswith("safe:"):
        return "final answer lacks the 'safe:' prefix of smolagents safe serialization"
    if len(value) > FINAL_ANSWER_LIMIT:
        return (
            f"final answer is {len(value)} characters serialized; the limit is {FINAL_ANSWER_LIMIT}"
        )
    try:
        payload = json.loads(value[len("safe:") :])
    except (ValueError, RecursionError):
        return "final answer is not valid JSON after the 'safe:' prefix"
    tag = find_rejected_tag(payload)
    if tag is not None:
        return f"final answer contains a {tag!r} value; {REJECTED_HINT}"
    return None


# --------------------------------------------------------------------------------------------
# Commands
# --------------------------------------------------------------------------------------------


def release_tuple(version: str) -> tuple[int, ...]:
    """Leading numeric release of a version string ("2.1.3rc1" -> (2, 1, 3))."""
    match = re.match(r"\d+(?:\.\d+)*", version)
    return tuple(int(part) for part in match.group(0).split(".")) if match else ()


def installed_version(distribution: str) -> str | None:
    import importlib.metadata  # ~30 ms that no other command needs (see "Lazy imports")

    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def missing_base_packages() -> list[str]:
    """Descriptions of base packages that are absent, at a wrong version or not importable."""
    missing = []
    for module, distribution, requirement, acceptable in BASE_PACKAGES:
        version = installed_version(distribution)
        if version is None or not acceptable(release_tuple(version)):
            missing.append(f"{requirement} (found {version or 'nothing'})")
            continue
        try:
            importlib.import_module(module)
        except Exception as exc:  # a broken install: let pip repair it
            missing.append(f"{requirement} (import failed: {type(exc).__name__})")
    return missing


PLAIN_NAME = r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?"


def extra_is_satisfied(spec: str) -> bool:
    """Whether an extra requirement is surely installed already; when unsure, say no (pip runs).

    Only a plain name or an exact `name==version` pin is judged here; ranges, extras, markers
    and URLs need pip's resolver.
    """
    spec = spec.strip()
    if re.fullmatch(PLAIN_NAME, spec):
        return installed_version(spec) is not None
    pinned = re.fullmatch(rf"({PLAIN_NAME})\s*==\s*([A-Za-z0-9.+!_-]+)", spec)
    if pinned:
        return installed_version(pinned.group(1)) == pinned.group(2)
    return False


def run_pip(requirements: list[str], deadline: float) -> tuple[int | None, str]:
    """Run pip until it exits or `deadline`; returns (exit code or None on timeout, output tail)."""
    command = [
        sys.executable, "-m", "pip", "install", "--disable-pip-version-check", "--no-input",
        "--progress-bar", "off", *requirements,
    ]  # fmt: skip
    env = dict(os.environ)
    # The sandbox is disposable: install into its Python even where the distribution marks it
    # externally managed (PEP 668). Older pips ignore unknown PIP_* variables.
    env.setdefault("PIP_BREAK_SYSTEM_PACKAGES", "1")
    env.setdefault("PIP_ROOT_USER_ACTION", "ignore")
    import tempfile

    with tempfile.TemporaryFile() as output:
        process = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,  # its own group, so the deadline kill takes its children too
        )
        try:
            returncode: int | None = process.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            returncode = None
        output.seek(0, os.SEEK_END)
        output.seek(max(0, output.tell() - 4 * PIP_TAIL_LIMIT))
        tail = output.read().decode("utf-8", "replace")[-PIP_TAIL_LIMIT:]
    return returncode, tail


def install_self() -> None:
    """`setup --self-install`: this file is a staged upload (`.briq/bridge-<id>.py`); make it
    `.briq/bridge.py` by rename, so that a command starting at the same moment (another
    operator provisioning the same sandbox, a run) reads the old bridge or the new one, never a
    file half rewritten in place. The staged file goes with the rename."""
    import tempfile

    staged = Path(os.path.abspath(__file__))
    target = Path(BRIQ_DIR).absolute() / "bridge.py"
    if staged == target:
        return
    if staged.parent != target.parent or not re.fullmatch(
        r"bridge-[0-9a-f]{16,64}\.py", staged.name
    ):
        raise UnsafeLayout(f"--self-install runs only from {BRIQ_DIR}/bridge-<hex>.py")
    data = staged.read_bytes()
    fd, tmp_name = tempfile.mkstemp(dir=target.parent, prefix=".bridge.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.chmod(tmp_name, 0o600 if split_users() else 0o644)
        os.replace(tmp_name, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp_name)
        raise
    with contextlib.suppress(OSError):
        staged.unlink()


def cmd_setup(args: argparse.Namespace) -> tuple[dict, int]:
    deadline = time.monotonic() + args.deadline
    extras = [spec for spec in args.requirement if spec.strip()]
    missing = missing_base_packages() + [s for s in extras if not extra_is_satisfied(s)]
    if not missing:
        return setup_envelope(True, False, "all requirements already importable; pip skipped"), 0

    requirements = [requirement for _, _, requirement, _ in BASE_PACKAGES] + extras
    returncode, tail = run_pip(requirements, deadline)
    if returncode is None:
        message = f"pip timed out after {args.deadline:g} s; its process group was killed"
        return setup_envelope(False, True, message, tail), 1
    if returncode != 0:
        return setup_envelope(False, True, f"pip exited with code {returncode}", tail), 1
    message = "pip installed requirements; missing before: " + "; ".join(missing)
    return setup_envelope(True, True, message, tail), 0


# The kernel's five ports are chosen among these unless the system's ephemeral range says
# otherwise (see `kernel_ports`).
KERNEL_PORT_RANGE = (20000, 32767)


def ephemeral_ports() -> tuple[int, int]:
    """The range the system takes the local ports of outgoing connections from."""
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


def kernel_ports(count: int = 5) -> list[int]:
    """Free loopback ports for the kernel, outside the ephemeral range.

    The kernel binds its ports a moment after they are chosen. A port from the ephemeral range
    (what binding port 0 gives) can meanwhile become the local end of any process's outgoing
    connection, and the kernel then fails to bind it and hangs instead of exiting. Ports below
    the range are never taken that way.
    """
    import random

    low, high = KERNEL_PORT_RANGE
    ephemeral_low, ephemeral_high = ephemeral_ports()
    if ephemeral_low <= high and low <= ephemeral_high:
        # A system whose ephemeral range overlaps ours: keep below it where there is room.
        high = ephemeral_low - 1
        low = min(low, max(1024, high - 10_000))
    ports: list[int] = []
    while len(ports) < count:
        port = random.randint(low, high)
        if port in ports:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
        ports.append(port)
    return ports


def bind_failed(state: KernelState, offset: int) -> bool:
    """Whether the kernel launched when its log was `offset` bytes long could not bind a port."""
    try:
        with open(state.log_file, "rb") as log:
            log.seek(offset)
            return b"Address already in use" in log.read()
    except OSError:
        return False


def launch_kernel(state: KernelState) -> int:
    import secrets

    from jupyter_client.connect import write_connection_file

    state.connection_file.unlink(missing_ok=True)
    shell, iopub, stdin, control, hb = kernel_ports()
    # Loopback only: nothing outside the sandbox may reach the kernel. Messages are signed.
    write_connection_file(
        str(state.connection_file),
        ip="127.0.0.1",
        key=secrets.token_hex(32).encode("ascii"),
        shell_port=shell,
        iopub_port=iopub,
        stdin_port=stdin,
        control_port=control,
        hb_port=hb,
    )
    connection_file = state.connection_file
    claimed = read_claim_env(state)
    as_user: dict[str, Any] = {"env": {**os.environ, **claimed}}
    if split_users():
        # User code must not be able to touch the bridge, its state or its output: the kernel
        # runs as KERNEL_UID (setgid, then setuid, supplementary groups cleared by Popen) in its
        # own directory, and reads its own copy of the connection file.
        home = user_dir()
        connection_file = kernel_connection_copy(state)
        as_user = dict(
            user=KERNEL_UID,
            group=KERNEL_GID,
            extra_groups=[],
            cwd=home,
            env={**kernel_user_env(home), **claimed},
        )
    with open(state.log_file, "ab") as log:
        # Detached: the kernel must outlive this bridge process, and its stdout must never
        # reach the bridge's stdout (where the envelope goes).
        process = subprocess.Popen(
            [sys.executable, "-m", "ipykernel_launcher", "-f", str(connection_file)],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            close_fds=True,
            **as_user,
        )
    state.write_pid(process.pid)
    return process.pid


def cmd_start_kernel(args: argparse.Namespace) -> tuple[dict, int]:
    deadline = time.monotonic() + args.deadline
    state = KernelState(args.state_dir)
    state.dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    if split_users():
        import ipykernel

        unreachable = unreachable_by_kernel_user(
            [sys.executable, sys.prefix, sys.base_prefix, os.path.dirname(ipykernel.__file__)]
        )
        if unreachable is not None:
            message = (
                f"the kernel runs as uid {KERNEL_UID}, which cannot reach {unreachable}: "
                "the sandbox's Python and its packages must be readable by every user"
            )
            return kernel_envelope(False, False, None, message), 1
    with state.lock():
        note = ""
        old = state.read_pid()
        if old is not None and process_is_kernel(old) and not runs_as_expected_user(old):
            # Started by an older bridge as root: user code must not keep running as root.
            kill_kernel_group(old)
            note = f"; replaced kernel {old}, which did not run as uid {KERNEL_UID}"
        elif old is not None and process_is_kernel(old):
            until = min(deadline, time.monotonic() + ANSWER_WAIT_S)
            if state.connection_file.exists() and kernel_answers(state, old, until, "control"):
                runner_until = min(deadline, time.monotonic() + RUNNER_START_WAIT_S)
                message = "kernel already running" + ensure_runner(state, old, runner_until)
                return kernel_envelope(True, False, old, message), 0
            kill_kernel_group(old)  # never leave an unreachable kernel behind
            note = f"; replaced kernel {old}, which was not answering"
        elif old is not None:
            note = f"; previous kernel {old} was gone"
        stop_runner(state)  # it served the old kernel
        state.forget()

        # Three attempts: a chosen port can still be taken before the kernel binds it; the
        # kernel then logs the bind failure and may hang rather than exit.
        for _attempt in range(3):
            offset = state.log_size()
            pid = launch_kernel(state)
            failed = functools.partial(bind_failed, state, offset)
            if kernel_answers(state, pid, deadline, "shell", failed):
                runner_until = min(deadline, time.monotonic() + RUNNER_START_WAIT_S)
                message = "kernel started" + note + ensure_runner(state, pid, runner_until)
                return kernel_envelope(True, True, pid, message), 0
            if bind_failed(state, offset) and time.monotonic() < deadline:
                kill_kernel_group(pid)
                continue
            if process_is_kernel(pid) or time.monotonic() >= deadline:
                break
        kill_kernel_group(pid)
        state.forget()
        message = f"kernel did not answer within {args.deadline:g} s; kernel log tail:\n"
        return kernel_envelope(False, False, None, message + state.log_tail()), 1


def cmd_probe(args: argparse.Namespace) -> tuple[dict, int]:
    state = KernelState(args.state_dir)
    recorded = state.read_pid()
    if recorded is None or not state.connection_file.exists():
        return kernel_envelope(False, False, None, f"no kernel state in {state.dir}"), 0
    if not process_is_kernel(recorded):
        return kernel_envelope(False, False, None, f"kernel process {recorded} is gone"), 0
    if kernel_answers(state, recorded, time.monotonic() + ANSWER_WAIT_S, "control"):
        return kernel_envelope(True, False, recorded, "kernel is answering"), 0
    message = f"kernel process {recorded} exists but did not answer within {ANSWER_WAIT_S:g} s"
    return kernel_envelope(False, False, recorded, message), 0


def action_from_stdin(attempt: str | None) -> str:
    """`run --code -`: the code comes on stdin (one briq call per action, no upload). It is
    kept as the attempt's action file (written whole by rename, in the root-only actions
    directory in root mode), which the runner reads; returns that file's path."""
    import tempfile

    if attempt is None:
        raise ValueError("--code - needs --attempt, which names the action file")
    code = sys.stdin.buffer.read().decode("utf-8")
    actions = Path(ACTIONS_DIR)
    if split_users():
        private_dir(actions)
    else:
        actions.mkdir(parents=True, exist_ok=True)
    target = actions / f"{attempt}.py"
    fd, tmp_name = tempfile.mkstemp(dir=actions, prefix=f".{attempt}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(code)
        os.replace(tmp_name, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp_name)
        raise
    return str(target)


def cmd_run(args: argparse.Namespace) -> tuple[dict, int]:
    deadline = time.monotonic() + args.timeout
    if args.code == "-":
        args.code = action_from_stdin(args.attempt)
    code = Path(args.code).read_text(encoding="utf-8")
    state = KernelState(args.state_dir)
    check_state_dir(state)

    def run() -> tuple[dict, int]:
        pid = state.live_pid()
        if pid is None:
            lost = error_info("KernelLost", f"no live kernel in {state.dir} (run start-kernel)")
            return result_envelope("kernel_lost", error=lost), 0
        return run_in_kernel(state, pid, args, code, deadline)

    return at_most_once(args.attempt, args.timeout, run)


def check_state_dir(state: KernelState) -> None:
    """Raise UnsafeLayout unless the state dir is missing or a directory of our effective uid
    that nobody else can write: else its pid, connection file and socket could all be someone
    else's (run nothing, signal nobody)."""
    try:
        state_dir = os.lstat(state.dir)
    except FileNotFoundError:
        return
    if not (stat.S_ISDIR(state_dir.st_mode) and trusted(state_dir)):
        raise UnsafeLayout(f"{state.dir} is not a directory of ours that only we can write")


def at_most_once(
    attempt: str | None,
    timeout: float,
    run: Callable[[], tuple[dict, int]],
    prune: bool = True,
) -> tuple[dict, int]:
    """`run()` unless `attempt` was accepted before (by anyone), in which case its recorded
    result, waited for while it runs; raises OutcomeUnknown when there is none by then."""
    if attempt is None:
        return run()
    journal = Journal()
    wait_until = time.time() + timeout + INTERRUPT_GRACE_S + RUNNER_ANSWER_MARGIN_S
    if not journal.accept(attempt, wait_until, prune):
        found = journal.await_finished(attempt)
        if found is None:
            raise OutcomeUnknown(f"attempt {attempt} was accepted before and has no result")
        return found
    # The answer on record: converted when the attempt was cancelled meanwhile, or the one a
    # runner recorded first (when it ran the action for us).
    return journal.finish(attempt, *run())


def run_in_kernel(
    state: KernelState, pid: int, args: argparse.Namespace, code: str, deadline: float
) -> tuple[dict, int]:
    """Run the action in kernel `pid`: through its runner, or over a connection of our own."""
    # The runner answers (and journals the result itself, so that it is kept even when this
    # process is gone by then), declines (nothing ran) or leaves the outcome unknown
    # (OutcomeUnknown propagates: the code must not run a second time here).
    answer = run_through_runner(state, pid, args.code, args.timeout, args.attempt)
    if answer is not None:
        return answer
    try:
        client = connect(state, shell=True, iopub=True)
        try:
            return execute_action(
                client, pid, code, deadline, args.timeout, attempt=args.attempt
            ), 0
        finally:
            client.stop_channels()
    finally:
        # For the next run; it starts (or finds another runner and leaves) in the background.
        spawn_runner(state, pid)


def execute_action(
    client: Any,
    pid: int,
    code: str,
    deadline: float,
    timeout: float,
    subscribed: bool = False,
    attempt: str | None = None,
) -> dict:
    """Run `code` in kernel `pid` over the connected `client` (shell and iopub) and describe the
    outcome as a result envelope. Shared by `run` (a fresh client) and the runner (its own,
    `subscribed` since it started: no kernel_info round trip first). The caller accepted
    `attempt` (when given) in the journal: its stream output is relayed to its live file."""
    with LiveOutput.start(attempt) as live:
        drain(client)
        if not subscribed and not await_iopub(client, pid, deadline):
            live.how = "lost"
            lost = error_info("KernelLost", f"kernel {pid} died or stopped answering")
            return result_envelope("kernel_lost", error=lost)
        started = time.monotonic()
        msg_id = client.execute(
            code,
            silent=False,
            store_history=True,
            user_expressions={},
            allow_stdin=False,
            # With the default (True) a request after an error may come back aborted.
            stop_on_error=False,
        )
        execution = Execution(msg_id, live)
        outcome = collect(client, execution, pid, deadline)
        recovered = None
        if outcome == "deadline":
            # ipykernel's default interrupt_mode is "signal": SIGINT raises KeyboardInterrupt.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGINT)
            grace_outcome = collect(client, execution, pid, time.monotonic() + INTERRUPT_GRACE_S)
            recovered = execution.idle and grace_outcome != "lost"
        live.how = outcome
        duration_ms = round((time.monotonic() - started) * 1000)
        return summarize(execution, outcome, recovered, timeout, pid, duration_ms)


def summarize(
    execution: Execution, outcome: str, recovered: bool | None, timeout: float, pid: int, ms: int
) -> dict:
    """Turn what the kernel said into a result envelope."""
    logs_limit, output_limit = share_budget(
        len(execution.logs), len(execution.output) if execution.output is not None else 0
    )
    logs, logs_cut = execution.logs.render(logs_limit)
    output, output_cut = (None, False)
    if execution.output is not None:
        output, output_cut = execution.output.render(output_limit)
    common = {
        "logs": logs,
        "truncated": logs_cut or output_cut,
        "display_dropped": execution.display_dropped,
        "duration_ms": ms,
    }

    if outcome == "lost":
        lost = error_info("KernelLost", f"kernel process {pid} died during execution")
        return result_envelope("kernel_lost", error=lost, **common)
    if outcome == "deadline":
        after = "it is idle again" if recovered else "it did not become idle"
        message = f"execution exceeded {timeout:g} s; kernel interrupted (SIGINT), {after}"
        return result_envelope("timeout", error=error_info("Timeout", message), **common)

    error = execution.error
    if error is not None and error.get("ename") == "FinalAnswerException":
        value = str(error.get("evalue", ""))
        problem = final_answer_problem(value)
        if problem is None:
            return result_envelope("final_answer", final_answer=value, **common)
        rejected = error_info("FinalAnswerRejected", problem)
        return result_envelope("final_answer_rejected", error=rejected, **common)

    reply = execution.reply or {}
    if error is None and reply.get("status") == "error":
        error = reply  # the reply repeats ename/evalue/traceback
    if error is not None:
        info = error_info(
            str(error.get("ename", "Error")),
            action_located(str(error.get("evalue", ""))),
            "\n".join(str(line) for line in error.get("traceback", [])),
        )
        return result_envelope("error", error=info, **common)
    if reply.get("status") == "aborted":
        aborted = error_info("ExecutionAborted", "the kernel aborted the execute_request")
        return result_envelope("error", error=aborted, **common)
    return result_envelope("ok", output=output, **common)


# --------------------------------------------------------------------------------------------
# Saving and restoring the kernel's namespace (save-state / restore-state)
# --------------------------------------------------------------------------------------------
#
# The kernel pickles and unpickles its own namespace, as the kernel user, into a file in that
# user's directory: the saved state never leaves the sandbox and the bridge never reads it.
# The bridge sends one execute_request with empty code (silent, no history) whose only user
# expression runs STATE_KERNEL_CODE in a dictionary of its own, so that the user's namespace
# gets no new name. The code hands its summary back as a payload of that request's
# execute_reply (never through stdout or the display formatters), which the bridge validates.

STATE_KERNEL_CODE = r'''
import ast
import importlib
import inspect
import linecache
import os
import pickle
import sys
import tempfile
import types
import uuid

from IPython import get_ipython

ARGS = __briq_args__
MAX_NAMES = ARGS["max_names"]
NAME_LENGTH = ARGS["name_length"]
WHY_LIMIT = ARGS["why_limit"]
# IPython's own names: never the user's.
IGNORED = frozenset(("In", "Out", "get_ipython", "exit", "quit"))
# linecache names of the sources restore defines, so that a restored function or class can be
# saved again (inspect finds its source there).
RESTORED = "<briq-restored-"
FORMAT = 1


def why_of(exc):
    text = str(exc) or type(exc).__name__
    return text.encode("utf-8", "replace").decode("utf-8")[:WHY_LIMIT]


def user_names(shell):
    """The user's names, in the namespace's order, and how many keys are not identifiers."""
    ns, hidden, absent = shell.user_ns, shell.user_ns_hidden, object()
    names, odd = [], 0
    for name, value in list(ns.items()):
        if isinstance(name, str) and (name.startswith("_") or name in IGNORED):
            continue
        if hidden.get(name, absent) is value:
            continue
        if not isinstance(name, str) or not name.isidentifier() or len(name) > NAME_LENGTH:
            odd += 1
            continue
        names.append(name)
    return names, odd


def defined_here(name, value):
    """A function or class defined in the kernel under this very name, decorated or not (a
    functools.wraps wrapper pickles by reference to the name it replaces): saved by source."""
    if not callable(value):
        return False
    try:
        inner = inspect.unwrap(value)
    except Exception:
        return False
    if not (inspect.isfunction(inner) or isinstance(inner, type)):
        return False
    return all(
        getattr(item, "__module__", None) == "__main__"
        and getattr(item, "__name__", None) == name
        and getattr(item, "__qualname__", None) == name
        for item in (value, inner)
    )


def definition(text, name, line=None):
    """The source of the last top-level def or class `name` in `text` (decorators included),
    the one holding `line` when given."""
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return None
    lines = text.splitlines(True)
    found = None
    kinds = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
    for node in tree.body:
        if isinstance(node, kinds) and node.name == name:
            start = min([node.lineno] + [item.lineno for item in node.decorator_list])
            if line is None or start <= line <= node.end_lineno:
                found = "".join(lines[start - 1 : node.end_lineno])
    return found


def code_places(value):
    """(file, first line) of the code of a function, or of a class's methods."""
    if isinstance(value, type):
        members = list(vars(value).values())
    else:
        members = [inspect.unwrap(value)]
    places = []
    for member in members:
        if isinstance(member, property):
            member = member.fget
        member = getattr(member, "__func__", member)
        code = getattr(member, "__code__", None)
        if isinstance(code, types.CodeType):
            places.append((code.co_filename, code.co_firstlineno))
    return places


def source_of(shell, name, value):
    for filename, line in code_places(value):
        source = definition("".join(linecache.getlines(filename)), name, line)
        if source is not None:
            return source
    # A class without methods: the newest restored source or input cell that defines it.
    prefix = RESTORED + name + "-"
    restored = [key for key in list(linecache.cache) if str(key).startswith(prefix)]
    texts = ["".join(linecache.getlines(key)) for key in reversed(restored)]
    texts += list(reversed(shell.history_manager.input_hist_parsed))
    for text in texts:
        source = definition(text, name)
        if source is not None:
            return source
    kind = "class" if isinstance(value, type) else "function"
    raise OSError(f"the source of {kind} {name} was not found")


def save(shell, path):
    ns = shell.user_ns
    names, odd = user_names(shell)
    if len(names) > MAX_NAMES:
        raise ValueError(f"the namespace holds {len(names)} names; at most {MAX_NAMES} are saved")
    modules, sources, values, saved, unsaved = {}, [], {}, [], []
    for name in names:
        value = ns[name]
        try:
            if isinstance(value, types.ModuleType):
                module = value.__name__
                if sys.modules.get(module) is not value:
                    raise ValueError(f"module {module!r} cannot be imported again by its name")
                modules[name] = module
            elif defined_here(name, value):
                sources.append((name, source_of(shell, name, value)))
            else:
                values[name] = pickle.dumps(value, protocol=5)
        except Exception as exc:
            unsaved.append({"name": name, "why": why_of(exc)})
        else:
            saved.append(name)
    state = {
        "format": FORMAT,
        "order": saved,
        "modules": modules,
        "sources": sources,
        "values": values,
    }
    directory = os.path.dirname(path)
    os.makedirs(directory, mode=0o700, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".namespace.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            pickle.dump(state, handle, protocol=5)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    size = os.stat(path).st_size
    return {"found": True, "saved": saved, "unsaved": unsaved, "bytes": size, "odd": odd}


def define(ns, name, source):
    filename = f"{RESTORED}{name}-{uuid.uuid4().hex}>"
    code = compile(source, filename, "exec")
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    exec(code, ns)
    if name not in ns:
        raise NameError(f"its source did not define {name}")


def restore(shell, path):
    ns = shell.user_ns
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except FileNotFoundError:
        return {"found": False, "saved": [], "unsaved": [], "bytes": 0, "odd": 0}
    state = pickle.loads(data)
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise ValueError(f"{path} is not a saved namespace this bridge knows")
    restored, failed = set(), {}

    def put(name, make):
        try:
            ns[name] = make()
        except Exception as exc:
            failed[name] = exc
        else:
            restored.add(name)

    for name, module in state["modules"].items():
        put(name, lambda module=module: importlib.import_module(module))

    def define_all(items):
        left = []
        for name, source in items:
            try:
                define(ns, name, source)
            except Exception as exc:
                failed[name] = exc
                left.append((name, source))
            else:
                restored.add(name)
        return left

    # Functions and classes before the values that refer to them, again while that makes
    # progress (a class may need its base or a decorator defined first), and once more after
    # the values (a decorator may be a value).
    pending = list(state["sources"])
    while pending:
        left = define_all(pending)
        if len(left) == len(pending):
            break
        pending = left
    for name, blob in state["values"].items():
        put(name, lambda blob=blob: pickle.loads(blob))
    define_all(pending)
    order = state["order"]
    saved = [name for name in order if name in restored]
    unsaved = [
        {"name": name, "why": why_of(failed[name])}
        for name in order
        if name in failed and name not in restored
    ]
    return {"found": True, "saved": saved, "unsaved": unsaved, "bytes": len(data), "odd": 0}


def main():
    shell = get_ipython()
    if shell is None:
        raise RuntimeError("not running in IPython")
    operation = save if ARGS["op"] == "save" else restore
    summary = operation(shell, ARGS["path"])
    shell.payload_manager.write_payload({"source": ARGS["source"], "summary": summary}, False)


main()
'''


def state_expression(operation: str, path: Path) -> str:
    """The user expression that runs STATE_KERNEL_CODE in a dictionary of its own (no name
    lands in the user's namespace; builtins are taken from the builtins module, not from names
    the user may have rebound). Its value is None: the summary comes as a payload."""
    arguments = {
        "op": operation,
        "path": str(path),
        "source": STATE_PAYLOAD_SOURCE,
        "max_names": STATE_MAX_NAMES,
        "name_length": STATE_NAME_LENGTH,
        "why_limit": STATE_WHY_LIMIT,
    }
    scope = (
        f"{{'__builtins__': __import__('builtins'), '__name__': '__briq_state__', "
        f"'__briq_code__': {STATE_KERNEL_CODE!r}, '__briq_args__': {arguments!r}}}"
    )
    return f"(lambda g: g['__builtins__'].exec(g['__briq_code__'], g))({scope})"


def state_file() -> Path:
    """Where the kernel keeps the saved namespace: in the kernel user's directory."""
    return kernel_home() / STATE_FILE


def valid_unicode(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def valid_state_name(name: Any) -> bool:
    return isinstance(name, str) and len(name) <= STATE_NAME_LENGTH and name.isidentifier()


def state_summary_problem(summary: Any) -> str | None:
    """Why the kernel's summary is not one its snippet can have written, or None."""
    fields = {"found", "saved", "unsaved", "bytes", "odd"}
    if not isinstance(summary, dict) or set(summary) != fields:
        return "not a summary object"
    saved, unsaved = summary["saved"], summary["unsaved"]
    if not isinstance(summary["found"], bool):
        return "found is not a boolean"
    for key, limit in (("bytes", 2**63), ("odd", 2**31)):
        value = summary[key]
        if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < limit:
            return f"{key} is not a count"
    if not isinstance(saved, list) or len(saved) > STATE_MAX_NAMES:
        return f"saved is not a list of at most {STATE_MAX_NAMES} names"
    if not all(valid_state_name(name) for name in saved):
        return "saved holds something that is not a name"
    if not isinstance(unsaved, list) or len(unsaved) > STATE_MAX_NAMES:
        return f"unsaved is not a list of at most {STATE_MAX_NAMES} entries"
    for entry in unsaved:
        if not isinstance(entry, dict) or set(entry) != {"name", "why"}:
            return "unsaved holds something that is not {name, why}"
        if not valid_state_name(entry["name"]):
            return "unsaved holds something that is not a name"
        why = entry["why"]
        if not isinstance(why, str) or len(why) > STATE_WHY_LIMIT or not valid_unicode(why):
            return f"unsaved holds a reason that is not a string of at most {STATE_WHY_LIMIT}"
    names = saved + [entry["name"] for entry in unsaved]
    if len(set(names)) != len(names):
        return "a name is listed twice"
    if not summary["found"] and (names or summary["bytes"] or summary["odd"]):
        return "nothing was found, yet something is listed"
    return None


class StateRequest:
    """The bridge's own execute_request to the kernel: whether the kernel has started it (its
    busy status on iopub) and the content of its execute_reply once it came."""

    def __init__(self, msg_id: str) -> None:
        self.msg_id = msg_id
        self.started = False
        self.reply: Any = None
        self.replied = False

    def ours(self, msg: Any, kind: str) -> bool:
        parent = msg.get("parent_header") if isinstance(msg, dict) else None
        header = msg.get("header") if isinstance(msg, dict) else None
        return (
            isinstance(parent, dict)
            and isinstance(header, dict)
            and parent.get("msg_id") == self.msg_id
            and header.get("msg_type") == kind
        )

    def wait(self, client: Any, pid: int, until: float) -> str:
        """Wait for the reply ("done"), until kernel `pid` dies ("lost") or `until`
        ("deadline")."""
        import zmq

        iopub, shell = client.iopub_channel, client.shell_channel
        poller = zmq.Poller()
        poller.register(iopub.socket, zmq.POLLIN)
        poller.register(shell.socket, zmq.POLLIN)
        while not self.replied:
            if not process_is_kernel(pid):
                return "lost"
            now = time.monotonic()
            if now >= until:
                return "deadline"
            ready = dict(poller.poll(int(min(until - now, PID_CHECK_INTERVAL_S) * 1000) + 1))
            if iopub.socket in ready and (msg := receive(iopub, 0)) is not None:
                content = msg.get("content")
                if self.ours(msg, "status") and isinstance(content, dict):
                    self.started = self.started or content.get("execution_state") == "busy"
            if shell.socket in ready and (msg := receive(shell, 0)) is not None:
                if self.ours(msg, "execute_reply"):
                    self.reply, self.replied, self.started = msg.get("content"), True, True
        return "done"


def kernel_state_summary(content: Any) -> tuple[dict | None, str]:
    """The validated summary in an execute_reply's content, or None and what is wrong."""
    if not isinstance(content, dict):
        return None, "malformed summary: the reply has no content"
    if content.get("status") != "ok":
        problem = f"{content.get('ename', 'Error')}: {content.get('evalue', '')}"
        return None, f"the kernel did not run the request ({clip(str(problem), 1_000)})"
    expressions = content.get("user_expressions")
    outcome = expressions.get("briq_state") if isinstance(expressions, dict) else None
    if isinstance(outcome, dict) and outcome.get("status") == "error":
        problem = f"{outcome.get('ename', 'Error')}: {outcome.get('evalue', '')}"
        return None, f"the kernel failed: {clip(strip_ansi(str(problem)), 1_000)}"
    if not isinstance(outcome, dict) or outcome.get("status") != "ok":
        return None, "malformed summary: the kernel did not evaluate the request"
    payloads = content.get("payload")
    ours = [
        item
        for item in (payloads if isinstance(payloads, list) else [])
        if isinstance(item, dict) and item.get("source") == STATE_PAYLOAD_SOURCE
    ]
    if len(ours) != 1 or set(ours[0]) != {"source", "summary"}:
        return None, f"malformed summary: {len(ours)} summaries in the reply"
    summary = ours[0]["summary"]
    problem = state_summary_problem(summary)
    if problem is not None:
        return None, f"malformed summary: {problem}"
    return summary, ""


def kernel_gone_message(state: KernelState) -> str:
    recorded = state.read_pid()
    if recorded is None or not state.connection_file.exists():
        return f"no kernel: there is no kernel state in {state.dir} (it is gone or never started)"
    return f"no kernel: kernel process {recorded} is gone"


def state_command(args: argparse.Namespace, operation: str) -> tuple[dict, int]:
    """Ask the live kernel to save (`operation` "save") or restore ("restore") its namespace
    over a connection of our own (never through the runner, which serves run requests)."""
    deadline = time.monotonic() + args.deadline
    state = KernelState(args.state_dir)
    check_state_dir(state)
    pid = state.live_pid()
    if pid is None:
        return state_envelope(False, kernel_gone_message(state)), 1
    path = state_file()
    shown = os.path.relpath(path)
    client = connect(state, shell=True, iopub=True)
    try:
        # A live iopub subscription first, to see the kernel start our request.
        if not await_iopub(client, pid, deadline):
            outcome = "lost" if not process_is_kernel(pid) else "silent"
        else:
            request = StateRequest(
                client.execute(
                    "",
                    silent=True,
                    store_history=False,
                    user_expressions={"briq_state": state_expression(operation, path)},
                    allow_stdin=False,
                    stop_on_error=False,
                )
            )
            outcome = request.wait(client, pid, deadline)
        if outcome == "silent":
            message = (
                f"the kernel did not answer within the deadline of {args.deadline:g} s "
                f"(busy or frozen); nothing was asked of it ({operation})"
            )
            return state_envelope(False, message), 1
        if outcome == "deadline":
            late = f"the deadline of {args.deadline:g} s passed before the kernel finished"
            if not request.started:
                # Busy with something else (the operator saves idle executors only): that is
                # not ours to interrupt. Our request stays queued and runs when it is done.
                message = f"{late} ({operation}): it was busy and had not started it"
                return state_envelope(False, message), 1
            # As a run's timeout: KeyboardInterrupt in the kernel (a save's partial file is
            # removed, the previous one stays), which then answers our request.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGINT)
            after = request.wait(client, pid, time.monotonic() + INTERRUPT_GRACE_S)
            idle = "it is idle again" if after == "done" else "it did not answer"
            message = f"{late} ({operation}); kernel interrupted (SIGINT), {idle}"
            return state_envelope(False, message), 1
    finally:
        client.stop_channels()
    if outcome == "lost":
        return state_envelope(False, f"kernel process {pid} is gone: it died during {operation}"), 1
    summary, problem = kernel_state_summary(request.reply)
    if summary is None:
        return state_envelope(False, problem), 1
    saved, unsaved, size = summary["saved"], summary["unsaved"], summary["bytes"]
    if operation == "save":
        message = f"saved {len(saved)} names to {shown} ({size} bytes)"
    elif not summary["found"]:
        message = f"nothing was saved: there is no {shown} to restore from"
    else:
        message = f"restored {len(saved)} names from {shown} ({size} bytes)"
    if unsaved:
        verb = "saved" if operation == "save" else "restored"
        message += f"; {len(unsaved)} could not be {verb}: " + ", ".join(
            entry["name"] for entry in unsaved
        )
    if summary["odd"]:
        message += f"; {summary['odd']} namespace keys that are not names were left out"
    return state_envelope(True, clip(message, 4_000), saved, unsaved, size), 0


def cmd_save_state(args: argparse.Namespace) -> tuple[dict, int]:
    return state_command(args, "save")


def cmd_restore_state(args: argparse.Namespace) -> tuple[dict, int]:
    return state_command(args, "restore")


def claim_env_problem(env: Any) -> str | None:
    """Why `env` cannot be a claimer's environment, or None: a JSON object of at most
    ENV_MAX_NAMES names (as ENV_NAME_PATTERN, none reserved) to strings without NUL."""
    if not isinstance(env, dict):
        return "the environment must be a JSON object of names to strings"
    if len(env) > ENV_MAX_NAMES:
        return f"{len(env)} variables, over the limit of {ENV_MAX_NAMES}"
    for name, value in env.items():
        if not ENV_NAME_PATTERN.fullmatch(name):
            return f"{clip(name, 200)!r} is not an environment variable name"
        if name in ENV_RESERVED or name.startswith(ENV_RESERVED_PREFIX):
            return f"{name} is reserved for the bridge and the interpreter"
        if not isinstance(value, str) or "\0" in value or not valid_unicode(value):
            return f"the value of {name} must be text without NUL"
    return None


def read_claim_env(state: KernelState) -> dict[str, str]:
    """The claimer's environment kept by `set-env` ({} before any); a file that is not one
    (only the bridge writes it) fails the command rather than start a kernel without it."""
    try:
        env = json.loads(state.env_file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    problem = claim_env_problem(env)
    if problem is not None:
        raise ValueError(f"{state.env_file} is not a claimer's environment: {problem}")
    return env


def write_claim_env(state: KernelState, env: dict[str, str]) -> None:
    """Keep `env` for every kernel started from now on: written whole (a rename), mode 0600."""
    import tempfile

    fd, tmp_name = tempfile.mkstemp(dir=state.dir, prefix=".claim-env.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(env, handle)
        os.replace(tmp_name, state.env_file)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp_name)
        raise


def env_expression(env: dict[str, str]) -> str:
    """The user expression that sets `env` in the kernel's os.environ (and so for its children);
    its value is the number of names set. No name lands in the user's namespace."""
    return (
        f"(lambda environ, new: environ.update(new) or len(new))(__import__('os').environ, {env!r})"
    )


def kernel_env_outcome(content: Any, count: int) -> str | None:
    """What is wrong with the kernel's execute_reply to `env_expression`, or None."""
    if not isinstance(content, dict) or content.get("status") != "ok":
        return "the kernel did not run the request"
    expressions = content.get("user_expressions")
    outcome = expressions.get(ENV_EXPRESSION_KEY) if isinstance(expressions, dict) else None
    if not isinstance(outcome, dict) or outcome.get("status") != "ok":
        return "the kernel failed to set its environment"
    data = outcome.get("data")
    if not isinstance(data, dict) or data.get("text/plain") != str(count):
        return "the kernel's answer is not the number of variables set"
    return None


def cmd_set_env(args: argparse.Namespace) -> tuple[dict, int]:
    """Give the kernel the claimer's environment (a JSON object on stdin): kept for every kernel
    started from now on, and set in the live kernel's os.environ."""
    deadline = time.monotonic() + args.deadline
    state = KernelState(args.state_dir)
    check_state_dir(state)
    env = parse_claim_env(sys.stdin.buffer.read(ENV_MAX_BYTES + 1))
    if isinstance(env, str):
        return env_envelope(False, env), 1
    names = sorted(env)
    state.dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    write_claim_env(state, env)
    pid = state.live_pid()
    if pid is None:
        message = f"kept {len(names)} variables for the next kernel (no live kernel)"
        return env_envelope(True, message, names), 0
    client = connect(state, shell=True, iopub=True)
    try:
        return set_env_in_kernel(client, pid, env, deadline, args.deadline)
    finally:
        client.stop_channels()


def set_env_in_kernel(
    client: Any, pid: int, env: dict[str, str], deadline: float, seconds: float
) -> tuple[dict, int]:
    """Set `env` in kernel `pid`'s os.environ over `client`: the env envelope and exit code."""
    request = StateRequest(
        client.execute(
            "",
            silent=True,
            store_history=False,
            user_expressions={ENV_EXPRESSION_KEY: env_expression(env)},
            allow_stdin=False,
            stop_on_error=False,
        )
    )
    outcome = request.wait(client, pid, deadline)
    if outcome == "lost":
        return env_envelope(False, f"kernel process {pid} is gone"), 1
    if outcome == "deadline":
        message = f"the kernel did not set its environment within {seconds:g} s"
        return env_envelope(False, message), 1
    problem = kernel_env_outcome(request.reply, len(env))
    if problem is not None:
        return env_envelope(False, problem), 1
    names = sorted(env)
    return env_envelope(True, f"set {len(names)} variables in kernel {pid}", names), 0


def parse_claim_env(raw: bytes) -> dict[str, str] | str:
    """The claimer's environment in `raw` (read with one byte over the limit), or what is wrong
    with it."""
    if len(raw) > ENV_MAX_BYTES:
        return f"the environment is over {ENV_MAX_BYTES} bytes"
    try:
        env = json.loads(raw.decode("utf-8"))
    except ValueError as exc:
        return f"the environment is not JSON: {clip(str(exc), 200)}"
    problem = claim_env_problem(env)
    return env if problem is None else problem


# --------------------------------------------------------------------------------------------
# The runner: one long-lived kernel client per kernel, behind a Unix socket
# --------------------------------------------------------------------------------------------
#
# `run` pays for importing jupyter_client and for a fresh iopub subscription on every call; the
# runner (`serve`, started by start-kernel) pays once. One JSON object per line each way, one
# request per connection, one connection at a time:
#   {"op":"ping"}                                          -> {"kernel_pid":N}
#   {"op":"run","code":ABS_PATH,"timeout":S,"kernel_pid":N} -> {"envelope":{...},"exit_code":0|1}
#                                                             or {"declined":"why"} (nothing ran)
# The run client's own requests (briq_run.py), `exec` and `set-env`, are described at
# Runner.serve_exec and Runner.serve_set_env.
# A request that does not parse gets a BridgeError result envelope with exit code 1.


def cancelled_result(envelope: dict, exit_code: int, mark: dict) -> dict:
    """`envelope`, written for an attempt whose cancel `mark` exists, as the `cancelled` result
    (PROTOCOL.md "Cancel"): logs, output and counts as collected, no final answer, an error
    saying what became of the kernel. A bridge failure (exit code 1) says nothing about the
    code and stays as it is, and so does a result that is `cancelled` already."""
    if exit_code != 0 or envelope.get("status") in ("cancelled", "not_accepted"):
        return envelope
    seconds = f"{envelope.get('duration_ms', 0) / 1000:.1f}"
    restart_after = mark.get("restart_after")
    status, name = envelope.get("status"), (envelope.get("error") or {}).get("name")
    if restart_after is not None:
        error = error_info(
            "KernelRestarted",
            f"cancelled: the code did not stop within {restart_after:g} s of the interrupt; "
            "the kernel was restarted and its Python state is gone",
        )
    elif status == "kernel_lost":
        error = error_info(
            "KernelLost",
            f"cancelled after {seconds} s: the kernel was lost while the code ran; its Python "
            "state is gone",
        )
    elif status == "timeout" or name == "KeyboardInterrupt":
        error = error_info(
            "Cancelled",
            f"cancelled after {seconds} s: the code was interrupted (KeyboardInterrupt); the "
            "kernel keeps its state",
        )
    else:
        # It ended on its own (or turned the interrupt into something else) as it was cancelled.
        ended = status if name is None else f"{status}: {name}"
        error = error_info(
            "Cancelled",
            f"cancelled after {seconds} s: the code ended ({ended}) as it was interrupted; the "
            "kernel keeps its state",
        )
    return {**envelope, "status": "cancelled", "final_answer": None, "error": error}


class Journal:
    """The attempts this sandbox accepted and what each finished with. `<id>.accepted` is made
    with O_EXCL before the code runs (so of two deliveries only one runs it) and holds the wall
    clock time after which nobody waits for the result any more; `<id>.finished` is the result
    (envelope and exit code), written whole by rename. Files survive the runner and any `run`
    process; they live in a root-only directory when the kernel runs as another user."""

    def __init__(self, directory: str | os.PathLike = JOURNAL_DIR) -> None:
        self.dir = Path(directory)

    def _path(self, attempt: str, suffix: str) -> Path:
        if not ATTEMPT_PATTERN.fullmatch(attempt):
            raise ValueError("an attempt id is 16 to 64 lowercase hex digits")
        return self.dir / f"{attempt}.{suffix}"

    def accept(
        self, attempt: str, wait_until: float, prune: bool = True, acknowledge: bool = True
    ) -> bool:
        """Record `attempt` as accepted; False when it was accepted before (by anyone). A newly
        accepted attempt acknowledges every earlier record unless told not to (a cancel claims
        an attempt while an earlier one may still run); then the journal is pruned unless told
        not to (the runner prunes after it answered)."""
        if split_users():
            private_dir(self.dir)
        else:
            self.dir.mkdir(parents=True, exist_ok=True)
        path = self._path(attempt, "accepted")
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        except FileExistsError:
            return False
        with os.fdopen(fd, "w") as handle:
            json.dump({"wait_until": wait_until}, handle)
        if acknowledge:
            self.acknowledge_all_but(attempt)
        if prune:
            self.prune(time.time())
        return True

    def acknowledge_all_but(self, attempt: str) -> None:
        """Mark every record but `attempt`'s as learnt by the operator (`<id>.acked`), so that
        pruning may remove it: the operator sends an executor's next attempt only once the
        results of all earlier ones are written."""
        try:
            names = {e.name for e in os.scandir(self.dir) if e.is_file(follow_symlinks=False)}
        except OSError:
            return
        for name in names:
            other, _, suffix = name.partition(".")
            if suffix != "accepted" or other == attempt or f"{other}.acked" in names:
                continue
            with contextlib.suppress(OSError):
                fd = os.open(
                    self.dir / f"{other}.acked",
                    os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW,
                    0o600,
                )
                os.close(fd)

    def live_path(self, attempt: str) -> Path:
        """Where `attempt`'s live output is written while it runs (PROTOCOL.md "Live output")."""
        return self._path(attempt, "live")

    def accepted(self, attempt: str) -> dict | None:
        """The accepted record of `attempt`, or None when it was never accepted. A record that
        cannot be read counts as accepted with nothing to wait for: it was made, so the code
        may have run."""
        path = self._path(attempt, "accepted")
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return None
        except OSError:
            return {"wait_until": 0.0}
        try:
            record = json.loads(text)
            wait_until = float(record["wait_until"])
        except (ValueError, TypeError, KeyError, RecursionError):
            return {"wait_until": 0.0}
        return {"wait_until": wait_until}

    @contextlib.contextmanager
    def attempt_lock(self, attempt: str) -> Iterator[None]:
        """Hold `attempt`'s lock (a flock on its accepted record, which exists before anyone
        writes its result or cancels it): whoever writes the result and whoever cancels it
        decide under it, so a result is converted by the cancel marker it was written under.
        Without an accepted record there is nothing to lock (and nobody to race with)."""
        import fcntl

        try:
            fd = os.open(self._path(attempt, "accepted"), os.O_RDONLY | os.O_NOFOLLOW)
        except FileNotFoundError:
            yield
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # releases the lock

    def mark_cancel(self, attempt: str, restart_after: float | None = None) -> bool:
        """Write `attempt`'s cancel marker (`<id>.cancel`, whole by rename, mode 0600) under
        its lock. Without `restart_after` it is the cancel's first step: False when a marker is
        there already (another cancel works on it). With it, it records that the kernel is
        killed and restarted because the code did not stop within that many seconds of the
        interrupt (the marker is rewritten)."""
        target = self._path(attempt, "cancel")
        if restart_after is None and os.path.lexists(target):
            return False
        self._write_whole(attempt, target, {"restart_after": restart_after})
        return True

    def cancel_mark(self, attempt: str) -> dict | None:
        """`attempt`'s cancel marker, or None when nobody cancelled it. A marker that does not
        parse still cancels (without a restart)."""
        try:
            text = self._path(attempt, "cancel").read_text(encoding="utf-8")
        except FileNotFoundError:
            return None
        except OSError:
            return {"restart_after": None}
        try:
            restart_after = json.loads(text)["restart_after"]
            if restart_after is not None:
                restart_after = float(restart_after)
        except (ValueError, TypeError, KeyError, RecursionError):
            restart_after = None
        return {"restart_after": restart_after}

    def _write_whole(self, attempt: str, target: Path, record: dict) -> None:
        """`record` as JSON at `target`, replaced whole by rename (mode 0600)."""
        import tempfile

        fd, tmp_name = tempfile.mkstemp(dir=self.dir, prefix=f".{attempt}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                json.dump(record, handle)
            os.replace(tmp_name, target)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp_name)
            raise

    def finish(self, attempt: str, envelope: dict, exit_code: int) -> tuple[dict, int]:
        """Record the result of an accepted attempt and return the result on record, which is
        what the caller must answer: the first writer's (a result written already wins), and
        converted to `cancelled` when the attempt was cancelled (its marker exists). Every
        writer of a result comes here, so every one honours a cancel. Never fails (the answer
        at hand matters more than the record of it)."""
        answer = (envelope, exit_code)
        try:
            with self.attempt_lock(attempt):
                mark = self.cancel_mark(attempt)
                if mark is not None:
                    answer = (cancelled_result(envelope, exit_code, mark), exit_code)
                return self._record_first(attempt, *answer)
        except Exception as exc:
            print(f"bridge: could not journal attempt {attempt}: {exc}", file=sys.stderr)
            return answer

    def _record_first(self, attempt: str, envelope: dict, exit_code: int) -> tuple[dict, int]:
        """Write `<id>.finished` unless it exists: a temporary file linked into place, so a
        reader sees no record or the whole one and the first writer wins. Returns the record."""
        import tempfile

        target = self._path(attempt, "finished")
        fd, tmp_name = tempfile.mkstemp(dir=self.dir, prefix=f".{attempt}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                json.dump({"envelope": envelope, "exit_code": exit_code}, handle)
            try:
                os.link(tmp_name, target)
            except FileExistsError:
                recorded = self.finished(attempt)
                if recorded is not None:
                    return recorded
                # A record that does not parse is no result (and nobody reads it as one): this
                # writer's result replaces it.
                os.replace(tmp_name, target)
        finally:
            with contextlib.suppress(OSError):
                os.unlink(tmp_name)
        return envelope, exit_code

    def finished(self, attempt: str) -> tuple[dict, int] | None:
        """The recorded (envelope, exit code) of `attempt`, or None when there is none (yet)."""
        try:
            record = json.loads(self._path(attempt, "finished").read_text(encoding="utf-8"))
        except (OSError, ValueError, RecursionError):
            return None
        if not (isinstance(record, dict) and set(record) == {"envelope", "exit_code"}):
            return None
        envelope, exit_code = record["envelope"], record["exit_code"]
        if is_result_envelope(envelope) and type(exit_code) is int and exit_code in (0, 1):
            return envelope, exit_code
        return None

    def await_finished(self, attempt: str, until: float | None = None) -> tuple[dict, int] | None:
        """The result of an attempt accepted earlier: at once when recorded, else once it is,
        until the accepted record's time (or the wall clock time `until`, when given) is up;
        then None: the outcome is unknown."""
        if until is None:
            record = self.accepted(attempt)
            until = -1.0 if record is None else record["wait_until"]
        while True:
            found = self.finished(attempt)
            if found is not None or time.time() >= until:
                return found
            time.sleep(JOURNAL_POLL_S)

    def prune(self, now: float) -> None:
        """Of the acknowledged records, remove those older than JOURNAL_MAX_AGE_S and all but the
        newest JOURNAL_KEEP (temporary files of a crashed write included). A record not
        acknowledged is kept, however old: the operator may still ask for it."""
        try:
            entries = [e for e in os.scandir(self.dir) if e.is_file(follow_symlinks=False)]
        except OSError:
            return
        acked = {e.name.split(".")[0] for e in entries if e.name.endswith(".acked")}
        by_attempt: dict[str, float] = {}
        for entry in entries:
            key = entry.name.lstrip(".").split(".")[0]
            if key not in acked:
                continue
            with contextlib.suppress(OSError):
                mtime = entry.stat(follow_symlinks=False).st_mtime
                by_attempt[key] = max(by_attempt.get(key, 0.0), mtime)
        newest = sorted(by_attempt, key=by_attempt.__getitem__, reverse=True)
        doomed = {a for a in newest[JOURNAL_KEEP:]}
        doomed |= {a for a, mtime in by_attempt.items() if now - mtime > JOURNAL_MAX_AGE_S}
        for entry in entries:
            if entry.name.lstrip(".").split(".")[0] in doomed:
                with contextlib.suppress(OSError):
                    os.unlink(entry.path)


def live_line(record: dict) -> bytes:
    """One line of a live file: compact JSON, pure ASCII (whatever the user printed: newlines,
    control characters and lone surrogates are escaped or replaced), so a line is never split."""
    return (
        json.dumps(_valid_unicode(record), ensure_ascii=True, separators=(",", ":")).encode("ascii")
        + b"\n"
    )


class LiveOutput:
    """The live file of one attempt (PROTOCOL.md "Live output"), written by the process that
    collects the attempt's kernel messages (the runner, or `run` without one): a line per stream
    message, at most LIVE_BUDGET characters of text (then a cut line), and an end line.

    The writer holds an exclusive flock on the file from before it appears until the end line is
    written, so a follower that can take the lock knows that nothing more will come: a writer
    that died leaves the file unlocked without an end line. Writing never fails the run: after
    an error the file is released as it is (its followers say `lost`)."""

    def __init__(self, fd: int | None = None, attempt: str | None = None) -> None:
        self.fd = fd
        self.attempt = attempt
        self.relayed = 0
        self.cut = False
        # How the attempt's output ended, the word of the end line ("failed" until the
        # execution says otherwise: an exception escaped it).
        self.how = "failed"

    @classmethod
    def start(cls, attempt: str | None) -> LiveOutput:
        """The new live file of `attempt`, which the caller accepted in the journal; one that
        writes nothing without an attempt or when the file cannot be made. A live file that is
        there already is never touched: it is another run's."""
        if attempt is None:
            return cls()
        import fcntl
        import tempfile

        journal = Journal()
        try:
            fd, tmp_name = tempfile.mkstemp(dir=journal.dir, prefix=f".{attempt}.", suffix=".tmp")
        except OSError as exc:
            print(f"bridge: no live output for attempt {attempt}: {exc}", file=sys.stderr)
            return cls()
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            # Linked into place locked, so no follower ever sees it unlocked before its end,
            # and only if no live file is there (the first run's is never rewritten).
            os.link(tmp_name, journal.live_path(attempt))
        except OSError as exc:
            os.close(fd)
            print(f"bridge: no live output for attempt {attempt}: {exc}", file=sys.stderr)
            return cls()
        finally:
            with contextlib.suppress(OSError):
                os.unlink(tmp_name)
        return cls(fd, attempt)

    def __enter__(self) -> LiveOutput:
        return self

    def __exit__(self, exc_type: Any, exc: Any, traceback: Any) -> None:
        self.end("failed" if exc_type is not None else self.how)

    def stream(self, name: Any, text: str) -> None:
        """Relay a stream message's text, as far as the budget goes."""
        if self.fd is None or self.cut or not text:
            return
        stream = "stderr" if name == "stderr" else "stdout"
        room = LIVE_BUDGET - self.relayed
        if len(text) <= room:
            self.relayed += len(text)
            self._write({"stream": stream, "text": text})
            return
        if room:
            self._write({"stream": stream, "text": text[:room]})
        self.relayed, self.cut = LIVE_BUDGET, True
        self._write({"cut": LIVE_BUDGET})

    def end(self, how: str) -> None:
        """Write the end line and release the file. An attempt cancelled meanwhile ends
        `cancelled`, as the journal records it."""
        if self.fd is None:
            return
        if how != "failed" and Journal().cancel_mark(self.attempt) is not None:
            how = "cancelled"
        self._write({"end": how})
        self._release()

    def _write(self, record: dict) -> None:
        # One write per line, unbuffered: a follower sees it at once.
        if self.fd is None:
            return  # released after an earlier error
        data = live_line(record)
        try:
            while data:
                data = data[os.write(self.fd, data) :]
        except OSError as exc:
            print(f"bridge: live output of {self.attempt} stopped: {exc}", file=sys.stderr)
            self._release()

    def _release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)  # releases the lock
            self.fd = None


def live_writer_gone(fd: int) -> bool:
    """Whether nobody holds the live file `fd` locked any more: its writer ended or died."""
    import fcntl

    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    fcntl.flock(fd, fcntl.LOCK_UN)
    return True


def last_end_line(fd: int) -> bytes | None:
    """The live file's end line when it is its last line, else None."""
    size = os.fstat(fd).st_size
    tail = os.pread(fd, 256, max(0, size - 256))
    last = tail[:-1].rpartition(b"\n")[2]
    return last + b"\n" if tail.endswith(b"\n") and last.startswith(LIVE_END_PREFIX) else None


def write_stdout(data: bytes) -> None:
    """Straight to fd 1, unbuffered: the follower's reader gets each line as it is written."""
    while data:
        data = data[os.write(1, data) :]


def open_live_file(journal: Journal, attempt: str, until: float) -> int | str:
    """The open live file of `attempt` once there is one, else the end word saying why there is
    none: `unknown` (never accepted here), `gone` (its result is recorded and no live file is
    there), `lost` (its accepted time is up with neither) or `timeout` (`until` passed)."""
    path = journal.live_path(attempt)
    while True:
        # Looked at before the file: the live file is made before the result is recorded, so a
        # live file missing after the record was seen never comes.
        finished = journal.finished(attempt) is not None
        try:
            return os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        except FileNotFoundError:
            pass
        if finished:
            return "gone"
        accepted = journal.accepted(attempt)
        if accepted is None:
            return "unknown"
        if time.time() >= accepted["wait_until"]:
            return "lost"
        if time.monotonic() >= until:
            return "timeout"
        time.sleep(JOURNAL_POLL_S)


def follow_live_file(fd: int, offset: int, until: float) -> str | None:
    """Print the complete lines of the live file `fd` from byte `offset` on, as they are
    appended, through its end line (then None); the end word to print instead when its writer
    is gone without one (`lost`) or `until` passes (`timeout`)."""
    # Reading from the byte before `offset` tells whether `offset` starts a line; when it does
    # not (a resume inside a line), the rest of that line is skipped, never printed in part.
    position = max(0, offset - 1)
    at_line_start = offset == 0
    pending = b""
    writer_gone = False
    while time.monotonic() < until:
        chunk = os.pread(fd, LIVE_READ_BYTES, position)
        if chunk:
            position += len(chunk)
            pending += chunk
            if not at_line_start:
                at_line_start = b"\n" in pending
                pending = pending.partition(b"\n")[2]
            *lines, pending = pending.split(b"\n")
            for line in lines:
                write_stdout(line + b"\n")
                if line.startswith(LIVE_END_PREFIX):
                    return None
        elif writer_gone:
            # All it wrote has been read. An end line before `offset` (a resume after the end)
            # is printed again; none at all means the writer died.
            end = last_end_line(fd)
            if end is None:
                return "lost"
            write_stdout(end)
            return None
        elif live_writer_gone(fd):
            writer_gone = True  # read once more: it may have written up to its release
        else:
            time.sleep(JOURNAL_POLL_S)
    return "timeout"


def cmd_follow(args: argparse.Namespace) -> int:
    """`follow --attempt X`: the attempt's live file on stdout from byte `--offset` on, line by
    line as it grows, through its end line or an end line of its own (PROTOCOL.md "Live
    output"). No envelope: the operator reads the bytes as they come. Exit code 0 once an end
    line is printed, 1 when the bridge failed (a message on stderr)."""
    until = time.monotonic() + args.max_seconds
    try:
        if split_users():
            secure_layout()
        opened = open_live_file(Journal(), args.attempt, until)
        if isinstance(opened, str):
            ended: str | None = opened
        else:
            try:
                ended = follow_live_file(opened, args.offset, until)
            finally:
                os.close(opened)
        if ended is not None:
            write_stdout(live_line({"end": ended}))
    except BrokenPipeError:
        return 1  # the reader is gone: nobody to tell
    except Exception as exc:
        print(failure_message(exc), file=sys.stderr)
        return 1
    return 0


class OutcomeUnknown(Exception):
    """The runner may have received a `run` request but gave no answer: the code may or may not
    have run, so it must not run again and no envelope may claim either way."""


def failure_message(exc: BaseException) -> str:
    return f"bridge error: {type(exc).__name__}: {exc}"


def runner_log(message: str) -> None:
    """One line in the runner log (the runner's stderr)."""
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    print(f"{stamp} runner {os.getpid()}: {message}", file=sys.stderr, flush=True)


def is_result_envelope(value: Any) -> bool:
    return (
        isinstance(value, dict)
        and value.get("kind") == "result"
        and set(value) == set(result_envelope("ok"))
    )


def send_line(sock: socket.socket, message: dict, timeout: float) -> None:
    sock.settimeout(timeout)
    sock.sendall(json.dumps(message, separators=(",", ":")).encode("ascii") + b"\n")


def read_line(sock: socket.socket, limit: int, until: float) -> bytes:
    """The bytes before the first newline. Raises OSError when the connection closes or `until`
    passes first, ValueError when more than `limit` bytes come without a newline."""
    data = bytearray()
    searched = 0
    while (end := data.find(b"\n", searched)) < 0:
        if len(data) > limit:
            raise ValueError(f"no newline within {limit} bytes")
        searched = len(data)
        remaining = until - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("timed out waiting for a complete line")
        sock.settimeout(remaining)
        chunk = sock.recv(1 << 16)
        if not chunk:
            raise ConnectionError("connection closed before a complete line")
        data += chunk
    return bytes(data[:end])


def genuine_runner_socket(state: KernelState) -> bool:
    """Whether the runner socket can only be the one our runner bound: it and its directory
    (lstat, no symlink followed) are ours and writable by nobody else, and it is a socket. Then
    nobody else can have replaced it between this check and the connect."""
    try:
        directory = os.lstat(state.dir)
        sock = os.lstat(state.runner_socket)
    except OSError:
        return False
    return (
        stat.S_ISDIR(directory.st_mode)
        and trusted(directory)
        and stat.S_ISSOCK(sock.st_mode)
        and trusted(sock)
    )


def open_runner(state: KernelState, timeout: float) -> socket.socket | None:
    """A connection to the genuine runner, or None when nobody listens there or the socket is not
    the runner's (nothing sent)."""
    if not genuine_runner_socket(state):
        return None
    try:
        address = str(state.runner_socket)
        # AF_UNIX addresses are short (108 bytes on Linux): prefer the path relative to the cwd.
        relative = os.path.relpath(address)
        if len(relative) < len(address):
            address = relative
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    except (OSError, ValueError):
        return None
    try:
        sock.settimeout(timeout)
        sock.connect(address)
    except OSError:  # no socket file, ECONNREFUSED (runner gone), backlog full, path too long
        sock.close()
        return None
    return sock


def ping_runner(state: KernelState) -> int | None:
    """The pid of the kernel the runner serves, or None when no runner answers."""
    sock = open_runner(state, RUNNER_PING_WAIT_S)
    if sock is None:
        return None
    with sock:
        try:
            send_line(sock, {"op": "ping"}, RUNNER_PING_WAIT_S)
            answer = json.loads(read_line(sock, 4_096, time.monotonic() + RUNNER_PING_WAIT_S))
        except (OSError, ValueError):
            return None
    pid = answer.get("kernel_pid") if isinstance(answer, dict) else None
    return pid if type(pid) is int else None


def cmd_recall(args: argparse.Namespace) -> tuple[dict, int]:
    """What became of an attempt: its recorded result (waiting for it while it runs), or a
    `not_accepted` result when this sandbox never accepted it, so the code never ran here."""
    journal = Journal()
    if journal.accepted(args.attempt) is None:
        return result_envelope("not_accepted"), 0
    found = journal.await_finished(args.attempt)
    if found is None:
        raise OutcomeUnknown(f"attempt {args.attempt} was accepted and has no result")
    return found


def cmd_cancel(args: argparse.Namespace) -> tuple[dict, int]:
    """Cancel attempt `args.attempt` and keep the kernel when it can be kept (PROTOCOL.md
    "Cancel"); the attempt's result on record. Runs no user code.

    Never accepted: claimed here and recorded `cancelled` (it never runs). Finished: its record,
    unchanged. Running: a cancel marker (which makes the journal record whatever result comes
    as `cancelled`), SIGINT to the kernel, and up to `grace` seconds for the result; then the
    marker records the restart, the kernel's group is killed, the runner gets a moment to
    record the attempt (or it is recorded here), and a fresh kernel and runner are started."""
    state = KernelState(args.state_dir)
    check_state_dir(state)
    journal = Journal()
    attempt = args.attempt
    found = journal.finished(attempt)
    if found is not None:
        return found  # too late: it ended as recorded
    if journal.accept(attempt, time.time() + CANCEL_CLAIM_WAIT_S, prune=False, acknowledge=False):
        # Nothing is acknowledged or pruned: an earlier attempt may still be running.
        never_ran = error_info("Cancelled", "cancelled before it ran: the code never ran")
        return journal.finish(attempt, result_envelope("cancelled", error=never_ran), 0)

    pid = state.live_pid()
    with journal.attempt_lock(attempt):
        # Under the attempt's lock: a result written after this sees the marker, and one written
        # before it is found here (then nobody is interrupted: the kernel may run the next one).
        found = journal.finished(attempt)
        first = found is None and journal.mark_cancel(attempt)
        if first and pid is not None:
            # As the timeout does: ipykernel raises KeyboardInterrupt in the running code.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGINT)
    if found is not None:
        return found
    if not first:
        # Another cancel works on it: its result, once that cancel or the runner records it.
        until = time.time() + args.grace + CANCEL_LOST_WAIT_S + RUNNER_ANSWER_MARGIN_S
        found = journal.await_finished(attempt, until)
        if found is None:
            raise OutcomeUnknown(f"attempt {attempt} is being cancelled and has no result yet")
        return found

    found = journal.await_finished(attempt, time.time() + args.grace)
    if found is not None:
        return found
    with journal.attempt_lock(attempt):
        found = journal.finished(attempt)
        if found is None:
            # From here on any result recorded for it says the kernel was restarted: it will be.
            journal.mark_cancel(attempt, restart_after=args.grace)
    if found is not None:
        return found
    runner = read_pid_file(state.runner_pid_file)
    if pid is not None:
        kill_kernel_group(pid)
    # The runner (or the run that executes it) sees its kernel gone and records the attempt.
    found = journal.await_finished(attempt, time.time() + CANCEL_LOST_WAIT_S)
    if found is None:
        # Nobody is left to record it (the runner died too): the first record wins, so this
        # one is written only if none is there by now.
        lost = error_info("KernelLost", f"kernel {pid} was killed by the cancel")
        found = journal.finish(attempt, result_envelope("kernel_lost", error=lost), 0)
    # Let the old runner send its answer and exit on its own before start-kernel replaces it.
    until = time.monotonic() + CANCEL_LOST_WAIT_S
    while runner is not None and process_is_runner(runner) and time.monotonic() < until:
        time.sleep(0.02)
    restart = argparse.Namespace(state_dir=args.state_dir, deadline=CANCEL_RESTART_DEADLINE_S)
    kernel, _ = cmd_start_kernel(restart)
    if not kernel["alive"]:
        print(f"bridge: no fresh kernel after the cancel: {kernel['message']}", file=sys.stderr)
    return found


def run_through_runner(
    state: KernelState, pid: int, code_path: str, timeout: float, attempt: str | None = None
) -> tuple[dict, int] | None:
    """The runner's (envelope, exit code) for the action, or None when no runner listens or it
    declined: then nothing ran and the caller may run the code itself.

    Raises OutcomeUnknown once the request may have reached the runner and no valid answer came
    back within timeout + INTERRUPT_GRACE_S + RUNNER_ANSWER_MARGIN_S.
    """
    sock = open_runner(state, RUNNER_PING_WAIT_S)
    if sock is None:
        return None
    request = {
        "op": "run",
        "code": os.path.abspath(code_path),
        "timeout": timeout,
        "kernel_pid": pid,
    }
    if attempt is not None:
        request["attempt"] = attempt
    until = time.monotonic() + timeout + INTERRUPT_GRACE_S + RUNNER_ANSWER_MARGIN_S
    with sock:
        # From here on the code may run: any failure is an unknown outcome, never a fallback.
        try:
            send_line(sock, request, RUNNER_PING_WAIT_S)
            answer = json.loads(read_line(sock, RUNNER_MAX_ANSWER_BYTES, until))
        except (OSError, ValueError, RecursionError) as exc:
            problem = clip(f"{type(exc).__name__}: {exc}", 1_000)
            raise OutcomeUnknown(f"the runner gave no answer ({problem})") from exc
    if isinstance(answer, dict) and set(answer) == {"declined"}:
        print(f"bridge: runner declined: {clip(str(answer['declined']), 1_000)}", file=sys.stderr)
        return None
    if isinstance(answer, dict) and set(answer) == {"envelope", "exit_code"}:
        envelope, exit_code = answer["envelope"], answer["exit_code"]
        if is_result_envelope(envelope) and type(exit_code) is int and exit_code in (0, 1):
            return envelope, exit_code
    raise OutcomeUnknown("the runner's answer is malformed")


def launch_runner(state: KernelState, pid: int) -> subprocess.Popen:
    """Start a detached runner for kernel `pid`; its output goes to the runner log only."""
    command = [
        sys.executable, os.path.abspath(__file__), "serve",
        "--state-dir", str(state.dir), "--kernel-pid", str(pid),
    ]  # fmt: skip
    with open(state.runner_log_file, "ab") as log:
        return subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            close_fds=True,
        )


def spawn_runner(state: KernelState, pid: int) -> None:
    """Start a runner for later runs without waiting for it, unless one is running (perhaps
    still starting) or the kernel is gone; never fails."""
    runner = read_pid_file(state.runner_pid_file)
    if (runner is not None and process_is_runner(runner)) or not process_is_kernel(pid):
        return
    try:
        launch_runner(state, pid)
    except Exception as exc:  # the run at hand does not depend on it
        print(f"bridge: could not start a runner: {failure_message(exc)}", file=sys.stderr)


def stop_runner(state: KernelState) -> None:
    """Kill the runner recorded in the state dir, if it runs, and wait (briefly) until it is gone,
    so that its lock is free for the next one."""
    pid = read_pid_file(state.runner_pid_file)
    if pid is None or pid == os.getpid() or not process_is_runner(pid):
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, signal.SIGKILL)
    until = time.monotonic() + 2.0
    # A killed runner shows as a zombie once its main thread is gone, while its other threads
    # (the kernel client's) may still hold its files: until they are gone its socket still takes
    # a connection, which it then resets, and a run sent there would get no answer.
    while (process_is_runner(pid) or runner_listens(state)) and time.monotonic() < until:
        time.sleep(0.01)


def runner_listens(state: KernelState) -> bool:
    """Whether the runner socket takes a connection (closed at once, nothing sent)."""
    sock = open_runner(state, RUNNER_PING_WAIT_S)
    if sock is None:
        return False
    sock.close()
    return True


def ensure_runner(state: KernelState, pid: int, until: float) -> str:
    """Make sure a runner serves kernel `pid`, (re)starting it when none answers; waits until
    `until` for a new one. Returns "" when one answers, else a note for the kernel message (runs
    then connect to the kernel themselves)."""
    if ping_runner(state) == pid:
        return ""
    stop_runner(state)  # it runs but does not answer, or serves another kernel
    try:
        process = launch_runner(state, pid)
    except Exception as exc:
        return f"; no runner ({failure_message(exc)}), runs connect directly"
    while True:
        exited = process.poll() is not None
        if ping_runner(state) == pid:
            return ""
        if exited or time.monotonic() >= until:
            return "; the runner did not answer (see runner.log), runs connect directly"
        time.sleep(0.02)


def parse_request(line: bytes) -> dict:
    """A well-formed runner request, or ValueError saying what is wrong with it."""
    try:
        request = json.loads(line)
    except (ValueError, RecursionError) as exc:
        raise ValueError(f"not JSON ({type(exc).__name__})") from None
    if not isinstance(request, dict):
        raise ValueError("not a JSON object")
    if request == {"op": "ping"}:
        return request
    if request.get("op") == "exec":
        return parse_exec_request(request)
    if request.get("op") == "set-env":
        return parse_set_env_request(request)
    fields = {"op", "code", "timeout", "kernel_pid"}
    if request.get("op") != "run" or set(request) - {"attempt"} != fields:
        raise ValueError("expected a ping, exec or run request")
    attempt = request.get("attempt")
    if attempt is not None and not (
        isinstance(attempt, str) and ATTEMPT_PATTERN.fullmatch(attempt)
    ):
        raise ValueError("attempt must be 16 to 64 lowercase hex digits")
    code, timeout, pid = request["code"], request["timeout"], request["kernel_pid"]
    if not (isinstance(code, str) and os.path.isabs(code) and "\0" not in code):
        raise ValueError("code must be an absolute path")
    if type(timeout) not in (int, float) or not 0 < timeout < 86_400:
        raise ValueError("timeout must be a number of seconds in (0, 86400)")
    if type(pid) is not int or pid <= 0:
        raise ValueError("kernel_pid must be a positive integer")
    return request


def parse_set_env_request(request: dict) -> dict:
    """The run client's `set-env` request (briq_run.py): the variables follow once the runner
    is ready."""
    if set(request) != {"op", "deadline", "nonce"}:
        raise ValueError("a set-env request has exactly op, deadline and nonce")
    deadline, nonce = request["deadline"], request["nonce"]
    if type(deadline) not in (int, float) or not 0 < deadline < 86_400:
        raise ValueError("deadline must be a number of seconds in (0, 86400)")
    if not (isinstance(nonce, str) and NONCE_PATTERN.fullmatch(nonce)):
        raise ValueError("nonce must be [A-Za-z0-9]{16,64}")
    return request


def parse_exec_request(request: dict) -> dict:
    """The run client's request (briq_run.py): the code follows once the runner is ready."""
    if set(request) != {"op", "attempt", "timeout", "nonce"}:
        raise ValueError("an exec request has exactly op, attempt, timeout and nonce")
    attempt, timeout, nonce = request["attempt"], request["timeout"], request["nonce"]
    if not (isinstance(attempt, str) and ATTEMPT_PATTERN.fullmatch(attempt)):
        raise ValueError("attempt must be 16 to 64 lowercase hex digits")
    if type(timeout) not in (int, float) or not 0 < timeout < 86_400:
        raise ValueError("timeout must be a number of seconds in (0, 86400)")
    if not (isinstance(nonce, str) and NONCE_PATTERN.fullmatch(nonce)):
        raise ValueError("nonce must be [A-Za-z0-9]{16,64}")
    return request


def peer_uid(conn: socket.socket) -> int | None:
    """The uid of the process at the other end of a Unix socket, when the platform says."""
    option = getattr(socket, "SO_PEERCRED", None)
    if option is None:
        return None
    try:
        credentials = conn.getsockopt(socket.SOL_SOCKET, option, struct.calcsize("3i"))
    except OSError:
        return None
    return struct.unpack("3i", credentials)[1]


def peer_hung_up(conn: socket.socket) -> bool:
    """Whether the client closed its end (it gave up waiting) before we started its request."""
    try:
        readable, _, _ = select.select([conn], [], [], 0)
        return bool(readable) and conn.recv(1, socket.MSG_PEEK) == b""
    except OSError:
        return True


def receive_after_ready(conn: socket.socket, limit: int, what: str) -> bytes:
    """Say `ready` to the run client, then read what it sends: a decimal length line (at most
    `limit`) and that many bytes. Raises OSError or ValueError when it does not come whole."""
    conn.settimeout(RUNNER_REQUEST_WAIT_S)
    conn.sendall(b"ready\n")
    with conn.makefile("rb") as reader:
        size = int(reader.readline(32))
        if not 0 <= size <= limit:
            raise ValueError(f"{size} bytes of {what}")
        payload = reader.read(size)
    if len(payload) != size:
        raise ConnectionError(f"the {what} ended {size - len(payload)} bytes short")
    return payload


class Runner:
    """Serves the requests for kernel `pid` on `listener`, one connection at a time, over one
    kernel client that stays connected (shell and iopub)."""

    def __init__(
        self, state: KernelState, pid: int, client: Any, listener: socket.socket, inode: int
    ) -> None:
        self.state = state
        self.pid = pid
        self.client = client
        self.listener = listener
        self.inode = inode

    def why_stop(self) -> str | None:
        if self.state.live_pid() != self.pid:
            return f"kernel {self.pid} is gone or was replaced"
        try:
            inode = os.stat(self.state.runner_socket).st_ino
        except OSError:
            return "the socket file is gone"
        return "the socket file was replaced" if inode != self.inode else None

    def serve(self) -> str:
        """Answer connections until the runner is not wanted any more; returns why."""
        while True:
            reason = self.why_stop()
            if reason is not None:
                return reason
            readable, _, _ = select.select([self.listener], [], [], RUNNER_CHECK_INTERVAL_S)
            if not readable:
                continue
            try:
                conn, _ = self.listener.accept()
            except OSError:
                continue
            with conn:
                reason = self.handle(conn)
            if reason is not None:
                return reason

    def reply(self, conn: socket.socket, message: dict) -> None:
        with contextlib.suppress(OSError):  # the client is gone: nobody to tell
            send_line(conn, message, RUNNER_REQUEST_WAIT_S)

    def handle(self, conn: socket.socket) -> str | None:
        """Answer one connection; returns a reason to stop when the kernel client may be broken."""
        uid = peer_uid(conn)
        if uid is not None and uid != os.getuid():
            return None  # the socket is 0600; whoever got in anyway gets nothing
        try:
            until = time.monotonic() + RUNNER_REQUEST_WAIT_S
            request = parse_request(read_line(conn, RUNNER_MAX_REQUEST_BYTES, until))
        except (OSError, ValueError) as exc:
            message = f"bridge error: the runner refused the request: {clip(str(exc), 1_000)}"
            self.reply(conn, {"envelope": bridge_failure("result", message), "exit_code": 1})
            return None
        if request["op"] == "ping":
            self.reply(conn, {"kernel_pid": self.pid})
            return None
        if request["op"] == "exec":
            return self.serve_exec(conn, request)
        if request["op"] == "set-env":
            return self.serve_set_env(conn, request)
        if request["kernel_pid"] != self.pid:
            declined = f"this runner serves kernel {self.pid}, not {request['kernel_pid']}"
            self.reply(conn, {"declined": declined})
            return None
        if peer_hung_up(conn):
            # It waited in the backlog until its client gave up and reported an unknown outcome;
            # running it now would be a surprise to everyone.
            runner_log("a client hung up before its request started; not running it")
            return None
        stop = None
        try:
            code = Path(request["code"]).read_text(encoding="utf-8")
        except Exception as exc:
            envelope, exit_code = bridge_failure("result", failure_message(exc)), 1
        else:
            envelope, exit_code, stop = self.execute(
                code, request["timeout"], request.get("attempt")
            )
        if request.get("attempt") is not None:
            envelope, exit_code = Journal().finish(request["attempt"], envelope, exit_code)
        self.reply(conn, {"envelope": envelope, "exit_code": exit_code})
        return stop

    def execute(
        self, code: str, timeout: float, attempt: str | None = None
    ) -> tuple[dict, int, str | None]:
        """Run `code` (as the accepted `attempt`, when given) over the runner's kernel client: the
        envelope, the exit code and, when the client may be broken, the reason to stop serving."""
        try:
            deadline = time.monotonic() + timeout
            # Its iopub subscription was proven live when it started, and a kernel that stopped
            # answering since is caught by the execution itself (its pid, then its deadline).
            envelope = execute_action(self.client, self.pid, code, deadline, timeout, True, attempt)
            return envelope, 0, None
        except Exception as exc:
            stop = f"kernel client failed: {failure_message(exc)}"
            return bridge_failure("result", failure_message(exc)), 1, stop

    def serve_set_env(self, conn: socket.socket, request: dict) -> str | None:
        """The run client's `set-env` (briq_run.py): `ready` (or `declined`), then the variables
        as a length line and their bytes, then `answer EXIT SIZE` and the SIZE bytes the client
        prints: what `bridge.py set-env` would have printed, over the runner's kernel client
        (connected already, where the bridge would import jupyter_client and connect anew)."""
        if self.state.live_pid() != self.pid:
            with contextlib.suppress(OSError):
                conn.sendall(f"declined: kernel {self.pid} is not the live kernel\n".encode())
            return f"kernel {self.pid} is gone or was replaced"
        try:
            raw = receive_after_ready(conn, ENV_MAX_BYTES + 1, "environment")
        except (OSError, ValueError) as exc:
            runner_log(f"set-env: no environment ({clip(str(exc), 200)}); nothing changed")
            return None
        stop = None
        env = parse_claim_env(raw)
        if isinstance(env, str):
            envelope, exit_code = env_envelope(False, env), 1
        else:
            try:
                write_claim_env(self.state, env)
                deadline = time.monotonic() + request["deadline"]
                envelope, exit_code = set_env_in_kernel(
                    self.client, self.pid, env, deadline, request["deadline"]
                )
            except Exception as exc:
                envelope = env_envelope(False, f"bridge error: {failure_message(exc)}")
                exit_code, stop = 1, f"kernel client failed: {failure_message(exc)}"
            if exit_code == 0:
                envelope["message"] += " (through its runner)"
        text, exit_code = stdout_text(request["nonce"], "env", envelope, exit_code)
        data = text.encode("ascii")
        with contextlib.suppress(OSError):  # the client is gone: the variables are kept anyway
            conn.sendall(b"answer %d %d\n" % (exit_code, len(data)) + data)
        return stop

    def serve_exec(self, conn: socket.socket, request: dict) -> str | None:
        """The run client's action (briq_run.py): `ready` (or `declined`), then the code as a
        length line and its bytes, then `answer EXIT SIZE` and the SIZE bytes the client prints.
        Nothing runs before the whole code has come; an attempt runs at most once."""
        if self.state.live_pid() != self.pid:
            with contextlib.suppress(OSError):
                conn.sendall(f"declined: kernel {self.pid} is not the live kernel\n".encode())
            return f"kernel {self.pid} is gone or was replaced"
        attempt = request["attempt"]
        try:
            code = receive_after_ready(conn, RUNNER_MAX_CODE_BYTES, "code")
        except (OSError, ValueError) as exc:
            # The client gave up or broke: it reports that nothing ran, and nothing did.
            runner_log(f"attempt {attempt}: no code ({clip(str(exc), 200)}); nothing ran")
            return None
        stop = None

        def run() -> tuple[dict, int]:
            nonlocal stop
            try:
                source = code.decode("utf-8")
            except UnicodeDecodeError as exc:
                return bridge_failure("result", f"bridge error: the code is not UTF-8: {exc}"), 1
            envelope, exit_code, stop = self.execute(source, request["timeout"], attempt)
            return envelope, exit_code

        try:
            envelope, exit_code = at_most_once(attempt, request["timeout"], run, prune=False)
        except OutcomeUnknown as exc:
            runner_log(f"{exc}; no answer")
            return stop
        text, exit_code = stdout_text(request["nonce"], "result", envelope, exit_code)
        data = text.encode("ascii")
        with contextlib.suppress(OSError):  # the client is gone: the journal keeps the result
            conn.sendall(b"answer %d %d\n" % (exit_code, len(data)) + data)
        # Off the action's path: the client has its answer and the connection is closed.
        conn.close()
        Journal().prune(time.time())
        return stop


def acquire_runner_lock(state: KernelState) -> Any:
    """The open runner lock file, locked; None when another runner keeps it locked for
    RUNNER_LOCK_WAIT_S. Held for the runner's life, so at most one runner serves a state dir."""
    import fcntl

    handle = open(state.runner_lock_file, "a")  # held (locked) until the runner exits
    until = time.monotonic() + RUNNER_LOCK_WAIT_S
    while True:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return handle
        except BlockingIOError:
            if time.monotonic() >= until:
                handle.close()
                return None
            time.sleep(0.05)


def bind_runner_socket(state: KernelState) -> tuple[socket.socket, int]:
    """Listen on the runner socket (mode 0600), atomically replacing a stale socket file; returns
    the listener and the inode of its file."""
    # Bind by a short name relative to the state dir (AF_UNIX addresses are short), then go
    # back: the journal and the results directory are relative to the sandbox's working dir.
    workdir = os.getcwd()
    name = f".runner.{os.getpid()}.sock"
    temporary = state.dir / name
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        os.chdir(state.dir)
        try:
            umask = os.umask(0o177)  # the file is created 0600: only our user may connect
            try:
                listener.bind(name)
            finally:
                os.umask(umask)
        finally:
            os.chdir(workdir)
        listener.listen(8)
        os.replace(temporary, state.runner_socket)
        inode = os.stat(state.runner_socket).st_ino
    except BaseException:
        listener.close()
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
    return listener, inode


def serve_kernel(state: KernelState, pid: int) -> str:
    """Connect to kernel `pid`, then serve requests until not wanted; returns why it stopped."""
    if state.live_pid() != pid:
        return f"kernel {pid} is not the live kernel in {state.dir}"
    client = connect(state, shell=True, iopub=True)
    try:
        if not await_iopub(client, pid, time.monotonic() + ANSWER_WAIT_S):
            return f"kernel {pid} did not answer within {ANSWER_WAIT_S:g} s"
        listener, inode = bind_runner_socket(state)
        try:
            runner_log(f"serving kernel {pid} on {state.runner_socket}")
            return Runner(state, pid, client, listener, inode).serve()
        finally:
            listener.close()
            with contextlib.suppress(OSError):
                if os.stat(state.runner_socket).st_ino == inode:
                    state.runner_socket.unlink()
    finally:
        client.stop_channels()


def cmd_serve(args: argparse.Namespace) -> int:
    """The runner of kernel `args.kernel_pid` (internal: start-kernel and run start it)."""
    state = KernelState(args.state_dir)
    lock = acquire_runner_lock(state)
    if lock is None:
        runner_log("another runner holds the lock; leaving")
        return 0
    with lock:
        write_pid_file(state.runner_pid_file, os.getpid())
        try:
            reason = serve_kernel(state, args.kernel_pid)
        finally:
            if read_pid_file(state.runner_pid_file) == os.getpid():
                state.runner_pid_file.unlink(missing_ok=True)
    runner_log(f"exiting: {reason}")
    return 0


# --------------------------------------------------------------------------------------------
# Files in and out of the sandbox (file-write / file-read; PROTOCOL.md "Files")
# --------------------------------------------------------------------------------------------
# The bridge runs as root, user code as KERNEL_UID and hostile: every file operation on a path
# the operator was given happens in a forked child that drops to KERNEL_UID (no supplementary
# groups) before it resolves or opens anything, so the kernel user's permissions decide what it
# may read or write, and a symlink or rename by user code can lead it only where the kernel user
# could go anyway. The child also refuses the bridge's own directory and file by path, checked
# on the resolved path and again on the path of what it actually opened (/proc/self/fd), which
# covers the files a bridge that is not root shares with user code.


class FileProblem(Exception):
    """Why a file command answers ok false; `code` is the envelope's error code."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


def file_error(code: str, message: str) -> dict:
    return {"code": code, "message": clip(message, 1_000)}


def os_problem(exc: OSError, what: str) -> FileProblem:
    """The FileProblem for an OSError of `what` (a path)."""
    import errno

    if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        code = "permission"
    elif exc.errno in (errno.ENOENT, errno.ENOTDIR):
        code = "not_found"
    elif exc.errno == errno.EISDIR:
        code = "is_directory"
    elif exc.errno == errno.ELOOP:  # a symlink where O_NOFOLLOW allows none: it was swapped in
        code = "refused"
    else:
        code = "failed"
    return FileProblem(code, f"{what}: {exc.strerror or exc}")


def path_problem(path: str) -> str | None:
    """Why the text of `path` is refused, or None."""
    if "\0" in path:
        return "the path contains NUL"
    if not path.startswith("/"):
        return "the path is not absolute"
    if ".." in path.split("/"):
        return "the path contains '..'"
    return None


def protected_paths() -> tuple[str, str]:
    """The bridge's directory and its own file, resolved (as root, before any fork)."""
    return os.path.realpath(BRIQ_DIR), os.path.realpath(__file__)


def is_protected(path: str, protected: tuple[str, str]) -> bool:
    briq, own = protected
    return path in (briq, own) or path.startswith(briq.rstrip("/") + "/")


def opened_path(fd: int, fallback: str) -> str:
    """Where the kernel says `fd` is (race-free, unlike the name it was opened by)."""
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return fallback


def refuse_protected(path: str, protected: tuple[str, str], given: str) -> None:
    if is_protected(path, protected):
        raise FileProblem("refused", f"{given} is the bridge's own ({path})")


def become_kernel_user() -> None:
    """Drop to KERNEL_UID/KERNEL_GID for good (a forked child only). The process is then not
    dumpable (it changed its uids), so the kernel user cannot trace it or read its memory."""
    os.setgroups([])
    os.setresgid(KERNEL_GID, KERNEL_GID, KERNEL_GID)
    os.setresuid(KERNEL_UID, KERNEL_UID, KERNEL_UID)


def child_deadline(signum: int, frame: Any) -> None:
    raise FileProblem("timeout", "the deadline passed")


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def drain_pipe(fd: int, sink: Callable[[bytes], None], until: float) -> bool:
    """Hand what the child writes to `fd` to `sink` until it closes it (True), or until `until`
    passes first (False)."""
    while True:
        remaining = until - time.monotonic()
        if remaining <= 0 or not select.select([fd], [], [], remaining)[0]:
            return False
        chunk = os.read(fd, FILE_CHUNK)
        if not chunk:
            return True
        sink(chunk)


def read_answer(fd: int, until: float, limit: int) -> bytes | None:
    """What the child writes to `fd` until it closes it; None when `until` passes first."""
    chunks: list[bytes] = []
    total = 0

    def keep(chunk: bytes) -> None:
        nonlocal total
        total += len(chunk)
        if total > limit:
            raise FileProblem("failed", "the file child's answer is too large")
        chunks.append(chunk)

    return b"".join(chunks) if drain_pipe(fd, keep, until) else None


def feed_pipe(fd: int, chunks: Iterator[bytes], until: float) -> None:
    """Write `chunks` to the non-blocking pipe `fd` by `until` (FileProblem timeout)."""
    os.set_blocking(fd, False)
    for chunk in chunks:
        view = memoryview(chunk)
        while view:
            remaining = until - time.monotonic()
            if remaining <= 0 or not select.select([], [fd], [], remaining)[1]:
                raise FileProblem("timeout", "the deadline passed")
            try:
                view = view[os.write(fd, view) :]
            except BlockingIOError:
                continue


def in_file_child(
    work: Callable[[int | None], dict],
    until: float,
    feed: Iterator[bytes] | None = None,
    answer_limit: int = FILE_CHUNK,
    sink: Callable[[bytes], None] | None = None,
) -> dict:
    """Run `work` in a forked child, as KERNEL_UID when users are split, and return what it
    answers (a dict, or {"error": ...}). With `feed`, the child reads those bytes from the fd
    `work` gets; with `sink`, what the child writes to that fd goes to `sink` as it comes (a
    FileProblem that `sink` raises stops the child). The child stops itself at `until`; it is
    killed FILE_KILL_GRACE_S later."""
    answer_r, answer_w = os.pipe()
    data_r, data_w = os.pipe() if feed is not None or sink is not None else (None, None)
    # The child's end of the data pipe and ours: it reads a feed, and writes for a sink.
    theirs, ours = (data_w, data_r) if sink is not None else (data_r, data_w)
    pid = os.fork()
    if pid == 0:  # the child: never returns
        status = 1
        try:
            os.close(answer_r)
            if ours is not None:
                os.close(ours)
            null = os.open(os.devnull, os.O_RDWR)
            os.dup2(null, 0)
            os.dup2(null, 1)  # never the bridge's stdout
            signal.signal(signal.SIGALRM, child_deadline)
            signal.setitimer(signal.ITIMER_REAL, max(until - time.monotonic(), 0.001))
            try:
                if split_users():
                    become_kernel_user()
                answer = work(theirs)
            except FileProblem as exc:
                answer = {"error": file_error(exc.code, str(exc))}
            except OSError as exc:
                answer = {"error": file_error("failed", f"{type(exc).__name__}: {exc}")}
            signal.setitimer(signal.ITIMER_REAL, 0)
            write_all(answer_w, json.dumps(answer).encode("utf-8"))
            status = 0
        finally:
            os._exit(status)
    os.close(answer_w)
    if theirs is not None:
        os.close(theirs)
    reaped = False
    try:
        # A feed that fails (the deadline) ends the child's input early: it then writes nothing.
        feed_problem = None
        if feed is not None and ours is not None:
            try:
                feed_pipe(ours, feed, until)
            except BrokenPipeError:
                pass  # the child stopped reading: its answer says why
            except FileProblem as exc:
                feed_problem = exc
            finally:
                os.close(ours)
        elif sink is not None and ours is not None:
            # The child's own alarm ends its output at the deadline, and then it answers why.
            try:
                if not drain_pipe(ours, sink, until + FILE_KILL_GRACE_S):
                    raise FileProblem("timeout", "the deadline passed")
            finally:
                os.close(ours)
        raw = read_answer(answer_r, until + FILE_KILL_GRACE_S, answer_limit)
        if raw is not None:
            os.waitpid(pid, 0)
            reaped = True
        if feed_problem is not None:
            raise feed_problem
        if raw is None:
            raise FileProblem("timeout", "the deadline passed")
    finally:
        os.close(answer_r)
        if not reaped:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(OSError):
                os.waitpid(pid, 0)
    try:
        answer = json.loads(raw)
    except ValueError:
        answer = None
    if not isinstance(answer, dict):
        raise FileProblem("failed", "the file child ended without an answer")
    return answer


# A new file, made in the directory it is renamed into later: never an existing one, never
# through a symlink.
NEW_FILE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def temporary_name(name: str) -> str:
    """A fresh temporary name beside `name`, in the directory `name` is renamed into."""
    import secrets

    return f".{name[:100]}.{secrets.token_hex(8)}.briq-tmp"


def install_file(
    dest: str, size: int, sha256: str, protected: tuple[str, str], data_fd: int | None
) -> dict:
    """In the file child: write what `data_fd` holds to `dest` whole (a temporary file in its
    directory, fsync, rename), once it is exactly `size` bytes with digest `sha256`."""
    import hashlib

    real = os.path.realpath(dest)
    refuse_protected(real, protected, dest)
    parent, name = os.path.split(real)
    if not name:
        raise FileProblem("is_directory", f"{dest} is a directory")
    try:
        os.makedirs(parent, exist_ok=True)
    except OSError as exc:
        problem = os_problem(exc, f"cannot create the directory {parent}")
        if problem.code != "permission":
            problem.code = "not_found"
        raise problem from None
    try:
        dir_fd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise os_problem(exc, parent) from None
    try:
        # Where the directory really is now, whatever was renamed or linked since realpath.
        where = opened_path(dir_fd, parent)
        refuse_protected(where, protected, dest)
        refuse_protected(os.path.join(where, name), protected, dest)
        try:
            old = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            old = None
        if old is not None and stat.S_ISDIR(old.st_mode):
            raise FileProblem("is_directory", f"{dest} is a directory")
        tmp = temporary_name(name)
        try:
            fd = os.open(tmp, NEW_FILE_FLAGS, 0o666, dir_fd=dir_fd)
        except OSError as exc:
            raise os_problem(exc, f"cannot create a file in {where}") from None
        renamed = False
        try:
            digest = hashlib.sha256()
            count = 0
            with os.fdopen(fd, "wb") as handle:
                while count <= size and (chunk := os.read(data_fd, FILE_CHUNK)):
                    digest.update(chunk)
                    count += len(chunk)
                    handle.write(chunk)
                if old is not None and stat.S_ISREG(old.st_mode):
                    os.fchmod(handle.fileno(), stat.S_IMODE(old.st_mode))
                handle.flush()
                os.fsync(handle.fileno())
            if count != size or digest.hexdigest() != sha256:
                raise FileProblem("mismatch", "the bytes received are not the staged file")
            try:
                os.rename(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
            except OSError as exc:
                raise os_problem(exc, dest) from None
            renamed = True
        finally:
            if not renamed:
                with contextlib.suppress(OSError):
                    os.unlink(tmp, dir_fd=dir_fd)
        with contextlib.suppress(OSError):
            os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    return {"size": count, "sha256": digest.hexdigest()}


def read_file_range(
    path: str,
    offset: int,
    length: int,
    max_size: int | None,
    protected: tuple[str, str],
    _: int | None,
) -> dict:
    """In the file child: bytes [offset, offset+length) of `path`, its size, and its digest
    when offset is 0 (then size is what was hashed)."""
    import base64
    import hashlib

    real = os.path.realpath(path)
    refuse_protected(real, protected, path)
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC  # no FIFO blocks us
    try:
        fd = os.open(real, flags)
    except OSError as exc:
        raise os_problem(exc, path) from None
    try:
        refuse_protected(opened_path(fd, real), protected, path)
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise FileProblem("is_directory", f"{path} is a directory")
        if not stat.S_ISREG(st.st_mode):
            raise FileProblem("refused", f"{path} is not a regular file")
        if max_size is not None and st.st_size > max_size:
            raise FileProblem("too_large", f"{path} has {st.st_size} bytes, over {max_size}")
        data = bytearray()
        digest = hashlib.sha256() if offset == 0 else None
        position = offset
        size = st.st_size
        while digest is not None or len(data) < length:
            chunk = os.pread(fd, FILE_CHUNK, position)
            if not chunk:
                break
            if len(data) < length:
                data += chunk[: length - len(data)]
            if digest is not None:
                digest.update(chunk)
            position += len(chunk)
        if digest is not None:
            size = position
    finally:
        os.close(fd)
    return {
        "size": size,
        "sha256": digest.hexdigest() if digest is not None else None,
        "data_base64": base64.b64encode(bytes(data)).decode("ascii"),
    }


def staged_part_chunks(directory: Path, parts: int) -> Iterator[bytes]:
    """The staged parts' bytes in order (as root: the staging directory is root-only). Raises
    FileProblem mismatch for a missing part or one that is not a regular file."""
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        dir_fd = os.open(directory, flags)
    except OSError as exc:
        raise FileProblem("mismatch", f"no staged parts in {directory}: {exc.strerror}") from None
    try:
        st = os.fstat(dir_fd)
        if st.st_uid != os.geteuid():
            raise FileProblem("refused", f"{directory} is not the bridge's")
        for index in range(parts):
            name = f"part-{index:05d}"
            try:
                fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dir_fd)
            except OSError as exc:
                raise FileProblem("mismatch", f"{directory}/{name}: {exc.strerror}") from None
            with os.fdopen(fd, "rb") as handle:
                if not stat.S_ISREG(os.fstat(fd).st_mode):
                    raise FileProblem("mismatch", f"{directory}/{name} is not a regular file")
                while chunk := handle.read(FILE_CHUNK):
                    yield chunk
    finally:
        os.close(dir_fd)


def remove_staged(directory: Path) -> None:
    with contextlib.suppress(OSError):
        st = os.lstat(directory)
        if stat.S_ISDIR(st.st_mode):
            import shutil

            shutil.rmtree(directory, ignore_errors=True)  # fd-based: follows no symlink
        else:
            os.unlink(directory)


def prune_stale(
    directory: str, keep: str, now: float, leftover: Callable[[str], bool] | None = None
) -> None:
    """Remove what an operator left behind in `directory` (untouched for STAGED_MAX_AGE_S), and
    whatever `leftover` says was left by a command that died, but never `keep`."""
    with contextlib.suppress(OSError):
        for entry in os.scandir(directory):
            if entry.name == keep:
                continue
            with contextlib.suppress(OSError):
                if (leftover is not None and leftover(entry.name)) or (
                    now - entry.stat(follow_symlinks=False).st_mtime > STAGED_MAX_AGE_S
                ):
                    remove_staged(Path(entry.path))


def prepare_uploads(staged: Path) -> None:
    """The uploads directory as the bridge's, without what earlier operators left there."""
    bridge_dir(UPLOADS_DIR)
    prune_stale(UPLOADS_DIR, staged.name, time.time())


def staged_digest(staged: Path, parts: int, until: float) -> tuple[int, str]:
    """The size and SHA-256 of the staged parts joined in order."""
    import hashlib

    digest = hashlib.sha256()
    size = 0
    for chunk in staged_part_chunks(staged, parts):
        digest.update(chunk)
        size += len(chunk)
        if time.monotonic() > until:
            raise FileProblem("timeout", "the deadline passed")
    return size, digest.hexdigest()


def staged_command(
    args: argparse.Namespace,
    refused: Callable[[str], dict],
    body: Callable[[argparse.Namespace, Path, float], dict],
) -> tuple[dict, int]:
    """Run `body` on the operator's staging directory `--staged`, which is removed afterwards
    whatever happened; any other --staged is `refused` and left alone."""
    if not UPLOAD_PATTERN.fullmatch(args.staged):
        return refused(f"--staged must be {UPLOADS_DIR}/<16 to 64 lowercase hex digits>"), 1
    staged = Path(args.staged)
    try:
        envelope = body(args, staged, time.monotonic() + args.deadline)
    finally:
        remove_staged(staged)
    return envelope, 0 if envelope["ok"] else 1


def cmd_file_write(args: argparse.Namespace) -> tuple[dict, int]:
    def refused(problem: str) -> dict:
        return file_envelope(args.dest, error=file_error("refused", problem))

    return staged_command(args, refused, file_write)


def file_write(args: argparse.Namespace, staged: Path, until: float) -> dict:
    dest = args.dest
    problem = path_problem(dest)
    if problem is not None:
        return file_envelope(dest, error=file_error("refused", problem))
    prepare_uploads(staged)
    try:
        size, digest = staged_digest(staged, args.parts, until)
        if size != args.size or digest != args.sha256:
            return file_envelope(
                dest,
                size=size,
                sha256=digest,
                error=file_error("mismatch", staged_mismatch(args)),
            )
        work = functools.partial(install_file, dest, size, args.sha256, protected_paths())
        answer = in_file_child(work, until, staged_part_chunks(staged, args.parts))
    except FileProblem as exc:
        return file_envelope(dest, error=file_error(exc.code, str(exc)))
    if answer.get("error") is not None:
        return file_envelope(dest, error=answer["error"])
    return file_envelope(dest, size=answer["size"], sha256=answer["sha256"])


def staged_mismatch(args: argparse.Namespace) -> str:
    return f"the {args.parts} staged parts are not {args.size} bytes with that SHA-256"


def cmd_file_read(args: argparse.Namespace) -> tuple[dict, int]:
    path, offset = args.path, args.offset
    problem = path_problem(path)
    if problem is None and args.length > FILE_READ_MAX:
        problem = f"--length is at most {FILE_READ_MAX}"
    if problem is not None:
        return file_envelope(path, offset=offset, error=file_error("refused", problem)), 1
    work = functools.partial(
        read_file_range, path, offset, args.length, args.max_size, protected_paths()
    )
    until = time.monotonic() + args.deadline
    try:
        answer = in_file_child(work, until, answer_limit=2 * FILE_READ_MAX)
    except FileProblem as exc:
        answer = {"error": file_error(exc.code, str(exc))}
    if answer.get("error") is not None:
        return file_envelope(path, offset=offset, error=answer["error"]), 1
    envelope = file_envelope(
        path,
        size=answer["size"],
        sha256=answer["sha256"],
        offset=offset,
        data_base64=answer["data_base64"],
    )
    return envelope, 0


# --------------------------------------------------------------------------------------------
# Forks
# --------------------------------------------------------------------------------------------

# A directory opened by fd to walk or list it, never through a symlink.
DIRECTORY_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def fork_failure(code: str, message: str) -> dict:
    error = file_error(code, message)
    return fork_envelope(error["message"], error=error)


def child_failure(answer: dict) -> dict | None:
    """The failure envelope for a file child's answer that is an error, or None."""
    error = answer.get("error")
    return None if error is None else fork_envelope(error["message"], error=error)


# IPython's own directory (its history database, open in the source's kernel): a fork's kernel
# starts its own, and a copy of a database another process had open is not one it can write.
KERNEL_OWN_DIR = ".ipython"


def fork_top() -> tuple[Path, str | None]:
    """The directory a fork copies (the kernel user's) and the name left out at its top: the
    bridge's own directory, when the kernel user's is /work itself."""
    return kernel_home(), None if split_users() else BRIQ_DIR


def link_leaves(parts: list[str], target: str) -> bool:
    """Whether a symlink at `parts` (its path's components under the top) to `target` is
    absolute or leads out of the top, read as text (what tarfile's data filter refuses)."""
    if not target or "\0" in target or target.startswith("/"):
        return True
    depth = len(parts) - 1
    for part in target.split("/"):
        if part == "..":
            depth -= 1
            if depth < 0:
                return True
        elif part not in ("", "."):
            depth += 1
    return False


@contextlib.contextmanager
def forks_locked(until: float) -> Iterator[None]:
    """Hold FORKS_DIR's lock: one fork-save at a time, so any temporary found is a leftover and a
    retried snapshot waits for the first to be complete."""
    import fcntl

    fd = os.open(FORKS_DIR, DIRECTORY_FLAGS)
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= until:
                    raise FileProblem("timeout", "another fork-save held the lock") from None
                time.sleep(JOURNAL_POLL_S)
        yield
    finally:
        os.close(fd)


class ForkParts:
    """The tar as the pack child writes it, cut into FORK_PART_BYTES files part-NNNNN in
    `directory` (the bridge's own), counted and hashed; over `limit` bytes it stops the pack."""

    def __init__(self, directory: Path, limit: int) -> None:
        import hashlib

        self.directory = directory
        self.limit = limit
        self.digest = hashlib.sha256()
        self.size = 0
        self.parts = 0
        self.handle: Any = None
        self.room = 0

    def write(self, chunk: bytes) -> None:
        self.size += len(chunk)
        if self.size > self.limit:
            raise FileProblem("too_large", f"the directory packs to over {self.limit} bytes")
        self.digest.update(chunk)
        view = memoryview(chunk)
        while view:
            if not self.room:
                self.close()
                self.handle = open_new(self.directory / f"part-{self.parts:05d}")
                self.parts += 1
                self.room = FORK_PART_BYTES
            taken = view[: self.room]
            self.handle.write(taken)
            self.room -= len(taken)
            view = view[len(taken) :]

    def close(self) -> None:
        if self.handle is not None:
            self.handle.flush()
            os.fsync(self.handle.fileno())
            self.handle.close()
            self.handle = None


def open_new(path: Path) -> Any:
    """A new file of the bridge's for writing: root-only in root mode, else readable like any
    other upload (as spill makes it)."""
    return os.fdopen(os.open(path, NEW_FILE_FLAGS, 0o600 if split_users() else 0o644), "wb")


def tar_member(path: str, st: os.stat_result, kind: bytes, linkname: str = "") -> Any:
    import tarfile

    info = tarfile.TarInfo(path)
    info.type = kind
    info.mode = stat.S_IMODE(st.st_mode) & 0o777
    info.uid, info.gid = st.st_uid, st.st_gid
    info.mtime = int(st.st_mtime)
    info.size = st.st_size if kind == tarfile.REGTYPE else 0
    info.linkname = linkname
    return info


def listed(fd: int) -> list[str]:
    """The names in directory `fd`, last first (popped in name order)."""
    return sorted(os.listdir(fd), reverse=True)


def pack_entry(tar: Any, dir_fd: int, name: str, path: str, stack: list) -> Any:
    """Add `name` of directory `dir_fd` to `tar` as `path`, opened without following a symlink
    (a directory goes on `stack` to be walked); the member added, or None when it is of a kind
    a fork skips."""
    import tarfile

    st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    if stat.S_ISDIR(st.st_mode):
        fd = os.open(name, DIRECTORY_FLAGS, dir_fd=dir_fd)
        try:
            member = tar_member(path, os.fstat(fd), tarfile.DIRTYPE)
            tar.addfile(member)
            stack.append((fd, path + "/", listed(fd)))
        except BaseException:
            os.close(fd)
            raise
        return member
    if stat.S_ISLNK(st.st_mode):
        target = os.readlink(name, dir_fd=dir_fd)
        # fork-load refuses such a link (tarfile's data filter does): the rest is still a fork.
        if link_leaves(path.split("/"), target):
            return None
        member = tar_member(path, st, tarfile.SYMTYPE, target)
        tar.addfile(member)
        return member
    if not stat.S_ISREG(st.st_mode):
        return None
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC  # no FIFO blocks us
    with os.fdopen(os.open(name, flags, dir_fd=dir_fd), "rb") as handle:
        st = os.fstat(handle.fileno())
        if not stat.S_ISREG(st.st_mode):
            return None  # swapped for another kind since it was listed
        member = tar_member(path, st, tarfile.REGTYPE)
        tar.addfile(member, handle)
    return member


def pack_tree(top: str, leave_out: str | None, out_fd: int) -> dict:
    """In the file child: write the tree under `top` to `out_fd` as a PAX tar of its
    directories, regular files and symlinks (stored as links), in name order, leaving out the
    top's `leave_out` and KERNEL_OWN_DIR; other kinds are skipped and counted. `state_bytes` is
    the size of the saved namespace packed (0 without one)."""
    import tarfile

    files = skipped = state_bytes = 0
    stack: list[tuple[int, str, list[str]]] = []
    with os.fdopen(out_fd, "wb") as out:
        tar = tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT)
        try:
            try:
                stack.append((os.open(top, DIRECTORY_FLAGS), "", []))
                stack[0][2].extend(listed(stack[0][0]))
            except OSError as exc:
                raise os_problem(exc, top) from None
            while stack:
                dir_fd, prefix, names = stack[-1]
                if not names:
                    os.close(dir_fd)
                    stack.pop()
                    continue
                name = names.pop()
                path = prefix + name
                if not prefix and name in (leave_out, KERNEL_OWN_DIR):
                    continue
                try:
                    member = pack_entry(tar, dir_fd, name, path, stack)
                except FileNotFoundError:
                    continue  # removed since it was listed
                except OSError as exc:
                    raise os_problem(exc, os.path.join(top, path)) from None
                if member is None:
                    skipped += 1
                    continue
                files += 1
                if path == STATE_FILE and member.isreg():
                    state_bytes = member.size
        finally:
            for dir_fd, _, _ in stack:
                os.close(dir_fd)
        tar.close()
    return {"files": files, "skipped": skipped, "state_bytes": state_bytes}


def packed_manifest(directory: Path, snapshot: str) -> dict | None:
    """The manifest of a complete snapshot directory, or None."""
    try:
        fd = os.open(directory / FORK_MANIFEST, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        with os.fdopen(fd, "rb") as handle:
            manifest = json.loads(handle.read(FILE_READ_MAX))
    except (OSError, ValueError):
        return None
    if not isinstance(manifest, dict) or set(manifest) != FORK_MANIFEST_FIELDS:
        return None
    return manifest if manifest["snapshot"] == snapshot else None


def fork_message(manifest: dict, top: str) -> str:
    message = (
        f"packed {manifest['files']} entries of {top} into {FORKS_DIR}/{manifest['snapshot']} "
        f"({manifest['size']} bytes, parts: {manifest['parts']})"
    )
    if manifest["skipped"]:
        message += f"; skipped {manifest['skipped']} (not a directory, file or inner symlink)"
    return message


def cmd_fork_save(args: argparse.Namespace) -> tuple[dict, int]:
    if not SNAPSHOT_PATTERN.fullmatch(args.snapshot):
        return fork_failure("refused", "--snapshot must be 16 to 64 lowercase hex digits"), 1
    until = time.monotonic() + args.deadline
    bridge_dir(FORKS_DIR)
    try:
        with forks_locked(until):
            envelope = fork_save(args, until)
    except FileProblem as exc:
        envelope = fork_failure(exc.code, str(exc))
    return envelope, 0 if envelope["ok"] else 1


def fork_save(args: argparse.Namespace, until: float) -> dict:
    import tarfile  # noqa: F401 (imported before the fork, so the child has it loaded)
    import tempfile

    snapshot = args.snapshot
    done = Path(FORKS_DIR, snapshot)
    top, leave_out = fork_top()
    manifest = packed_manifest(done, snapshot)
    if manifest is not None:  # a retry: the snapshot stands as it was packed
        return fork_envelope(f"already {fork_message(manifest, str(top))}", **manifest)
    prune_stale(FORKS_DIR, snapshot, time.time(), leftover=lambda name: name.startswith("."))
    # With --saved the kernel is not asked (a suspended executor has none): the namespace saved
    # earlier is packed as it is, and its size is what the pack found.
    state = state_envelope(True, "")
    if not args.saved:
        left = max(until - time.monotonic(), 0.001)
        asked = argparse.Namespace(state_dir=args.state_dir, deadline=left)
        state, _ = state_command(asked, "save")
        if not state["ok"]:
            return fork_failure("state", state["message"])
    building = Path(tempfile.mkdtemp(dir=FORKS_DIR, prefix=f".{snapshot}.", suffix=".tmp"))
    try:
        if not split_users():
            os.chmod(building, 0o755)  # mkdtemp's 0700: readable like the parts, as spills are
        parts = ForkParts(building, args.max_bytes)
        work = functools.partial(pack_tree, str(top), leave_out)
        try:
            answer = in_file_child(work, until, sink=parts.write)
        finally:
            parts.close()
        failure = child_failure(answer)
        if failure is not None:
            return failure
        manifest = {
            "snapshot": snapshot,
            "parts": parts.parts,
            "size": parts.size,
            "sha256": parts.digest.hexdigest(),
            "files": answer["files"],
            "skipped": answer["skipped"],
            "saved": state["saved"],
            "unsaved": state["unsaved"],
            "state_bytes": answer["state_bytes"] if args.saved else state["bytes"],
        }
        with open_new(building / FORK_MANIFEST) as handle:
            handle.write(json.dumps(manifest).encode("utf-8"))
            handle.flush()
            os.fsync(handle.fileno())
        remove_staged(done)  # without a manifest it was never complete
        os.rename(building, done)
    finally:
        remove_staged(building)  # gone once renamed
    said = state["message"]
    if args.saved:
        found = manifest["state_bytes"]
        saved_file = f"the saved namespace ({found} bytes)" if found else "no saved namespace"
        said = f"the kernel was not asked (--saved): {saved_file} was there"
    message = clip(f"{fork_message(manifest, str(top))}; {said}", 4_000)
    return fork_envelope(message, **manifest)


def member_parts(member: Any, leave_out: str | None, seen: dict) -> list[str] | None:
    """The components of `member`'s path under the top (None for the top itself), after refusing
    what a fork never holds. `seen` maps the paths of earlier members to their kind."""
    import tarfile

    name = member.name
    kind = {
        tarfile.DIRTYPE: "directory",
        tarfile.REGTYPE: "file",
        tarfile.AREGTYPE: "file",
        tarfile.SYMTYPE: "symlink",
    }.get(member.type)
    parts = [part for part in name.split("/") if part not in ("", ".")]
    problem = None
    if "\0" in name or name.startswith("/"):
        problem = "is an absolute name"
    elif ".." in parts:
        problem = "has a '..' component"
    elif member.islnk():
        problem = "is a hard link"
    elif kind is None:
        problem = "is not a directory, a regular file or a symlink"
    elif not parts:
        problem = None if kind == "directory" else "has no name"
    elif parts[0] == leave_out:
        problem = f"is under the bridge's {leave_out}"
    elif kind == "symlink" and link_leaves(parts, member.linkname):
        problem = f"links to {member.linkname!r}, out of the directory"
    else:
        for depth in range(1, len(parts)):
            through = seen.get(tuple(parts[:depth]), "directory")
            if through != "directory":
                problem = f"passes through the {through} {'/'.join(parts[:depth])!r} before it"
                break
    if problem is not None:
        raise FileProblem("refused", f"the member {name!r} {problem}")
    if not parts:
        return None
    seen[tuple(parts)] = kind
    return parts


def open_dirs(top_fd: int, parts: list[str], shown: str, create: bool) -> int | None:
    """A new fd of the directory top/parts, walked by fd without following any symlink; missing
    directories are made when `create`, else None. A symlink or file on the way is refused."""
    import errno

    fd: int | None = os.dup(top_fd)
    try:
        for part in parts:
            try:
                following = os.open(part, DIRECTORY_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    os.close(fd)
                    fd = None
                    return None
                os.mkdir(part, 0o700, dir_fd=fd)
                following = os.open(part, DIRECTORY_FLAGS, dir_fd=fd)
            except OSError as exc:
                if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                    raise
                problem = f"{shown!r} passes through {part!r}, a symlink or file on disk"
                raise FileProblem("refused", problem) from None
            os.close(fd)
            fd = following
    except BaseException:
        if fd is not None:
            os.close(fd)
        raise
    return fd


def place_member(
    tar: Any, member: Any, parent: int, parts: list[str], directories: list, extract: bool
) -> None:
    """Check (and when `extract`, write) `member` as parts[-1] in directory `parent`: an existing
    file or symlink is replaced by rename, never written through; a directory is never replaced.
    Directories are listed in `directories` to get their modes once their content is in."""
    import shutil

    name = parts[-1]
    try:
        old = os.stat(name, dir_fd=parent, follow_symlinks=False)
    except FileNotFoundError:
        old = None
    if member.isdir():
        if not extract:
            return
        if old is not None and not stat.S_ISDIR(old.st_mode):
            os.unlink(name, dir_fd=parent)
            old = None
        if old is None:
            os.mkdir(name, 0o700, dir_fd=parent)
        directories.append((parts, member.mode & 0o755, member.mtime))
        return
    if old is not None and stat.S_ISDIR(old.st_mode):
        raise FileProblem("refused", f"{member.name!r} is a directory on disk")
    if not extract:
        return
    times = (member.mtime, member.mtime)
    tmp = temporary_name(name)
    try:
        if member.issym():
            os.symlink(member.linkname, tmp, dir_fd=parent)
            os.utime(tmp, times, dir_fd=parent, follow_symlinks=False)
        else:
            # As tarfile's data filter: the owner may read and write, no set-id bits, no write
            # for others, executable by others only when by the owner.
            mode = member.mode & 0o755 | 0o600
            if not mode & 0o100:
                mode &= ~0o011
            with os.fdopen(os.open(tmp, NEW_FILE_FLAGS, 0o600, dir_fd=parent), "wb") as out:
                shutil.copyfileobj(tar.extractfile(member), out, FILE_CHUNK)
                out.flush()
                os.fchmod(out.fileno(), mode)
                os.utime(out.fileno(), times)
        os.rename(tmp, name, src_dir_fd=parent, dst_dir_fd=parent)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=parent)
        raise


def unpack_tree(top: str, leave_out: str | None, extract: bool, data_fd: int) -> dict:
    """In the file child: check every member of the tar read from `data_fd`, and when `extract`
    write them under `top`, checking each again (the disk may have changed since)."""
    import tarfile

    data_filter = getattr(tarfile, "data_filter", None)  # Python 3.12, and 3.11.4 on
    seen: dict[tuple[str, ...], str] = {}
    directories: list[tuple[list[str], int, float]] = []
    count = 0
    top_fd = os.open(top, DIRECTORY_FLAGS)
    try:
        with os.fdopen(data_fd, "rb") as stream, tarfile.open(fileobj=stream, mode="r|") as tar:
            for member in tar:
                parts = member_parts(member, leave_out, seen)
                if parts is None:
                    continue
                try:
                    if data_filter is not None:
                        try:
                            data_filter(member, top)
                        except tarfile.TarError as exc:
                            problem = f"the member {member.name!r}: {exc}"
                            raise FileProblem("refused", problem) from None
                    parent = open_dirs(top_fd, parts[:-1], member.name, extract)
                    if parent is not None:
                        try:
                            place_member(tar, member, parent, parts, directories, extract)
                        finally:
                            os.close(parent)
                except OSError as exc:
                    raise os_problem(exc, os.path.join(top, *parts)) from None
                count += 1
        # Deepest first, so that a directory's own mode never keeps its content out.
        for parts, mode, mtime in reversed(directories):
            try:
                fd = open_dirs(top_fd, parts, "/".join(parts), False)
                if fd is not None:
                    try:
                        os.fchmod(fd, mode)
                        os.utime(fd, (mtime, mtime))
                    finally:
                        os.close(fd)
            except OSError as exc:
                raise os_problem(exc, os.path.join(top, *parts)) from None
    except tarfile.TarError as exc:
        raise FileProblem("refused", f"not a tar archive a fork makes: {exc}") from None
    finally:
        os.close(top_fd)
    return {"files": count}


def cmd_fork_load(args: argparse.Namespace) -> tuple[dict, int]:
    return staged_command(args, functools.partial(fork_failure, "refused"), fork_load)


def fork_load(args: argparse.Namespace, staged: Path, until: float) -> dict:
    import tarfile  # noqa: F401 (imported before the fork, so the child has it loaded)

    prepare_uploads(staged)
    top, leave_out = fork_top()
    try:
        size, digest = staged_digest(staged, args.parts, until)
        if size != args.size or digest != args.sha256:
            held = f"they hold {size} bytes with SHA-256 {digest}"
            return fork_failure("mismatch", f"{staged_mismatch(args)}: {held}")
        # Every member is checked before anything is written, then checked again as it is.
        for extract in (False, True):
            work = functools.partial(unpack_tree, str(top), leave_out, extract)
            answer = in_file_child(work, until, staged_part_chunks(staged, args.parts))
            failure = child_failure(answer)
            if failure is not None:
                return failure
    except FileProblem as exc:
        return fork_failure(exc.code, str(exc))
    files = answer["files"]
    message = f"extracted {files} entries into {top} ({size} bytes, parts: {args.parts})"
    return fork_envelope(message, parts=args.parts, size=size, sha256=digest, files=files)


# --------------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------------


def seconds_type(value: str) -> float:
    seconds = float(value)
    if not 0 < seconds < 86_400:
        raise argparse.ArgumentTypeError("seconds must be > 0")
    return seconds


def attempt_type(value: str) -> str:
    if not ATTEMPT_PATTERN.fullmatch(value):
        raise argparse.ArgumentTypeError("an attempt id is 16 to 64 lowercase hex digits")
    return value


def offset_type(value: str) -> int:
    offset = int(value)
    if offset < 0:
        raise argparse.ArgumentTypeError("an offset is a number of bytes, 0 or more")
    return offset


def bytes_type(value: str) -> int:
    count = int(value)
    if count < 0:
        raise argparse.ArgumentTypeError("a number of bytes, 0 or more")
    return count


def parts_type(value: str) -> int:
    parts = int(value)
    if not 0 <= parts <= UPLOAD_MAX_PARTS:
        raise argparse.ArgumentTypeError(f"a number of parts, 0 to {UPLOAD_MAX_PARTS}")
    return parts


def sha256_type(value: str) -> str:
    if not re.fullmatch(r"[0-9a-fA-F]{64}", value):
        raise argparse.ArgumentTypeError("a SHA-256 is 64 hex digits")
    return value.lower()


def bridge_failure(kind: str, message: str) -> dict:
    """An envelope of the expected kind for when the bridge itself broke."""
    if kind == "setup":
        return setup_envelope(False, False, message)
    if kind == "kernel":
        return kernel_envelope(False, False, None, message)
    if kind == "state":
        return state_envelope(False, message)
    if kind == "env":
        return env_envelope(False, message)
    if kind == "file":
        return file_envelope("", error={"code": "failed", "message": message})
    if kind == "fork":
        return fork_failure("failed", message)
    return result_envelope("error", error=error_info("BridgeError", message))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="bridge.py", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)

    def command(name: str, handler: Callable, kind: str) -> argparse.ArgumentParser:
        sub = commands.add_parser(name)
        sub.set_defaults(handler=handler, kind=kind)
        return sub

    setup = command("setup", cmd_setup, "setup")
    setup.add_argument("--deadline", type=seconds_type, default=60.0)
    setup.add_argument("--requirement", action="append", default=[])
    setup.add_argument("--self-install", action="store_true")

    start = command("start-kernel", cmd_start_kernel, "kernel")
    start.add_argument("--state-dir", default=".briq/state")
    start.add_argument("--deadline", type=seconds_type, default=30.0)

    probe = command("probe", cmd_probe, "kernel")
    probe.add_argument("--state-dir", default=".briq/state")

    run = command("run", cmd_run, "result")
    run.add_argument("--state-dir", default=".briq/state")
    run.add_argument("--code", required=True)
    run.add_argument("--timeout", type=seconds_type, default=30.0)
    run.add_argument("--attempt", type=attempt_type)

    recall = command("recall", cmd_recall, "result")
    recall.add_argument("--attempt", type=attempt_type, required=True)

    cancel = command("cancel", cmd_cancel, "result")
    cancel.add_argument("--state-dir", default=".briq/state")
    cancel.add_argument("--attempt", type=attempt_type, required=True)
    cancel.add_argument("--grace", type=seconds_type, default=3.0)

    for name, handler in (("save-state", cmd_save_state), ("restore-state", cmd_restore_state)):
        sub = command(name, handler, "state")
        sub.add_argument("--state-dir", default=".briq/state")
        sub.add_argument("--deadline", type=seconds_type, default=30.0)

    set_env = command("set-env", cmd_set_env, "env")
    set_env.add_argument("--state-dir", default=".briq/state")
    set_env.add_argument("--deadline", type=seconds_type, default=10.0)

    def staged_options(sub: argparse.ArgumentParser, deadline: float) -> None:
        sub.add_argument("--staged", required=True)
        sub.add_argument("--parts", type=parts_type, required=True)
        sub.add_argument("--size", type=bytes_type, required=True)
        sub.add_argument("--sha256", type=sha256_type, required=True)
        sub.add_argument("--deadline", type=seconds_type, default=deadline)

    file_write = command("file-write", cmd_file_write, "file")
    file_write.add_argument("--dest", required=True)
    staged_options(file_write, 30.0)

    file_read = command("file-read", cmd_file_read, "file")
    file_read.add_argument("--path", required=True)
    file_read.add_argument("--offset", type=bytes_type, default=0)
    file_read.add_argument("--length", type=bytes_type, default=FILE_READ_MAX)
    file_read.add_argument("--max-size", type=bytes_type)
    file_read.add_argument("--deadline", type=seconds_type, default=30.0)

    fork_save = command("fork-save", cmd_fork_save, "fork")
    fork_save.add_argument("--snapshot", required=True)
    fork_save.add_argument("--saved", action="store_true")
    fork_save.add_argument("--max-bytes", type=bytes_type, default=FORK_MAX_BYTES)
    fork_save.add_argument("--state-dir", default=".briq/state")
    fork_save.add_argument("--deadline", type=seconds_type, default=60.0)

    fork_load = command("fork-load", cmd_fork_load, "fork")
    staged_options(fork_load, 60.0)

    # A running attempt's output as it comes: raw lines, no nonce, no envelope (the operator
    # reads its stdout as a byte stream).
    follow = commands.add_parser("follow")
    follow.add_argument("--attempt", type=attempt_type, required=True)
    follow.add_argument("--offset", type=offset_type, default=0)
    follow.add_argument("--max-seconds", type=seconds_type, default=3_600.0)

    # Internal: the runner, started by start-kernel (and by run when none answers). No nonce,
    # no envelope; its output goes to the runner log.
    serve = commands.add_parser("serve")
    serve.add_argument("--state-dir", default=".briq/state")
    serve.add_argument("--kernel-pid", type=int, required=True)
    return parser


def take_nonce() -> str | None:
    """The call's nonce from the environment, removed from it so that no child inherits it;
    None when it is missing or malformed."""
    nonce = os.environ.pop(NONCE_ENV, None)
    return nonce if nonce is not None and NONCE_PATTERN.fullmatch(nonce) else None


def main(argv: list[str] | None = None) -> int:
    nonce = take_nonce()
    args = build_parser().parse_args(argv)
    if args.command == "serve":
        return cmd_serve(args)
    if args.command == "follow":
        return cmd_follow(args)
    if nonce is None:
        # Nothing to frame an envelope with: the operator sees none and calls it malformed.
        print(f"bridge error: {NONCE_ENV} must hold [A-Za-z0-9]{{16,64}}", file=sys.stderr)
        return 2
    envelope_stream = sys.stdout
    # Anything else that writes to sys.stdout (imported libraries, warnings) goes to stderr, so
    # the envelope is the only thing this process puts on stdout.
    with contextlib.redirect_stdout(sys.stderr):
        try:
            if getattr(args, "self_install", False):
                install_self()
            if split_users():
                secure_layout()
            envelope, exit_code = args.handler(args)
        except OutcomeUnknown as exc:
            # No envelope at all: whatever it said could be wrong. The operator reads a missing
            # envelope as malformed and stops using this executor.
            print(f"bridge error: {exc}; the code may or may not have run", file=sys.stderr)
            return 1
        except Exception as exc:
            envelope = bridge_failure(args.kind, failure_message(exc))
            exit_code = 1
    text, exit_code = stdout_text(nonce, args.kind, envelope, exit_code)
    envelope_stream.write(text)
    envelope_stream.flush()
    return exit_code


if __name__ == "__main__":
    sys.exit(main())
