"""briq bridge, the run client: what an action's exec starts (PROTOCOL.md "Runs").

The operator sends this file's text as the program of the exec::

    BRIQ_NONCE=NONCE python3 -I -S -c <this text> run --state-dir D --timeout S --attempt ID

with the action's code on stdin. It hands the action to the kernel's runner (started by
``start-kernel``, which journals the attempt, runs it once, and frames the envelope) and copies
the runner's answer to stdout. It exists because every action pays for its start: ``-I -S`` and
only built-in modules (no ``socket``, no ``json``: each costs milliseconds to import) keep it at
the interpreter's floor, where the full bridge (``bridge.py run``) pays for site, argparse and
compiling 2,000 lines.

When no genuine runner listens, or the runner declines (its kernel was replaced), the client
becomes ``bridge.py run`` with the same arguments and the code still unread on stdin, which runs
the action over a kernel connection of its own, exactly as before the runner existed.

Once the code is sent, any failure to get a whole answer ends with no envelope and exit code
1: the code may or may not have run, and the operator must not be told either.

It also carries a claimer's environment (``set-env --state-dir D --deadline S``, the variables
on stdin) to the runner, which sets them over its kernel connection: a claim then pays neither
for the full bridge nor for a kernel client of its own. Without a runner that takes the request
(none, declined, or one too old to know it: nothing has been sent yet), it becomes ``bridge.py
set-env`` with the same arguments. Setting the variables again changes nothing, so no answer
means only that they may not be set.
"""

import os
import stat
import sys
from _socket import AF_UNIX, SOCK_STREAM, socket

BRIDGE = ".briq/bridge.py"
NONCE_ENV = "BRIQ_NONCE"
HEX = frozenset("0123456789abcdef")
ALNUM = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789")
# How long the runner gets to accept the request (it serves one connection at a time) beyond
# the action's own time, and to send the answer; mirrors RUNNER_ANSWER_MARGIN_S and
# INTERRUPT_GRACE_S in briq_sandbox.py.
ANSWER_MARGIN_S = 1.5 + 2.0
CONNECT_WAIT_S = 1.0
MAX_ANSWER_BYTES = 16 * 1024 * 1024
# A claimer's environment is at most this many bytes; one byte more tells the runner it is over
# (mirrors ENV_MAX_BYTES in briq_sandbox.py).
ENV_MAX_BYTES = 65_536


def fail(message: str, code: int = 1) -> None:
    os.write(2, f"bridge: {message}\n".encode("utf-8", "replace"))
    sys.exit(code)


def seconds(text: str, name: str) -> float:
    """A number of seconds in (0, 86400); exits with 2 otherwise."""
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not 0 < value < 86_400:
        fail(f"{name} must be a number of seconds in (0, 86400)", 2)
    return value


def set_env_options(argv: list) -> dict:
    """The `set-env` options this client understands, validated; exits with 2 otherwise."""
    found = dict(zip(argv[1::2], argv[2::2], strict=False))
    if len(argv) % 2 != 1 or set(found) != {"--state-dir", "--deadline"}:
        fail("set-env needs exactly --state-dir and --deadline", 2)
    deadline = seconds(found["--deadline"], "--deadline")
    return {"command": "set-env", "state_dir": found["--state-dir"], "deadline": deadline}


def options(argv: list) -> dict:
    """The options of the command this client understands (`run`, `set-env`), validated; exits
    with 2 otherwise."""
    if argv and argv[0] == "set-env":
        return set_env_options(argv)
    if not argv or argv[0] != "run" or len(argv) % 2 != 1:
        fail("usage: run --state-dir D --timeout S --attempt ID", 2)
    found = dict(zip(argv[1::2], argv[2::2], strict=True))
    if set(found) != {"--state-dir", "--timeout", "--attempt"}:
        fail("run needs exactly --state-dir, --timeout and --attempt", 2)
    attempt = found["--attempt"]
    if not (16 <= len(attempt) <= 64 and set(attempt) <= HEX):
        fail("an attempt id is 16 to 64 lowercase hex digits", 2)
    timeout = seconds(found["--timeout"], "--timeout")
    return {
        "command": "run",
        "state_dir": found["--state-dir"],
        "timeout": timeout,
        "attempt": attempt,
    }


