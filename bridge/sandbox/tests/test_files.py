"""`file-write` and `file-read`: files in and out of the sandbox for the operator's
`briqexecutors/{name}/files`, never the bridge's own, always with the kernel user's rights.

The sandbox plays `/work` as everywhere; the operator's part uploads (briq_files_put, as root)
are plain writes into `.briq/uploads/<id>/`. No kernel is started: user code's planted
symlinks are made by the test, owned by the kernel user when run as root.
"""

from __future__ import annotations

import base64
import hashlib
import os
import secrets
from pathlib import Path

import pytest
from conftest import KERNEL_UID, SPLIT

FILE_READ_MAX = 524_288


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
def sandbox(empty_sandbox):
    """A sandbox with the kernel user's directory (as start-kernel would make it)."""
    home = empty_sandbox.user_dir
    if SPLIT:
        home.mkdir(mode=0o700)
        os.chown(home, KERNEL_UID, KERNEL_UID)
    return empty_sandbox


def as_kernel_user(path: Path) -> Path:
    """`path` (a file, directory or symlink the test made) as if user code had made it."""
    if SPLIT:
        os.lchown(path, KERNEL_UID, KERNEL_UID)
    return path


def plant_symlink(link: Path, target: Path) -> Path:
    link.symlink_to(target)
    return as_kernel_user(link)


def stage(sandbox, data: bytes, part_size: int = 1000) -> tuple[str, int]:
    """Upload `data` in parts as the operator does; the staging dir and its part count."""
    upload = secrets.token_hex(16)
    directory = sandbox.root / ".briq" / "uploads" / upload
    directory.mkdir(parents=True)
    parts = [data[i : i + part_size] for i in range(0, len(data), part_size)]
    for index, part in enumerate(parts):
        (directory / f"part-{index:05d}").write_bytes(part)
    return f".briq/uploads/{upload}", len(parts)


def write(sandbox, dest, data: bytes, size: int | None = None, digest: str | None = None):
    staged, parts = stage(sandbox, data)
    call = sandbox.bridge(
        "file-write",
        *("--staged", staged, "--parts", str(parts), "--dest", str(dest)),
        *("--size", str(len(data) if size is None else size)),
        *("--sha256", digest or sha(data), "--deadline", "20"),
    )
    assert not (sandbox.root / staged).exists(), "the staging directory is always removed"
    return call


def read(sandbox, path, offset: int = 0, length: int = FILE_READ_MAX, *extra: str):
    options = ("--path", str(path), "--offset", str(offset), "--length", str(length))
    return sandbox.bridge("file-read", *options, *extra, "--deadline", "20")


def temporary_files(directory: Path) -> list[str]:
    return [name for name in os.listdir(directory) if name.endswith(".briq-tmp")]


def error_code(call) -> str:
    assert call.envelope["kind"] == "file" and call.envelope["ok"] is False, call.envelope
    assert call.returncode == 1
    return call.envelope["error"]["code"]


def bridge_files(sandbox) -> dict[str, bytes]:
    """Every file under .briq but the uploads (which come and go), with its content."""
    briq = sandbox.root / ".briq"
    return {
        str(path.relative_to(briq)): path.read_bytes()
        for path in briq.rglob("*")
        if path.is_file() and "uploads" not in path.parts
    }


def test_parts_are_joined_in_order_and_the_staging_directory_is_removed(sandbox):
    data = b"".join(bytes([i]) * 1000 for i in range(7)) + b"tail"
    dest = sandbox.user_dir / "data" / "out.bin"  # its directory is created
    call = write(sandbox, dest, data)
    assert call.returncode == 0, call.envelope
    assert call.envelope == {
        "kind": "file",
        "ok": True,
        "path": str(dest),
        "size": len(data),
        "sha256": sha(data),
        "offset": None,
        "data_base64": None,
        "error": None,
    }
    assert dest.read_bytes() == data
    assert os.listdir(dest.parent) == ["out.bin"], "no temporary file is left"


def test_an_empty_file_is_written_from_no_parts(sandbox):
    dest = sandbox.user_dir / "empty"
    call = write(sandbox, dest, b"")
    assert call.envelope["ok"], call.envelope
    assert dest.read_bytes() == b""


@pytest.mark.parametrize("wrong", ["digest", "size"])
def test_a_write_whose_digest_does_not_match_writes_nothing(sandbox, wrong):
    data = secrets.token_bytes(5000)
    dest = sandbox.user_dir / "out.bin"
    if wrong == "digest":
        call = write(sandbox, dest, data, digest=sha(b"something else"))
    else:
        call = write(sandbox, dest, data, size=len(data) + 1)
    assert error_code(call) == "mismatch"
    assert call.envelope["size"] == len(data) and call.envelope["sha256"] == sha(data)
    assert not dest.exists()
    assert temporary_files(sandbox.user_dir) == []


