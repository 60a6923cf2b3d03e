"""`fork-save` and `fork-load` (PROTOCOL.md "Forks"): a kernel's namespace and its user's files
are packed in one sandbox, copied part by part as the operator does it, and extracted in another,
with the kernel user's rights, never through a symlink and never outside the user's directory.

The operator's copies (briq get from `.briq/forks/<id>/`, briq put into `.briq/uploads/<id>/`)
are plain reads and writes here; hostile archives are made by the test with `tarfile`.
"""

from __future__ import annotations

import hashlib
import io
import os
import secrets
import shutil
import tarfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from conftest import KERNEL_UID, SPLIT, Sandbox, new_root, process_gone

PART_BYTES = 1_048_576
STATE_FILE = ".briq-state/namespace.pickle"


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
def sandbox(empty_sandbox):
    """A sandbox without a kernel, with the kernel user's directory as start-kernel makes it."""
    home = empty_sandbox.user_dir
    if SPLIT:
        home.mkdir(mode=0o700)
        os.chown(home, KERNEL_UID, KERNEL_UID)
    return empty_sandbox


@pytest.fixture
def target(sandboxes_dir):
    """A second sandbox, the fork's new one (its kernel, once started, is stopped at the end)."""
    sandbox = Sandbox(new_root(sandboxes_dir, "fork-"))
    yield sandbox
    sandbox.stop_kernel()


def user_file(sandbox, name: str, data: bytes = b"") -> Path:
    """A file (and its directories) in the kernel user's directory, as user code makes it."""
    path = sandbox.user_dir / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    as_kernel_user(sandbox, path)
    return path


def as_kernel_user(sandbox, path: Path) -> Path:
    """`path` and its directories up to the user's own, owned by the kernel user."""
    if SPLIT:
        for step in [path, *path.parents]:
            if step == sandbox.user_dir:
                break
            os.lchown(step, KERNEL_UID, KERNEL_UID)
    return path


def fork_save(sandbox, *options: str, snapshot: str | None = None):
    return sandbox.bridge("fork-save", "--snapshot", snapshot or secrets.token_hex(16), *options)


def ok(call) -> dict:
    assert (call.returncode, call.envelope["ok"]) == (0, True), (call.envelope, call.stderr)
    assert call.envelope["kind"] == "fork" and call.envelope["error"] is None
    return call.envelope


def error_code(call) -> str:
    envelope = call.envelope
    assert envelope["kind"] == "fork" and envelope["ok"] is False, envelope
    assert call.returncode == 1
    assert envelope["message"] == envelope["error"]["message"]
    empty = {"snapshot": "", "parts": 0, "size": 0, "sha256": "", "files": 0, "skipped": 0}
    assert {key: envelope[key] for key in empty} == empty
    assert (envelope["saved"], envelope["unsaved"], envelope["state_bytes"]) == ([], [], 0)
    return envelope["error"]["code"]


def user_entries(sandbox) -> list[str]:
    """What is in the kernel user's directory (/work itself when not root: .briq aside)."""
    return sorted(set(os.listdir(sandbox.user_dir)) - {".briq"})


def forks(sandbox) -> Path:
    return sandbox.root / ".briq" / "forks"


def forks_entries(sandbox) -> list[str]:
    return sorted(os.listdir(forks(sandbox))) if forks(sandbox).exists() else []


def packed(sandbox, envelope: dict) -> list[bytes]:
    """The parts of a snapshot, as the operator's gets read them."""
    directory = forks(sandbox) / envelope["snapshot"]
    return [(directory / f"part-{i:05d}").read_bytes() for i in range(envelope["parts"])]


def members(data: bytes) -> dict[str, tarfile.TarInfo]:
    with tarfile.open(fileobj=io.BytesIO(data)) as archive:
        return {member.name: member for member in archive}


def stage(sandbox, parts: list[bytes]) -> str:
    """Upload `parts` into the sandbox as the operator does; the staging directory."""
    upload = secrets.token_hex(16)
    directory = sandbox.root / ".briq" / "uploads" / upload
    directory.mkdir(parents=True)
    for index, part in enumerate(parts):
        (directory / f"part-{index:05d}").write_bytes(part)
    return f".briq/uploads/{upload}"


def fork_load(sandbox, parts: list[bytes], size: int | None = None, digest: str | None = None):
    data = b"".join(parts)
    staged = stage(sandbox, parts)
    call = sandbox.bridge(
        "fork-load",
        *("--staged", staged, "--parts", str(len(parts))),
        *("--size", str(len(data) if size is None else size)),
        *("--sha256", digest or sha(data), "--deadline", "30"),
    )
    assert not (sandbox.root / staged).exists(), "the staging directory is always removed"
    return call


