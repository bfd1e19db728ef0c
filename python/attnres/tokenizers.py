"""The tokenizers of src/data/tokenizer.hpp, named by the same spec strings:

  "bytes"       UTF-8 bytes 0-255, end-of-text 256 (vocabulary 257)
  "gpt2:DIR"    GPT-2 byte-level BPE from DIR/encoder.json and DIR/vocab.bpe
  "sp:FILE"     a SentencePiece model (needs Debian's python3-sentencepiece)

encode() takes a str and adds no end-of-text; decode() gives a str (bytes that do not form UTF-8 are
replaced, as a byte-level token may end mid-character; decode_bytes() gives them raw) and writes the
end-of-text id as the literal "<|endoftext|>". The ids equal `attnres tokenizer encode`'s.
"""
from __future__ import annotations

import functools
import json
import os
import re
import unicodedata
from typing import Dict, Iterable, List

END_OF_TEXT = "<|endoftext|>"


def xxh3_64_hex(data: bytes) -> str:
    from .safetensors import xxh3_64_hex as digest  # numpy only where a hash is asked for
    return digest(data)


class TokenizerError(ValueError):
    """A bad spec or a missing or malformed tokenizer file; the message names it."""


class Tokenizer:
    spec: str
    vocab_size: int
    eot_id: int
    # The content hash attnres records beside the spec (metadata "tokenizer_hash", docs/data.md
    # "Content hash"): XXH3-64 of the tokenizer's files as 16 hex digits, equal to `attnres tokenizer info`'s.
    content_hash: str

    def encode(self, text: str) -> List[int]:
        raise NotImplementedError

    def decode_bytes(self, ids: Iterable[int]) -> bytes:
        raise NotImplementedError

    def decode(self, ids: Iterable[int]) -> str:
        return self.decode_bytes(ids).decode("utf-8", errors="replace")

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.spec!r}, vocab_size={self.vocab_size}, eot_id={self.eot_id})"


class BytesTokenizer(Tokenizer):
    spec = "bytes"
    vocab_size = 257
    eot_id = 256

    @property
    def content_hash(self) -> str:
        return xxh3_64_hex(b"attnres bytes tokenizer v1")  # the fixed name of the scheme (src/data/tokenizer.cpp)

    def encode(self, text: str) -> List[int]:
        return list(text.encode("utf-8"))

    def decode_bytes(self, ids: Iterable[int]) -> bytes:
        out = bytearray()
        for i in ids:
            i = int(i)
            if i == self.eot_id:
                out += END_OF_TEXT.encode()
            elif 0 <= i < 256:
                out.append(i)
            else:
                raise TokenizerError(f"token id {i} is outside the bytes vocabulary (257)")
        return bytes(out)


# ------------------------------------------------------------------------------------------------
# GPT-2
# ------------------------------------------------------------------------------------------------
# White_Space (the `regex` module's \s for str patterns, and src/data/gen_unicode_tables.py's Space);
# unicodedata does not expose the property. Letters are general category L*, numbers N*.
_WHITE_SPACE = (0x09, 0x0A, 0x0B, 0x0C, 0x0D, 0x20, 0x85, 0xA0, 0x1680, *range(0x2000, 0x200B), 0x2028, 0x2029,
                0x202F, 0x205F, 0x3000)


def _ranges(pred) -> str:
    """A regex character-class body of the code points where pred holds."""
    out, start, prev = [], None, None
    for cp in range(0x110000):
        if pred(cp):
            if start is None:
                start = cp
            prev = cp
        elif start is not None:
            out.append(re.escape(chr(start)) + ("" if prev == start else "-" + re.escape(chr(prev))))
            start = None
    if start is not None:
        out.append(re.escape(chr(start)) + ("" if prev == start else "-" + re.escape(chr(prev))))
    return "".join(out)


@functools.lru_cache(maxsize=1)
def _gpt2_pattern():
    """GPT-2's  's|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+  with the
    classes spelled out from unicodedata (Python's `re` has no \\p{..}, and its \\s is not White_Space)."""
    ws = set(_WHITE_SPACE)
    L = _ranges(lambda cp: cp not in ws and unicodedata.category(chr(cp))[0] == "L")
    N = _ranges(lambda cp: cp not in ws and unicodedata.category(chr(cp))[0] == "N")
    S = "".join(re.escape(chr(c)) for c in _WHITE_SPACE)
    return re.compile(f"'s|'t|'re|'ve|'m|'ll|'d| ?[{L}]+| ?[{N}]+| ?[^{S}{L}{N}]+|[{S}]+(?![^{S}])|[{S}]+")