def test_a_missing_part_is_a_mismatch_and_writes_nothing(sandbox):
    staged, parts = stage(sandbox, b"x" * 3000)
    (sandbox.root / staged / "part-00001").unlink()
    dest = sandbox.user_dir / "out.bin"
    call = sandbox.bridge(
        "file-write",
        *("--staged", staged, "--parts", str(parts), "--dest", str(dest)),
        *("--size", "3000", "--sha256", sha(b"x" * 3000)),
    )
    assert error_code(call) == "mismatch"
    assert not dest.exists() and not (sandbox.root / staged).exists()


@pytest.mark.parametrize("planted", ["directory_link", "file_link", "direct"])
def test_a_write_through_a_symlink_into_the_bridges_directory_is_refused_and_writes_nothing(
    sandbox, planted
):
    before = bridge_files(sandbox)
    journal = sandbox.root / ".briq" / "journal"
    journal.mkdir(exist_ok=True)
    if planted == "directory_link":
        plant_symlink(sandbox.user_dir / "link", journal)
        dest = sandbox.user_dir / "link" / f"{secrets.token_hex(8)}.finished"
    elif planted == "file_link":
        link = sandbox.user_dir / "bridge.py"
        plant_symlink(link, sandbox.root / ".briq" / "bridge.py")
        dest = link
    else:
        dest = sandbox.root / ".briq" / "bridge.py"
    call = write(sandbox, dest, b"import os; os.system('id')\n")
    assert error_code(call) == "refused"
    assert bridge_files(sandbox) == before
    assert list(journal.iterdir()) == []


@pytest.mark.parametrize("how", ["direct", "through_a_symlink"])
def test_a_read_of_the_journal_is_refused(sandbox, how):
    journal = sandbox.root / ".briq" / "journal"
    journal.mkdir(exist_ok=True)
    record = journal / f"{secrets.token_hex(8)}.finished"
    record.write_text('{"envelope": "secret"}')
    path = record
    if how == "through_a_symlink":
        path = plant_symlink(sandbox.user_dir / "record", record)
    call = read(sandbox, path)
    assert error_code(call) == "refused"
    assert call.envelope["data_base64"] is None


@pytest.mark.parametrize("name", ["state/kernel.pid", "bridge.py", "."])
def test_a_read_of_the_bridges_state_or_itself_is_refused(sandbox, name):
    state = sandbox.root / ".briq" / "state"
    state.mkdir(exist_ok=True)
    (state / "kernel.pid").write_text("1")
    call = read(sandbox, sandbox.root / ".briq" / name)
    assert error_code(call) == "refused"


@pytest.mark.parametrize(
    "path", ["home/x", "./x", "/tmp/../etc/passwd", "/work/home/..", "{root}/home/../.briq/x"]
)
@pytest.mark.parametrize("command", ["read", "write"])
def test_dotdot_and_relative_paths_are_refused(sandbox, path, command):
    path = path.format(root=sandbox.root)
    call = read(sandbox, path) if command == "read" else write(sandbox, path, b"x")
    assert error_code(call) == "refused"
    message = call.envelope["error"]["message"]
    assert "absolute" in message or ".." in message


def test_nul_in_a_path_is_refused(bridge_module):
    assert "NUL" in bridge_module.path_problem("/work/home/a\0b")


STAGED_ELSEWHERE = ["../home", ".briq/uploads/../state", ".briq/uploads/XY", "/tmp"]


@pytest.mark.parametrize("staged", STAGED_ELSEWHERE)
def test_a_staging_directory_other_than_an_upload_is_refused_and_left_alone(sandbox, staged):
    (sandbox.root / ".briq" / "state").mkdir(exist_ok=True)
    call = sandbox.bridge(
        "file-write",
        *("--staged", staged, "--parts", "0", "--dest", str(sandbox.user_dir / "x")),
        *("--size", "0", "--sha256", sha(b"")),
    )
    assert error_code(call) == "refused"
    assert (sandbox.root / ".briq" / "state").is_dir() and sandbox.user_dir.is_dir()


def test_a_write_lands_whole_or_not_at_all(sandbox, bridge_module):
    dest = sandbox.user_dir / "out.bin"
    dest.write_bytes(b"old")
    keep = sandbox.user_dir / "kept"
    os.link(dest, keep)
    as_kernel_user(dest)
    # A new file replaces the old one by rename: the old inode (still linked) is untouched.
    new = secrets.token_bytes(4000)
    assert write(sandbox, dest, new).envelope["ok"]
    assert dest.read_bytes() == new and keep.read_bytes() == b"old"
    # Input that stops short (the bridge's feed ended): the child writes nothing, no temp left.
    read_end, write_end = os.pipe()
    os.write(write_end, new[:100])
    os.close(write_end)
    protected = (str(sandbox.root / ".briq"), str(sandbox.root / ".briq" / "bridge.py"))
    with pytest.raises(bridge_module.FileProblem) as caught:
        bridge_module.install_file(str(dest), len(new), sha(new[:3]), protected, read_end)
    os.close(read_end)
    assert caught.value.code == "mismatch"
    assert dest.read_bytes() == new
    assert temporary_files(sandbox.user_dir) == []