def cut(data: bytes) -> list[bytes]:
    return [data[i : i + PART_BYTES] for i in range(0, len(data), PART_BYTES)]


def archive(*entries: tuple) -> bytes:
    """A tar of (name, kind, data or link target) entries, made as an attacker would."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, kind, content in entries:
            info = tarfile.TarInfo(name)
            info.type = kind
            info.mode = 0o755 if kind == tarfile.DIRTYPE else 0o644
            if kind in (tarfile.SYMTYPE, tarfile.LNKTYPE):
                info.linkname = content
                tar.addfile(info)
            elif kind == tarfile.REGTYPE:
                info.size = len(content)
                tar.addfile(info, io.BytesIO(content))
            else:
                info.devmajor, info.devminor = 1, 3
                tar.addfile(info)
    return out.getvalue()


def test_a_namespace_and_working_files_saved_in_one_sandbox_come_back_in_another(
    fresh_sandbox, target
):
    setup = fresh_sandbox.run(
        "import hashlib, os\n"
        "x = 41\n"
        "def f(n):\n"
        "    return n + x\n"
        "os.makedirs('data', exist_ok=True)\n"
        "open('data/notes.txt', 'w').write('written by user code')\n"
        f"big = os.urandom({2 * PART_BYTES + 12_345})\n"  # a snapshot of several parts
        "open('big.bin', 'wb').write(big)\n"
        "big_sha = hashlib.sha256(big).hexdigest()\n"
        "del big\n"
    )
    assert setup["status"] == "ok", setup
    snapshot = secrets.token_hex(20)
    saved = ok(fork_save(fresh_sandbox, snapshot=snapshot))
    assert set(saved) == {
        *("kind", "ok", "message", "snapshot", "parts", "size", "sha256", "files", "skipped"),
        *("saved", "unsaved", "state_bytes", "error"),
    }
    namespace = ["big_sha", "f", "hashlib", "os", "x"]
    assert saved["snapshot"] == snapshot and sorted(saved["saved"]) == namespace
    assert saved["unsaved"] == [] and saved["skipped"] == 0
    home = fresh_sandbox.user_dir
    assert saved["state_bytes"] == (home / STATE_FILE).stat().st_size > 0
    parts = packed(fresh_sandbox, saved)
    assert saved["parts"] == len(parts) >= 3
    assert {len(part) for part in parts[:-1]} == {PART_BYTES} and 0 < len(parts[-1])
    data = b"".join(parts)
    assert (len(data), sha(data)) == (saved["size"], saved["sha256"])
    names = members(data)
    assert {"data", "data/notes.txt", "big.bin", ".briq-state", STATE_FILE} <= set(names)
    assert saved["files"] == len(names)
    manifest = (forks(fresh_sandbox) / snapshot / "manifest.json").read_text()
    assert '"sha256": "' + saved["sha256"] in manifest

    loaded = ok(fork_load(target, parts, saved["size"], saved["sha256"]))
    assert loaded == {
        **saved,
        "message": loaded["message"],
        "snapshot": "",
        "skipped": 0,
        "saved": [],
        "unsaved": [],
        "state_bytes": 0,
    }
    new_home = target.user_dir
    assert (new_home / "data" / "notes.txt").read_text() == "written by user code"
    if SPLIT:  # extracted by the kernel user, as its own files
        assert (new_home / "data" / "notes.txt").stat().st_uid == KERNEL_UID
        assert (new_home / STATE_FILE).stat().st_uid == KERNEL_UID
    target.start_kernel()
    restored = target.bridge("restore-state")
    assert restored.returncode == 0 and restored.envelope["ok"], restored.envelope
    assert sorted(restored.envelope["saved"]) == namespace
    check = target.run(
        "(f(1), open('data/notes.txt').read(),"
        " hashlib.sha256(open('big.bin', 'rb').read()).hexdigest() == big_sha)"
    )
    assert check["output"] == repr((42, "written by user code", True)), check


def test_a_retried_fork_save_answers_the_same_manifest_without_saving_again(fresh_sandbox):
    assert fresh_sandbox.run("x = 1")["status"] == "ok"
    snapshot = secrets.token_hex(8)
    first = ok(fork_save(fresh_sandbox, snapshot=snapshot))
    state = fresh_sandbox.user_dir / STATE_FILE
    before = state.read_bytes(), packed(fresh_sandbox, first)
    assert fresh_sandbox.run("y = 2")["status"] == "ok"
    again = ok(fork_save(fresh_sandbox, snapshot=snapshot))
    assert again == {**first, "message": again["message"]}
    assert again["message"].startswith("already packed") and again["saved"] == ["x"]
    assert (state.read_bytes(), packed(fresh_sandbox, again)) == before
    assert forks_entries(fresh_sandbox) == [snapshot]


def test_a_suspended_executor_without_a_kernel_packs_the_namespace_it_saved(fresh_sandbox):
    assert fresh_sandbox.run("kept = 7")["status"] == "ok"
    assert fresh_sandbox.bridge("save-state").envelope["ok"]
    pid = fresh_sandbox.kernel_pid()
    fresh_sandbox.stop_kernel()
    assert process_gone(pid)
    # Without --saved the kernel must save first: there is none, so nothing is packed.
    call = fork_save(fresh_sandbox)
    assert error_code(call) == "state" and "no kernel" in call.envelope["message"]
    assert forks_entries(fresh_sandbox) == []
    envelope = ok(fork_save(fresh_sandbox, "--saved"))
    state = fresh_sandbox.user_dir / STATE_FILE
    assert (envelope["saved"], envelope["unsaved"]) == ([], [])
    assert envelope["state_bytes"] == state.stat().st_size > 0
    names = members(b"".join(packed(fresh_sandbox, envelope)))
    assert names[STATE_FILE].size == envelope["state_bytes"]
    assert fresh_sandbox.probe()["alive"] is False, "--saved never starts or asks a kernel"


def test_a_kernel_busy_past_the_deadline_packs_nothing(fresh_sandbox):
    running, go = fresh_sandbox.user_dir / "running", fresh_sandbox.user_dir / "go"
    action = (
        "import os, time\n"
        f"open({str(running)!r}, 'w').close()\n"
        f"while not os.path.exists({str(go)!r}):\n"
        "    time.sleep(0.05)\n"
        "'finished'"
    )
    with ThreadPoolExecutor(1) as pool:
        busy = pool.submit(fresh_sandbox.run, action, 60)
        deadline = time.monotonic() + 30
        while not running.exists():
            assert time.monotonic() < deadline and not busy.done()
            time.sleep(0.05)
        call = fork_save(fresh_sandbox, "--deadline", "2")
        assert error_code(call) == "state" and "did not answer" in call.envelope["message"]
        assert forks_entries(fresh_sandbox) == [], "no snapshot and no temporary"
        go.touch()
        assert busy.result(timeout=60)["output"] == "'finished'"


FIRST = ("first.txt", tarfile.REGTYPE, b"written only if the whole archive is accepted")
HOSTILE = {
    "dotdot": [("../escaped", tarfile.REGTYPE, b"x")],
    "dotdot_inside": [("sub/../../escaped", tarfile.REGTYPE, b"x")],
    "absolute": [("{outside}/escaped", tarfile.REGTYPE, b"x")],
    "symlink_then_file_through_it": [
        ("sub", tarfile.DIRTYPE, b""),
        ("link", tarfile.SYMTYPE, "sub"),
        ("link/escaped", tarfile.REGTYPE, b"x"),
    ],
    "file_then_file_below_it": [
        ("plain", tarfile.REGTYPE, b"x"),
        ("plain/escaped", tarfile.REGTYPE, b"x"),
    ],
    "absolute_symlink": [("link", tarfile.SYMTYPE, "/etc")],
    "outward_symlink": [("sub/link", tarfile.SYMTYPE, "../../etc")],
    "hard_link": [("hard", tarfile.LNKTYPE, "first.txt")],
    "device": [("null", tarfile.CHRTYPE, b"")],
    "fifo": [("pipe", tarfile.FIFOTYPE, b"")],
    "into_the_bridges_directory": [(".briq/bridge.py", tarfile.REGTYPE, b"evil")],
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_a_hostile_archive_is_refused_and_nothing_is_written(sandbox, case):
    if case == "into_the_bridges_directory" and SPLIT:
        pytest.skip("as root the user's directory is /work/home: its .briq is the user's own")
    bridge = (sandbox.root / ".briq" / "bridge.py").read_bytes()
    outside = sandbox.root.parent
    entries = [
        (name.format(outside=outside), kind, content) for name, kind, content in HOSTILE[case]
    ]
    call = fork_load(sandbox, cut(archive(FIRST, *entries)))
    assert error_code(call) == "refused", call.envelope
    assert user_entries(sandbox) == [], "every member is checked before any is written"
    assert not (outside / "escaped").exists() and not (sandbox.root / "escaped").exists()
    assert (sandbox.root / ".briq" / "bridge.py").read_bytes() == bridge


def test_a_member_through_a_symlink_already_on_disk_is_refused(sandbox):
    outside = sandbox.root.parent / "outside"
    outside.mkdir()
    outside.chmod(0o777)  # the kernel user could write there: only the refusal keeps it out
    link = sandbox.user_dir / "planted"
    link.symlink_to(outside)
    as_kernel_user(sandbox, link)
    call = fork_load(sandbox, cut(archive(FIRST, ("planted/escaped", tarfile.REGTYPE, b"x"))))
    assert error_code(call) == "refused"
    assert os.listdir(outside) == [] and user_entries(sandbox) == ["planted"]


def test_existing_files_and_symlinks_are_replaced_never_written_through(sandbox):
    victim = sandbox.root.parent / "victim"
    victim.write_bytes(b"root's own")
    user_file(sandbox, "a.txt", b"old")
    link = sandbox.user_dir / "b.txt"
    link.symlink_to(victim)
    as_kernel_user(sandbox, link)
    data = archive(
        ("a.txt", tarfile.REGTYPE, b"new a"),
        ("b.txt", tarfile.REGTYPE, b"new b"),
        ("dir", tarfile.DIRTYPE, b""),
        ("dir/c", tarfile.SYMTYPE, "../a.txt"),
    )
    envelope = ok(fork_load(sandbox, cut(data)))
    assert envelope["files"] == 4 and envelope["sha256"] == sha(data)
    home = sandbox.user_dir
    assert (home / "a.txt").read_bytes() == b"new a"
    assert not (home / "b.txt").is_symlink() and (home / "b.txt").read_bytes() == b"new b"
    assert victim.read_bytes() == b"root's own"
    assert os.readlink(home / "dir" / "c") == "../a.txt"
    assert user_entries(sandbox) == ["a.txt", "b.txt", "dir"], "no temporary is left"


@pytest.mark.parametrize("fault", ["altered", "missing"])
def test_an_altered_or_missing_part_is_a_mismatch_and_nothing_is_extracted(sandbox, fault):
    data = archive(FIRST, ("big", tarfile.REGTYPE, secrets.token_bytes(PART_BYTES)))
    parts = cut(data)
    assert len(parts) == 2
    size, digest = len(data), sha(data)
    if fault == "altered":
        parts[1] = parts[1][:100] + bytes([parts[1][100] ^ 1]) + parts[1][101:]
    else:
        parts = parts[:1]
    call = fork_load(sandbox, parts, size, digest)
    assert error_code(call) == "mismatch"
    assert user_entries(sandbox) == []


def test_a_directory_over_max_bytes_is_too_large_and_leaves_nothing(sandbox):
    user_file(sandbox, "big.bin", secrets.token_bytes(300_000))
    call = fork_save(sandbox, "--saved", "--max-bytes", "200000")
    assert error_code(call) == "too_large"
    assert forks_entries(sandbox) == []
    assert ok(fork_save(sandbox, "--saved", "--max-bytes", "400000"))["parts"] == 1


def test_fifos_and_outward_symlinks_are_skipped_and_counted_and_links_are_never_followed(sandbox):
    user_file(sandbox, "d/x", b"inside")
    for name, target in (("dl", "d"), ("abs", "/etc"), ("up", "../..")):
        link = sandbox.user_dir / name
        link.symlink_to(target)
        as_kernel_user(sandbox, link)
    fifo = sandbox.user_dir / "pipe"
    os.mkfifo(fifo)  # a writer-less FIFO: opening it to read would block the pack
    as_kernel_user(sandbox, fifo)
    envelope = ok(fork_save(sandbox, "--saved", "--deadline", "20"))
    assert (envelope["skipped"], envelope["files"], envelope["state_bytes"]) == (3, 3, 0)
    names = members(b"".join(packed(sandbox, envelope)))
    assert sorted(names) == ["d", "d/x", "dl"]
    assert names["dl"].issym() and names["dl"].linkname == "d"


def test_ipythons_own_history_database_stays_with_the_source(sandbox):
    user_file(sandbox, ".ipython/profile_default/history.sqlite", b"an open database")
    user_file(sandbox, ".ipythonrc", b"a user's file")
    envelope = ok(fork_save(sandbox, "--saved"))
    names = members(b"".join(packed(sandbox, envelope)))
    assert sorted(names) == [".ipythonrc"]


@pytest.mark.skipif(not SPLIT, reason="the kernel user's rights apply only when run as root")
def test_files_are_packed_with_the_kernel_users_rights(sandbox):
    secret = sandbox.user_dir / "secret"
    secret.write_bytes(b"root only")
    secret.chmod(0o600)
    call = fork_save(sandbox, "--saved")
    assert error_code(call) == "permission" and "secret" in call.envelope["message"]
    assert forks_entries(sandbox) == []


@pytest.mark.skipif(not SPLIT, reason="user code can read .briq when the bridge is not root")
def test_the_kernel_user_cannot_read_the_forks(fresh_sandbox):
    envelope = ok(fork_save(fresh_sandbox))
    directory = forks(fresh_sandbox)
    st = directory.stat()
    assert (st.st_uid, st.st_mode & 0o777) == (0, 0o700)
    part = directory / envelope["snapshot"] / "part-00000"
    code = (
        "import os\n"
        "done = []\n"
        f"for attempt in (lambda: os.listdir({str(directory)!r}), lambda: open({str(part)!r}),"
        f" lambda: os.rename({str(directory)!r}, 'stolen')):\n"
        "    try:\n"
        "        attempt()\n"
        "        done.append(attempt)\n"
        "    except OSError:\n"
        "        pass\n"
        "len(done)"
    )
    assert fresh_sandbox.run(code)["output"] == "0"


def test_old_snapshots_and_leftover_temporaries_are_pruned(sandbox):
    old, recent = secrets.token_hex(8), secrets.token_hex(8)
    leftover = f".{secrets.token_hex(8)}.abcd.tmp"
    for name in (old, recent, leftover):
        (forks(sandbox) / name).mkdir(parents=True)
        (forks(sandbox) / name / "part-00000").write_bytes(b"x")
    two_hours_ago = time.time() - 7_200
    os.utime(forks(sandbox) / old, (two_hours_ago, two_hours_ago))
    envelope = ok(fork_save(sandbox, "--saved"))
    assert forks_entries(sandbox) == sorted([recent, envelope["snapshot"]])


@pytest.mark.parametrize(
    ("command", "options"),
    [
        ("fork-save", ("--snapshot", "ABCDEF0123456789")),
        ("fork-save", ("--snapshot", "0123456789abcde")),
        ("fork-load", ("--staged", "../home")),
        ("fork-load", ("--staged", ".briq/uploads/../state")),
    ],
)
def test_a_malformed_snapshot_or_staging_directory_is_refused(sandbox, command, options):
    staged = ("--parts", "0", "--size", "0", "--sha256", sha(b""))
    call = sandbox.bridge(command, *options, *(staged if command == "fork-load" else ()))
    assert error_code(call) == "refused"
    assert forks_entries(sandbox) == [] and sandbox.user_dir.is_dir()
    assert (sandbox.root / ".briq" / "state").is_dir() or not SPLIT


def test_the_bridges_directory_is_neither_packed_nor_extracted_when_users_share_work(
    bridge_module, tmp_path
):
    # Without root the kernel user's directory is /work itself, the bridge's .briq in it.
    top = tmp_path / "work"
    (top / ".briq").mkdir(parents=True)
    (top / ".briq" / "bridge.py").write_text("the bridge")
    (top / "sub" / ".briq").mkdir(parents=True)
    (top / "sub" / ".briq" / "kept").write_text("user data")
    packed_file = tmp_path / "packed.tar"
    answer = bridge_module.pack_tree(
        str(top), ".briq", os.open(packed_file, os.O_WRONLY | os.O_CREAT)
    )
    assert sorted(members(packed_file.read_bytes())) == ["sub", "sub/.briq", "sub/.briq/kept"]
    assert answer == {"files": 3, "skipped": 0, "state_bytes": 0}
    hostile = tmp_path / "hostile.tar"
    hostile.write_bytes(archive(FIRST, (".briq/bridge.py", tarfile.REGTYPE, b"evil")))
    # fork-load checks every member first (extract False); extracting checks each again.
    for extract in (False, True):
        with pytest.raises(bridge_module.FileProblem) as caught:
            bridge_module.unpack_tree(str(top), ".briq", extract, os.open(hostile, os.O_RDONLY))
        assert caught.value.code == "refused" and ".briq" in str(caught.value)
        assert (top / "first.txt").exists() is extract
    assert (top / ".briq" / "bridge.py").read_text() == "the bridge"
    shutil.rmtree(top)