def gpt2_pretokenize(text: str) -> List[str]:
    """The pieces GPT-2 encodes separately (src/data/gpt2_tokenizer.hpp gpt2_pretokenize)."""
    return _gpt2_pattern().findall(text)


def _byte_to_unicode() -> Dict[int, str]:
    """GPT-2's reversible map from bytes to printable code points (encoder.json's alphabet)."""
    printable = [b for b in range(256) if ord("!") <= b <= ord("~") or 0xA1 <= b <= 0xAC or 0xAE <= b <= 0xFF]
    out, n = {}, 0
    for b in range(256):
        if b in printable:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + n)
            n += 1
    return out


class Gpt2Tokenizer(Tokenizer):
    def __init__(self, directory: str, spec: str):
        self.spec = spec
        enc_path, bpe_path = os.path.join(directory, "encoder.json"), os.path.join(directory, "vocab.bpe")
        if not os.path.isdir(directory):
            raise TokenizerError(f"GPT-2 tokenizer directory '{directory}' does not exist")
        try:
            with open(enc_path, "rb") as f:
                encoder_raw = f.read()
            with open(bpe_path, "rb") as f:
                merges_raw = f.read()
            encoder = json.loads(encoder_raw.decode("utf-8"))
            merge_lines = merges_raw.decode("utf-8").split("\n")
        except OSError as e:
            raise TokenizerError(f"cannot read the GPT-2 tokenizer in '{directory}': {e}") from None
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise TokenizerError(f"{enc_path}: malformed JSON: {e}") from None
        # The hex digests of both files, concatenated, hashed again (src/data/gpt2_tokenizer.cpp).
        self.content_hash = xxh3_64_hex((xxh3_64_hex(encoder_raw) + xxh3_64_hex(merges_raw)).encode())
        if not isinstance(encoder, dict) or not encoder:
            raise TokenizerError(f"{enc_path}: expected a JSON object of token -> id")
        self.vocab_size = len(encoder)
        if END_OF_TEXT not in encoder:
            raise TokenizerError(f"{enc_path}: no '{END_OF_TEXT}' token")
        self.eot_id = int(encoder[END_OF_TEXT])
        b2u = _byte_to_unicode()
        self._u2b = {u: b for b, u in b2u.items()}
        self._b2u = b2u
        self._encoder = encoder
        self._id_bytes: List[bytes] = [b""] * self.vocab_size
        for token, i in encoder.items():
            if not isinstance(i, int) or not 0 <= i < self.vocab_size:
                raise TokenizerError(f"{enc_path}: id of token '{token}' must be an integer below {self.vocab_size}")
            if token == END_OF_TEXT:
                self._id_bytes[i] = END_OF_TEXT.encode()
                continue
            try:
                self._id_bytes[i] = bytes(self._u2b[ch] for ch in token)
            except KeyError:
                raise TokenizerError(f"{enc_path}: token '{token}' is not a byte-level token") from None
        self._ranks = {}
        for n, line in enumerate(merge_lines, 1):
            line = line.rstrip("\r")
            if not line or (n == 1 and line.startswith("#version")):
                continue
            parts = line.split(" ")
            if len(parts) != 2 or not all(parts):
                raise TokenizerError(f"{bpe_path}:{n}: expected 'LEFT RIGHT'")
            self._ranks.setdefault((parts[0], parts[1]), len(self._ranks))
        self._cache: Dict[str, List[int]] = {}

    def _bpe(self, piece: str) -> List[int]:
        """GPT-2's merge loop: merge every occurrence of the lowest-ranked pair, repeat."""
        word = [self._b2u[b] for b in piece.encode("utf-8")]
        ranks = self._ranks
        while len(word) > 1:
            best = min(zip(word, word[1:]), key=lambda p: ranks.get(p, float("inf")))
            if best not in ranks:
                break
            merged, k = [], 0
            while k < len(word):
                if k + 1 < len(word) and word[k] == best[0] and word[k + 1] == best[1]:
                    merged.append(best[0] + best[1])
                    k += 2
                else:
                    merged.append(word[k])
                    k += 1
            word = merged
        try:
            return [self._encoder[w] for w in word]
        except KeyError as e:
            raise TokenizerError(f"{self.spec}: merge result {e} missing from encoder.json") from None

    def encode(self, text: str) -> List[int]:
        out: List[int] = []
        for piece in gpt2_pretokenize(text):
            ids = self._cache.get(piece)
            if ids is None:
                ids = self._bpe(piece)
                if len(self._cache) < 100_000:
                    self._cache[piece] = ids
            out.extend(ids)
        return out

    def decode_bytes(self, ids: Iterable[int]) -> bytes:
        out = bytearray()
        for i in ids:
            i = int(i)
            if not 0 <= i < self.vocab_size:
                raise TokenizerError(f"token id {i} is outside the GPT-2 vocabulary ({self.vocab_size})")
            out += self._id_bytes[i]
        return bytes(out)