def trusted(path: str, kind) -> bool:
    """Whether `path` (not followed if a link) is a `kind` of our uid that nobody else can write."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return kind(st.st_mode) and st.st_uid == os.geteuid() and not st.st_mode & 0o022


def connect(state_dir: str):
    """A connection to the genuine runner, or None (nothing sent): the socket and its directory
    must be ours and writable by nobody else, so no one can have put another listener there."""
    address = state_dir + "/runner.sock"
    if not (trusted(state_dir, stat.S_ISDIR) and trusted(address, stat.S_ISSOCK)):
        return None
    sock = socket(AF_UNIX, SOCK_STREAM)
    try:
        sock.settimeout(CONNECT_WAIT_S)
        sock.connect(address)
    except OSError:
        sock.close()
        return None
    return sock


def become_bridge(argv: list) -> None:
    """Do it with the full bridge instead (stdin untouched, nonce still in env)."""
    if argv[0] == "run":
        argv = [argv[0], "--code", "-", *argv[1:]]
    os.execv(sys.executable, [sys.executable, BRIDGE, *argv])


def read_line(sock, limit: int) -> bytes:
    """Bytes up to the first newline, one byte at a time: whatever follows stays in the socket."""
    data = bytearray()
    while len(data) <= limit:
        byte = sock.recv(1)
        if not byte:
            raise ConnectionError("the runner closed the connection")
        if byte == b"\n":
            return bytes(data)
        data += byte
    raise ValueError(f"no newline within {limit} bytes")


def read_exactly(sock, size: int) -> bytes:
    chunks, left = [], size
    while left:
        chunk = sock.recv(min(left, 1 << 20))
        if not chunk:
            raise ConnectionError(f"the answer ended {left} bytes short")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def main(argv: list) -> None:
    run = options(argv)
    nonce = os.environ.get(NONCE_ENV, "")
    if not (16 <= len(nonce) <= 64 and set(nonce) <= ALNUM):
        fail(f"{NONCE_ENV} must hold [A-Za-z0-9]{{16,64}}", 2)
    sock = connect(run["state_dir"])
    if sock is None:
        become_bridge(argv)
    # Every field is hex, alphanumeric or a float's repr: nothing in it needs escaping.
    if run["command"] == "set-env":
        wait = run["deadline"] + ANSWER_MARGIN_S
        request = f'{{"op":"set-env","deadline":{run["deadline"]!r},"nonce":"{nonce}"}}\n'
    else:
        wait = run["timeout"] + ANSWER_MARGIN_S
        request = f'{{"op":"exec","attempt":"{run["attempt"]}","timeout":{run["timeout"]!r},'
        request += f'"nonce":"{nonce}"}}\n'
    try:
        sock.sendall(request.encode("ascii"))
        # It may be serving another connection first; until it says ready, nothing was taken.
        sock.settimeout(wait)
        verdict = read_line(sock, 4_096)
    except (OSError, ValueError) as exc:
        fail(f"the runner did not take the {run['command']} request ({exc}); it did not run")
    # A runner made by an earlier bridge answers a request it does not know as malformed.
    if verdict.startswith(b"declined") or (run["command"] == "set-env" and verdict != b"ready"):
        sock.close()
        become_bridge(argv)
    if verdict != b"ready":
        fail(f"the runner refused the action: {verdict[:1000].decode('ascii', 'replace')}")
    if run["command"] == "set-env":
        code = sys.stdin.buffer.read(ENV_MAX_BYTES + 1)
    else:
        code = sys.stdin.buffer.read()
    try:
        sock.sendall(b"%d\n" % len(code) + code)
        header = read_line(sock, 64).split(b" ")
        if len(header) != 3 or header[0] != b"answer" or header[1] not in (b"0", b"1"):
            raise ValueError(f"unexpected answer header {b' '.join(header)[:100]!r}")
        size = int(header[2])
        if not 0 < size <= MAX_ANSWER_BYTES:
            raise ValueError(f"answer of {size} bytes")
        answer = read_exactly(sock, size)
    except (OSError, ValueError) as exc:
        if run["command"] == "set-env":
            fail(f"the runner gave no answer ({exc}); the variables may not be set")
        fail(f"the runner gave no answer ({exc}); the code may or may not have run")
    view = memoryview(answer)
    while view:
        view = view[os.write(1, view) :]
    sys.exit(int(header[1]))


main(sys.argv[1:])