def test_a_missing_file_is_not_found(sandbox):
    assert error_code(read(sandbox, sandbox.user_dir / "nothing")) == "not_found"
    (sandbox.user_dir / "file").write_bytes(b"x")
    call = write(sandbox, sandbox.user_dir / "file" / "below", b"data")
    assert error_code(call) == "not_found"


def test_a_directory_is_is_directory(sandbox):
    assert error_code(read(sandbox, sandbox.user_dir)) == "is_directory"
    sub = sandbox.user_dir / "sub"
    sub.mkdir()
    as_kernel_user(sub)
    assert error_code(write(sandbox, sub, b"data")) == "is_directory"
    assert list(sub.iterdir()) == []


def test_a_fifo_is_refused_without_waiting(sandbox):
    fifo = sandbox.user_dir / "fifo"
    os.mkfifo(fifo)
    as_kernel_user(fifo)
    assert error_code(read(sandbox, fifo)) == "refused"


def test_a_read_in_parts_gives_back_the_file_and_its_digest(sandbox):
    data = secrets.token_bytes(FILE_READ_MAX * 2 + 12_345)
    path = sandbox.user_dir / "big.bin"
    path.write_bytes(data)
    pieces = []
    for offset in range(0, len(data), FILE_READ_MAX):
        call = read(sandbox, path, offset)
        envelope = call.envelope
        assert envelope["ok"] and call.returncode == 0, envelope
        assert envelope["offset"] == offset and envelope["size"] == len(data)
        assert envelope["sha256"] == (sha(data) if offset == 0 else None)
        pieces.append(base64.b64decode(envelope["data_base64"]))
        # 512 KiB of data is ~700 KB of base64: spilled, and one briq get (≤ 1 MB) reads it.
        if len(pieces[-1]) == FILE_READ_MAX:
            assert call.spilled is not None and call.spilled["bytes"] < 1_000_000
        else:
            assert call.spilled is None
    assert b"".join(pieces) == data


def test_a_small_read_is_not_spilled_and_past_the_end_is_empty(sandbox):
    path = sandbox.user_dir / "small"
    path.write_bytes(b"hello world")
    call = read(sandbox, path, 6, 100)
    assert call.spilled is None
    assert base64.b64decode(call.envelope["data_base64"]) == b"world"
    assert call.envelope["size"] == 11 and call.envelope["sha256"] is None
    assert read(sandbox, path, 50, 10).envelope["data_base64"] == ""


def test_a_read_over_the_limits_is_refused_or_too_large(sandbox):
    path = sandbox.user_dir / "f"
    path.write_bytes(b"x" * 100)
    assert error_code(read(sandbox, path, 0, FILE_READ_MAX + 1)) == "refused"
    call = read(sandbox, path, 0, 10, "--max-size", "99")
    assert error_code(call) == "too_large"
    assert call.envelope["data_base64"] is None
    assert read(sandbox, path, 0, 10, "--max-size", "100").envelope["ok"]


@pytest.mark.skipif(not SPLIT, reason="the kernel user's rights apply only when run as root")
def test_the_file_is_written_with_the_kernel_users_rights(sandbox):
    dest = sandbox.user_dir / "new" / "dir" / "out.bin"
    assert write(sandbox, dest, b"data").envelope["ok"]
    for path in (dest, dest.parent, dest.parent.parent):
        assert os.stat(path).st_uid == KERNEL_UID
    # A place only root could write, and a file only root can read: the kernel user's answer.
    rooted = sandbox.root / "rooted"
    rooted.mkdir(mode=0o755)
    assert error_code(write(sandbox, rooted / "x", b"data")) == "permission"
    assert error_code(write(sandbox, rooted / "sub" / "x", b"data")) == "permission"
    assert list(rooted.iterdir()) == []
    secret = rooted / "secret"
    secret.write_bytes(b"root only")
    secret.chmod(0o600)
    assert error_code(read(sandbox, secret)) == "permission"
    # A symlink user code planted leads only where it could write itself.
    plant_symlink(sandbox.user_dir / "etc", rooted)
    assert error_code(write(sandbox, sandbox.user_dir / "etc" / "x", b"data")) == "permission"


def test_a_file_operation_past_its_deadline_stops_and_says_timeout(bridge_module):
    import time

    def stuck(_):
        time.sleep(30)

    def deaf(_):  # ignores the child's own alarm: the bridge kills it
        import signal

        signal.signal(signal.SIGALRM, signal.SIG_IGN)
        time.sleep(30)

    start = time.monotonic()
    answer = bridge_module.in_file_child(stuck, start + 0.3)
    assert answer["error"]["code"] == "timeout"
    assert time.monotonic() - start < 1.5
    start = time.monotonic()
    with pytest.raises(bridge_module.FileProblem) as caught:
        bridge_module.in_file_child(deaf, start + 0.3)
    assert caught.value.code == "timeout"
    assert time.monotonic() - start < 4.0
