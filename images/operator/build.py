#!/usr/bin/env python3
"""Builds the operator image without a container engine, the way distroless images are made.

Two layers, written as an OCI image layout (`oci-layout`, `index.json`, `blobs/sha256/`):
  1. the Debian packages of `packages`, unpacked from their .debs (`dpkg-deb --fsys-tarfile`),
     the CA bundle `update-ca-certificates` would have made from them, and `rootfs/` (the
     non-root user 65532, nsswitch.conf), plus /tmp and the user's home;
  2. the operator binary at /usr/local/bin/briq-operator.
Every entry is owned by root (the home by 65532), dated SOURCE_DATE_EPOCH (the commit's time) and
written in name order; gzip carries no name and no time: the same inputs give the same digest.
Beside the layout: `sbom.spdx.json` (SPDX 2.3: the packages with their .debs' checksums, the
crates linked into the binary from Cargo.lock) and `digest` (the manifest's).

    build.py --binary target/release/briq-operator --debs DIR --out DIR
    build.py --describe     what the image installs, as JSON (tests/image.rs compares the
                            Dockerfile with it)

Only the standard library: it runs wherever the operator is built.
"""

from __future__ import annotations

import argparse
import datetime
import gzip
import hashlib
import io
import json
import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent

BINARY = "usr/local/bin/briq-operator"
USER = "65532:65532"
HOME = "home/nonroot"
ENTRYPOINT = ["/" + BINARY]
CMD = ["run"]
CA_BUNDLE = "etc/ssl/certs/ca-certificates.crt"
# Directories made beside the packages' own: (path, mode, owner).
DIRECTORIES = [("tmp", 0o1777, 0), (HOME, 0o700, 65532)]
ENV = ["PATH=/usr/local/bin:/usr/bin:/bin", "SSL_CERT_FILE=/" + CA_BUNDLE]
LABELS = (
    "org.opencontainers.image.title",
    "org.opencontainers.image.description",
    "org.opencontainers.image.source",
    "org.opencontainers.image.revision",
    "org.opencontainers.image.version",
    "org.opencontainers.image.licenses",
    "org.opencontainers.image.created",
)
LAYER_MEDIA_TYPE = "application/vnd.oci.image.layer.v1.tar+gzip"


def packages() -> list[str]:
    lines = (HERE / "packages").read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


def describe() -> dict:
    return {
        "packages": packages(),
        "binary": "/" + BINARY,
        "user": USER,
        "workdir": "/" + HOME,
        "entrypoint": ENTRYPOINT,
        "cmd": CMD,
        "env": ENV,
        "labels": list(LABELS),
        "directories": [["/" + path, f"{mode:04o}", owner] for path, mode, owner in DIRECTORIES],
        "rootfs": sorted(
            "/" + str(p.relative_to(HERE / "rootfs")) for p in (HERE / "rootfs").rglob("*")
        ),
    }


def cargo_package() -> dict[str, str]:
    """The string fields of Cargo.toml's [package] table (no TOML parser before Python 3.11)."""
    text = (REPO / "Cargo.toml").read_text()
    table = text.split("[package]", 1)[1].split("\n[", 1)[0]
    return dict(re.findall(r'^([a-z-]+) = "([^"]*)"$', table, re.MULTILINE))


def lock_checksums() -> dict[tuple[str, str], str]:
    """(name, version) → checksum of every registry crate in Cargo.lock."""
    checksums = {}
    for block in (REPO / "Cargo.lock").read_text().split("[[package]]")[1:]:
        fields = dict(re.findall(r'^([a-z]+) = "([^"]*)"$', block, re.MULTILINE))
        if "checksum" in fields:
            checksums[(fields["name"], fields["version"])] = fields["checksum"]
    return checksums


def git(*args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(REPO), *args], check=True, capture_output=True, text=True
    ).stdout.strip()


class Layer:
    """A tar layer gathered in memory, then written in name order with fixed metadata."""

    def __init__(self, mtime: int) -> None:
        self.mtime = mtime
        self.entries: dict[str, tuple[tarfile.TarInfo, bytes | None]] = {}

    def add(self, info: tarfile.TarInfo, data: bytes | None, owner: int = 0) -> None:
        name = os.path.normpath(info.name.removeprefix("./")).lstrip("/")
        if name in ("", "."):
            return
        info.name = name
        info.mtime = self.mtime
        info.uid = info.gid = owner
        info.uname = info.gname = ""
        info.pax_headers = {}
        existing = self.entries.get(name)
        if existing is not None:
            same = existing[0].type == info.type and existing[1] == data
            if not (info.isdir() or same):
                raise SystemExit(f"build.py: two different {name} in the image")
            if info.isdir():
                return
        self.entries[name] = (info, data)

    def directory(self, name: str, mode: int, owner: int = 0) -> None:
        info = tarfile.TarInfo(name)
        info.type = tarfile.DIRTYPE
        info.mode = mode
        self.entries.pop(name, None)
        self.add(info, None, owner)

    def file(self, name: str, data: bytes, mode: int) -> None:
        info = tarfile.TarInfo(name)
        info.size = len(data)
        info.mode = mode
        self.add(info, data)

    def parents(self) -> None:
        """Every parent directory as an entry of its own (root-owned, 0755) unless present."""
        for name in list(self.entries):
            parent = os.path.dirname(name)
            while parent and parent not in self.entries:
                self.directory(parent, 0o755)
                parent = os.path.dirname(parent)

    def write(self) -> tuple[bytes, str]:
        """The gzipped layer and its diff id (the uncompressed tar's digest)."""
        self.parents()
        tar_bytes = io.BytesIO()
        with tarfile.open(fileobj=tar_bytes, mode="w", format=tarfile.PAX_FORMAT) as tar:
            for name in sorted(self.entries):
                info, data = self.entries[name]
                tar.addfile(info, io.BytesIO(data) if data is not None else None)
        raw = tar_bytes.getvalue()
        compressed = io.BytesIO()
        with gzip.GzipFile(filename="", mode="wb", fileobj=compressed, mtime=0) as out:
            out.write(raw)
        return compressed.getvalue(), "sha256:" + hashlib.sha256(raw).hexdigest()


