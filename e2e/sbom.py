#!/usr/bin/env python3
"""Writes an SPDX 2.3 JSON SBOM of an image archive (docker-archive, as e2e/images.sh saves it).

What it lists, read from the archive's layers (the later layer wins for a path):
  * Debian packages: var/lib/dpkg/status and var/lib/dpkg/status.d/* (distroless keeps them there);
  * npm packages: every node_modules/<name>/package.json (a global install and its dependencies);
  * Rust crates: the --crates file (`cargo tree --prefix none` lines, "name vX.Y.Z"), for images
    that carry one of this repository's binaries.

Usage: sbom.py --archive IMAGE.tar --name REF --crates CRATES.txt --output OUT.spdx.json
"""

import argparse
import datetime
import hashlib
import json
import re
import sys
import tarfile
import urllib.parse


def layer_files(archive, wanted):
    """{path: bytes} of the files whose path `wanted` accepts, over every layer in order."""
    files = {}
    with tarfile.open(archive) as outer:
        manifest = json.load(outer.extractfile("manifest.json"))
        if len(manifest) != 1:
            sys.exit(f"sbom.py: {archive} holds {len(manifest)} images, expected one")
        config = json.load(outer.extractfile(manifest[0]["Config"]))
        for layer in manifest[0]["Layers"]:
            with tarfile.open(fileobj=outer.extractfile(layer)) as inner:
                for member in inner:
                    path = member.name.lstrip("./")
                    base = path.rsplit("/", 1)[-1]
                    if base.startswith(".wh."):
                        gone = path[: len(path) - len(base)] + base[4:]
                        files = {p: d for p, d in files.items() if p != gone and not p.startswith(gone + "/")}
                    elif member.isfile() and wanted(path):
                        files[path] = inner.extractfile(member).read()
    return config, files


def is_wanted(path):
    return (
        path == "var/lib/dpkg/status"
        or path.startswith("var/lib/dpkg/status.d/")
        or re.search(r"(^|/)node_modules/(@[^/]+/)?[^/]+/package\.json$", path) is not None
    )


def deb_packages(files):
    found = []
    for path, data in files.items():
        if not (path == "var/lib/dpkg/status" or path.startswith("var/lib/dpkg/status.d/")):
            continue
        for stanza in data.decode("utf-8", "replace").split("\n\n"):
            fields = dict(
                line.split(": ", 1) for line in stanza.splitlines() if ": " in line and not line.startswith(" ")
            )
            if "Package" in fields and "Version" in fields and "installed" in fields.get("Status", "installed"):
                found.append((fields["Package"], fields["Version"], fields.get("Architecture", "")))
    return sorted(set(found))


def npm_packages(files):
    found = set()
    for path, data in files.items():
        if "node_modules/" not in path:
            continue
        try:
            package = json.loads(data)
        except ValueError:
            continue
        if isinstance(package, dict) and package.get("name") and package.get("version"):
            found.add((package["name"], package["version"], package.get("license") if isinstance(package.get("license"), str) else None))
    return sorted(found)


def crates(path):
    found = set()
    with open(path) as lines:
        for line in lines:
            parts = line.split()
            if len(parts) >= 2 and parts[1].startswith("v"):
                found.add((parts[0], parts[1][1:]))
    return sorted(found)


def spdx_id(kind, name, version):
    return "SPDXRef-" + re.sub(r"[^A-Za-z0-9.-]", "-", f"{kind}-{name}-{version}")


def package(kind, name, version, purl, license_declared=None):
    return {
        "SPDXID": spdx_id(kind, name, version),
        "name": name,
        "versionInfo": version,
        "downloadLocation": "NOASSERTION",
        "filesAnalyzed": False,
        "licenseConcluded": "NOASSERTION",
        "licenseDeclared": license_declared or "NOASSERTION",
        "supplier": "NOASSERTION",
        "externalRefs": [{"referenceCategory": "PACKAGE-MANAGER", "referenceType": "purl", "referenceLocator": purl}],
    }


def main():
    args = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    args.add_argument("--archive", required=True)
    args.add_argument("--name", required=True)
    args.add_argument("--crates", required=True)
    args.add_argument("--output", required=True)
    opts = args.parse_args()

    config, files = layer_files(opts.archive, is_wanted)
    with open(opts.archive, "rb") as archive:
        digest = hashlib.sha256(archive.read()).hexdigest()
    labels = (config.get("config") or {}).get("Labels") or {}
    repository, _, tag = opts.name.rpartition(":")
    image = package("image", opts.name, tag, f"pkg:oci/{repository.rsplit('/', 1)[-1]}@sha256:{digest}?repository_url={urllib.parse.quote(repository)}")
    image["SPDXID"] = "SPDXRef-image"
    image["licenseDeclared"] = labels.get("org.opencontainers.image.licenses", "NOASSERTION")
    image["downloadLocation"] = labels.get("org.opencontainers.image.source", "NOASSERTION")
    packages = [image]
    for name, version, arch in deb_packages(files):
        packages.append(package("deb", name, version, f"pkg:deb/debian/{name}@{urllib.parse.quote(version)}?arch={arch}&distro=debian-12"))
    for name, version, license_declared in npm_packages(files):
        purl_name = urllib.parse.quote(name, safe="/").replace("@", "%40", 1) if name.startswith("@") else name
        packages.append(package("npm", name, version, f"pkg:npm/{purl_name}@{version}", license_declared))
    for name, version in crates(opts.crates):
        packages.append(package("cargo", name, version, f"pkg:cargo/{name}@{version}"))
    # An SPDX id names one element: a package found twice (two copies in node_modules) is listed once.
    unique = {p["SPDXID"]: p for p in packages}
    document = {
        "spdxVersion": "SPDX-2.3",
        "dataLicense": "CC0-1.0",
        "SPDXID": "SPDXRef-DOCUMENT",
        "name": opts.name,
        "documentNamespace": f"https://kandev.dev/spdx/{opts.name.replace(':', '/')}/{digest}",
        "creationInfo": {
            "created": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "creators": ["Tool: kandev-operator-e2e/sbom.py"],
            "comment": f"image archive sha256:{digest}; revision {labels.get('org.opencontainers.image.revision', 'unknown')}",
        },
        "packages": list(unique.values()),
        "documentDescribes": ["SPDXRef-image"],
        "relationships": [
            {"spdxElementId": "SPDXRef-image", "relationshipType": "CONTAINS", "relatedSpdxElement": p}
            for p in unique
            if p != "SPDXRef-image"
        ],
    }
    with open(opts.output, "w") as output:
        json.dump(document, output, indent=1)
    kinds = {}
    for p in unique:
        kind = p.split("-", 2)[1]
        kinds[kind] = kinds.get(kind, 0) + 1
    summary = ", ".join(f"{count} {kind}" for kind, count in sorted(kinds.items()) if kind != "image")
    print(f"[sbom.py] {opts.output}: {summary}", file=sys.stderr)


if __name__ == "__main__":
    main()