# ------------------------------------------------------------------------------------------------
# SentencePiece
# ------------------------------------------------------------------------------------------------
class SentencePieceTokenizer(Tokenizer):
    def __init__(self, file: str, spec: str):
        try:
            import sentencepiece  # Debian: python3-sentencepiece
        except ImportError:
            raise TokenizerError(f"tokenizer '{spec}' needs the sentencepiece module: install Debian's "
                                 "python3-sentencepiece (apt-get install python3-sentencepiece; a venv made with "
                                 "--system-site-packages sees it)") from None
        if not os.path.isfile(file):
            raise TokenizerError(f"SentencePiece model '{file}' does not exist")
        with open(file, "rb") as f:
            proto = f.read()
        self.content_hash = xxh3_64_hex(proto)
        self._sp = sentencepiece.SentencePieceProcessor()
        try:
            self._sp.LoadFromSerializedProto(proto)
        except Exception as e:  # sentencepiece raises RuntimeError/OSError depending on the version
            raise TokenizerError(f"cannot load SentencePiece model '{file}': {e}") from None
        self.spec = spec
        self.vocab_size = self._sp.GetPieceSize()
        self.eot_id = self._sp.PieceToId(END_OF_TEXT)
        if not (0 <= self.eot_id < self.vocab_size and self._sp.IdToPiece(self.eot_id) == END_OF_TEXT):
            raise TokenizerError(f"SentencePiece model '{file}' has no '{END_OF_TEXT}' piece "
                                 "(train one with 'attnres tokenizer train')")

    def encode(self, text: str) -> List[int]:
        # attnres cuts text into chunks only where that cannot change the result (sp_tokenizer.hpp).
        return list(self._sp.EncodeAsIds(text))

    def decode_bytes(self, ids: Iterable[int]) -> bytes:
        return self.decode(ids).encode("utf-8")

    def decode(self, ids: Iterable[int]) -> str:
        # Control pieces decode to nothing in SentencePiece; end-of-text is written out as gpt2 does.
        text, run = [], []
        for i in ids:
            i = int(i)
            if not 0 <= i < self.vocab_size:
                raise TokenizerError(f"token id {i} is outside the SentencePiece vocabulary ({self.vocab_size})")
            if i == self.eot_id:
                if run:
                    text.append(self._sp.DecodeIds(run))
                run = []
                text.append(END_OF_TEXT)
            else:
                run.append(i)
        if run:
            text.append(self._sp.DecodeIds(run))
        return "".join(text)


def _absolute(spec: str, path: str) -> str:
    if not path:
        raise TokenizerError(f"tokenizer spec '{spec}' names no path")
    p = os.path.normpath(os.path.abspath(path))
    return p.rstrip("/") or "/"


def make_tokenizer(spec: str) -> Tokenizer:
    """A tokenizer from its spec; relative paths are taken from the working directory, and spec is
    made absolute as attnres does."""
    if isinstance(spec, Tokenizer):
        return spec
    if spec == "bytes":
        return BytesTokenizer()
    if spec.startswith("gpt2:"):
        d = _absolute(spec, spec[5:])
        return Gpt2Tokenizer(d, "gpt2:" + d)
    if spec.startswith("sp:"):
        f = _absolute(spec, spec[3:])
        return SentencePieceTokenizer(f, "sp:" + f)
    raise TokenizerError(f"unknown tokenizer spec '{spec}' (expected 'bytes', 'gpt2:DIR' or 'sp:FILE')")