def deb_field(deb: Path, field: str) -> str:
    return subprocess.run(
        ["dpkg-deb", "--field", str(deb), field], check=True, capture_output=True, text=True
    ).stdout.strip()


def find_debs(debs: Path) -> dict[str, Path]:
    """One .deb per package of `packages`, by its own Package field."""
    found: dict[str, Path] = {}
    for deb in sorted(debs.glob("*.deb")):
        found[deb_field(deb, "Package")] = deb
    missing = [name for name in packages() if name not in found]
    if missing:
        raise SystemExit(f"build.py: no .deb for {missing} in {debs} (tests/tools/build.sh)")
    return {name: found[name] for name in packages()}


def unpack_deb(layer: Layer, deb: Path) -> None:
    with subprocess.Popen(["dpkg-deb", "--fsys-tarfile", str(deb)], stdout=subprocess.PIPE) as p:
        with tarfile.open(fileobj=p.stdout, mode="r|") as tar:
            for member in tar:
                data = tar.extractfile(member).read() if member.isfile() else None
                layer.add(member, data)
    if p.returncode != 0:
        raise SystemExit(f"build.py: dpkg-deb could not read {deb}")


def ca_bundle(layer: Layer) -> bytes:
    """What update-ca-certificates (ca-certificates' postinst) concatenates: every certificate
    the package ships, in name order."""
    names = sorted(
        name
        for name in layer.entries
        if name.startswith("usr/share/ca-certificates/") and name.endswith(".crt")
    )
    if not names:
        raise SystemExit("build.py: ca-certificates shipped no certificate")
    return b"".join(layer.entries[name][1] for name in names)


def crates() -> list[tuple[str, str, str | None]]:
    """The crates linked into the operator binary (normal dependencies, no build scripts or
    procedural macros), with Cargo.lock's checksums."""
    tree = subprocess.run(
        ["cargo", "tree", "--locked", "--offline", "-p", "briq-operator"]
        + ["-e", "normal,no-proc-macro", "--prefix", "none", "-f", "{p}"],
        cwd=REPO,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    checksums = lock_checksums()
    found = set()
    for line in tree.splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[1].startswith("v"):
            found.add((parts[0], parts[1][1:]))
    return [(name, version, checksums.get((name, version))) for name, version in sorted(found)]


def sha256_file(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def spdx_id(kind: str, name: str) -> str:
    return "SPDXRef-" + kind + "-" + "".join(c if c.isalnum() or c in ".-" else "-" for c in name)


def sbom(digest: str, version: str, created: str, debs: dict[str, Path], linked: list) -> dict:
    image_id = "SPDXRef-Image"
    packages_ = [
        {
            "SPDXID": image_id,
            "name": "briq-operator",
            "versionInfo": version,
            "downloadLocation": "NOASSERTION",
            "checksums": [{"algorithm": "SHA256", "checksumValue": digest.split(":", 1)[1]}],
            "primaryPackagePurpose": "CONTAINER",
        }
    ]
    for name, deb in debs.items():
        deb_version = deb_field(deb, "Version")
        packages_.append(
            {
                "SPDXID": spdx_id("deb", name),
                "name": name,
                "versionInfo": deb_version,
                "supplier": "Organization: Debian",
                "downloadLocation": "NOASSERTION",
                "checksums": [{"algorithm": "SHA256", "checksumValue": sha256_file(deb)}],
                "externalRefs": [
                    {
                        "referenceCategory": "PACKAGE-MANAGER",
                        "referenceType": "purl",
                        "referenceLocator": f"pkg:deb/debian/{name}@{deb_version}"
                        f"?arch={deb_field(deb, 'Architecture')}&distro=debian-12",
                    }
                ],
            }
        )
    for name, crate_version, checksum in linked:
        entry = {
            "SPDXID": spdx_id("crate", f"{name}-{crate_version}"),
            "name": name,
            "versionInfo": crate_version,
            "downloadLocation": "NOASSERTION",
            "externalRefs": [
                {
                    "referenceCategory": "PACKAGE-MANAGER",
                    "referenceType": "purl",
                    "referenceLocator": f"pkg:cargo/{name}@{crate_version}",
                }
            ],
        }
        if checksum:
            entry["checksums"] = [{"algorithm": "SHA256", "checksumValue": checksum}]
        packages_.append(entry)
    for package in packages_:
        package.setdefault("licenseConcluded", "NOASSERTION")
        package.setdefault("licenseDeclared", "NOASSERTION")
        package.setdefault("copyrightText", "NOASSERTION")
    return {
        "spdxVersion": "SPDX-2.3",
        "dataLicense": "CC0-1.0",
        "SPDXID": "SPDXRef-DOCUMENT",
        "name": f"briq-operator-{version}",
        "documentNamespace": f"https://briq.cloud/spdx/briq-operator/{digest}",
        "creationInfo": {"created": created, "creators": ["Tool: images/operator/build.py"]},
        "documentDescribes": [image_id],
        "packages": packages_,
        "relationships": [
            {
                "spdxElementId": image_id,
                "relationshipType": "CONTAINS",
                "relatedSpdxElement": package["SPDXID"],
            }
            for package in packages_[1:]
        ],
    }


def canonical(document: dict) -> bytes:
    return json.dumps(document, sort_keys=True, separators=(",", ":")).encode()


class Blobs:
    def __init__(self, out: Path) -> None:
        self.dir = out / "blobs" / "sha256"
        self.dir.mkdir(parents=True, exist_ok=True)

    def put(self, data: bytes, media_type: str) -> dict:
        digest = hashlib.sha256(data).hexdigest()
        (self.dir / digest).write_bytes(data)
        return {"mediaType": media_type, "digest": "sha256:" + digest, "size": len(data)}


def build(binary: Path, debs_dir: Path, out: Path) -> str:
    epoch = int(os.environ.get("SOURCE_DATE_EPOCH") or git("log", "-1", "--format=%ct"))
    created = datetime.datetime.fromtimestamp(epoch, datetime.timezone.utc)
    created = created.strftime("%Y-%m-%dT%H:%M:%SZ")
    package = cargo_package()
    version = package["version"]
    labels = dict(
        zip(
            LABELS,
            (
                "briq-operator",
                package["description"],
                package["repository"],
                os.environ.get("BRIQ_IMAGE_REVISION") or git("rev-parse", "HEAD"),
                version,
                package["license"],
                created,
            ),
            strict=True,
        )
    )

    debs = find_debs(debs_dir)
    system = Layer(epoch)
    for deb in debs.values():
        unpack_deb(system, deb)
    system.file(CA_BUNDLE, ca_bundle(system), 0o644)
    for path in sorted((HERE / "rootfs").rglob("*")):
        if path.is_file():
            system.file(str(path.relative_to(HERE / "rootfs")), path.read_bytes(), 0o644)
    for path, mode, owner in DIRECTORIES:
        system.directory(path, mode, owner)
    app = Layer(epoch)
    app.file(BINARY, binary.read_bytes(), 0o755)

    out.mkdir(parents=True, exist_ok=True)
    blobs = Blobs(out)
    layers, diff_ids = [], []
    for layer in (system, app):
        data, diff_id = layer.write()
        layers.append(blobs.put(data, LAYER_MEDIA_TYPE))
        diff_ids.append(diff_id)
    config = {
        "architecture": "amd64",
        "os": "linux",
        "created": created,
        "config": {
            "User": USER,
            "Env": ENV,
            "Entrypoint": ENTRYPOINT,
            "Cmd": CMD,
            "WorkingDir": "/" + HOME,
            "Labels": labels,
        },
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
        "history": [
            {"created": created, "created_by": "images/operator/build.py: " + " ".join(debs)},
            {"created": created, "created_by": "images/operator/build.py: /" + BINARY},
        ],
    }
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": blobs.put(canonical(config), "application/vnd.oci.image.config.v1+json"),
        "layers": layers,
        "annotations": {key: labels[key] for key in LABELS},
    }
    descriptor = blobs.put(canonical(manifest), manifest["mediaType"])
    descriptor["annotations"] = {"org.opencontainers.image.ref.name": version}
    index = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [descriptor],
    }
    (out / "index.json").write_bytes(canonical(index))
    (out / "oci-layout").write_bytes(canonical({"imageLayoutVersion": "1.0.0"}))
    digest = descriptor["digest"]
    document = sbom(digest, version, created, debs, crates())
    (out / "sbom.spdx.json").write_text(json.dumps(document, indent=1, sort_keys=True) + "\n")
    (out / "digest").write_text(digest + "\n")
    return digest


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--describe", action="store_true")
    parser.add_argument("--binary", type=Path)
    parser.add_argument("--debs", type=Path)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if args.describe:
        json.dump(describe(), sys.stdout, indent=1)
        print()
        return
    if not (args.binary and args.debs and args.out):
        parser.error("--binary, --debs and --out are required (or --describe)")
    print(build(args.binary, args.debs, args.out))


if __name__ == "__main__":
    main()
