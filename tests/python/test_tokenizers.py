"""attnres.make_tokenizer: the same ids as the C++ tokenizers (`attnres tokenizer encode`) for bytes,
gpt2:DIR (the shared GPT-2 files) and sp:FILE (a model `attnres tokenizer train` makes here)."""
import os
import sys
import unittest
from unittest import mock

import support
import attnres
from attnres.tokenizers import TokenizerError, gpt2_pretokenize

GPT2_DIR = os.path.join(support.SHARED_DATA, "tokenizers", "gpt2")
# Text that exercises the pre-tokeniser's classes and BPE beyond ASCII (written here).
TRICKY = ("Hello world! I'm  here\n\nok They'll've 'S  \t x  123abc\u2460\u00bd \u4e2d\u6587!!?\u3000\u3000end "
          "a\u00a0b\u2028c   caf\u00e9 na\u00efve \U0001F600 <|endoftext|> \x1cX\x1cY tabs\t\tand d\u00f6nn\u00e9es ")


def cli_ids(spec, path):
    line = support.cli("tokenizer", "encode", "--tokenizer", spec, path).stdout.strip()
    return [int(x) for x in line.split()] if line else []


def cli_hash(spec):
    """The content hash `attnres tokenizer info` prints (what weights and manifests record)."""
    out = support.cli("tokenizer", "info", "--tokenizer", spec).stdout
    return next(line.split(": ", 1)[1] for line in out.splitlines() if line.startswith("hash: "))


class TokenizerTest(unittest.TestCase):
    def setUp(self):
        self.tmp = support.TempDir("tok")
        self.addCleanup(self.tmp.cleanup)
        with open(self.tmp("tricky.txt"), "w", encoding="utf-8") as f:
            f.write(TRICKY)

    def test_bytes(self):
        tok = attnres.make_tokenizer("bytes")
        self.assertEqual((tok.vocab_size, tok.eot_id, tok.spec), (257, 256, "bytes"))
        ids = tok.encode("d\u00e9j\u00e0")
        self.assertEqual(ids, list("d\u00e9j\u00e0".encode()))
        self.assertEqual(tok.decode(ids + [256]), "d\u00e9j\u00e0<|endoftext|>")
        self.assertEqual(tok.decode(ids[:2]), "d\ufffd")  # half a character: replaced, raw in decode_bytes
        self.assertEqual(tok.decode_bytes(ids[:2]), b"d\xc3")
        with self.assertRaisesRegex(TokenizerError, "outside the bytes vocabulary"):
            tok.decode([257])
        if os.path.exists(support.BINARY):
            self.assertEqual(tok.encode(TRICKY), cli_ids("bytes", self.tmp("tricky.txt")))
            self.assertEqual(tok.content_hash, cli_hash("bytes"))

    def test_specs_and_errors(self):
        for spec, message in (("gpt", "unknown tokenizer spec 'gpt'"), ("gpt2:", "names no path"),
                              ("gpt2:/nonexistent/attnres", "'/nonexistent/attnres' does not exist"),
                              ("sp:/nonexistent/a.model", "'/nonexistent/a.model' does not exist")):
            with self.assertRaisesRegex(TokenizerError, message):
                attnres.make_tokenizer(spec)

    def test_gpt2_matches_the_cpp_tokenizer(self):
        if not os.path.isfile(os.path.join(GPT2_DIR, "encoder.json")):
            self.skipTest(f"no GPT-2 tokenizer files in {GPT2_DIR}")
        tok = attnres.make_tokenizer("gpt2:" + GPT2_DIR)
        self.assertEqual((tok.vocab_size, tok.eot_id), (50257, 50256))
        self.assertEqual(tok.spec, "gpt2:" + os.path.abspath(GPT2_DIR))
        self.assertEqual(tok.encode("Hello world"), [15496, 995])
        # the C++ test's pieces (tests/data/test_tokenizers.cpp, from Python `regex` and GPT-2's encoder.py)
        self.assertEqual(gpt2_pretokenize("I'm  here\n\nok "), ["I", "'m", " ", " here", "\n", "\n", "ok", " "])
        self.assertEqual(gpt2_pretokenize("They'll've 'S  \t x"), ["They", "'ll", "'ve", " '", "S", "  \t", " x"])
        self.assertEqual(gpt2_pretokenize("  123abc\u2460\u00bd \u4e2d\u6587!!?\u3000\u3000end"),
                         [" ", " 123", "abc", "\u2460\u00bd", " \u4e2d\u6587", "!!?", "\u3000", "\u3000", "end"])
        self.assertEqual(gpt2_pretokenize("a\u00a0b\u2028c   "), ["a", "\u00a0", "b", "\u2028", "c", "   "])
        self.assertEqual(gpt2_pretokenize("\x1cX\x1cY"), ["\x1c", "X", "\x1c", "Y"])
        ids = tok.encode(TRICKY)
        self.assertEqual(tok.decode(ids), TRICKY)
        self.assertNotIn(tok.eot_id, ids)  # the literal string is ordinary text
        self.assertEqual(tok.decode([tok.eot_id]), "<|endoftext|>")
        support.need_binary(self)
        self.assertEqual(ids, cli_ids("gpt2:" + GPT2_DIR, self.tmp("tricky.txt")))
        self.assertEqual(tok.content_hash, cli_hash("gpt2:" + GPT2_DIR))
        shakespeare = os.path.join(support.SHARED_DATA, "smoke", "tinyshakespeare.txt")
        if os.path.exists(shakespeare):
            with open(shakespeare, encoding="utf-8") as f:
                text = f.read()[:200_000]
            with open(self.tmp("part.txt"), "w", encoding="utf-8") as f:
                f.write(text)
            self.assertEqual(tok.encode(text), cli_ids("gpt2:" + GPT2_DIR, self.tmp("part.txt")))

    def test_sentencepiece_matches_the_cpp_tokenizer(self):
        try:
            import sentencepiece  # noqa: F401
        except ImportError:
            self.skipTest("Debian's python3-sentencepiece is not installed (scripts/install-deps.sh installs it)")
        support.need_binary(self)
        support.write_corpus(self.tmp("corpus"), docs=40)
        with open(self.tmp("corpus", "unicode.txt"), "w", encoding="utf-8") as f:
            f.write((TRICKY + "\n") * 20)
        support.cli("tokenizer", "train", "--input", self.tmp("corpus"), "--vocab-size", "400", "--out",
                    self.tmp("t.model"), "--quiet")
        os.chdir(self.tmp())  # a relative spec is made absolute, as attnres does
        self.addCleanup(os.chdir, support.HERE)
        tok = attnres.make_tokenizer("sp:t.model")
        self.assertEqual(tok.spec, "sp:" + self.tmp("t.model"))
        self.assertEqual(tok.vocab_size, 400)
        text = TRICKY + " the model  reads\n\n   tokens\r\nfrom shards \u2581 literal\u2581\u2581 marks "
        with open(self.tmp("text.txt"), "w", encoding="utf-8", newline="") as f:
            f.write(text)
        ids = tok.encode(text)
        self.assertEqual(ids, cli_ids("sp:" + self.tmp("t.model"), self.tmp("text.txt")))
        self.assertEqual(tok.content_hash, cli_hash("sp:" + self.tmp("t.model")))
        self.assertEqual(tok.decode(ids), text.replace("\u2581", " "))  # U+2581 is SentencePiece's space mark
        self.assertEqual(tok.decode(tok.encode(TRICKY)), TRICKY)  # lossless otherwise (byte fallback)
        self.assertEqual(tok.decode(ids[:3] + [tok.eot_id] + ids[3:]), tok.decode(ids[:3]) + "<|endoftext|>" +
                         tok.decode(ids[3:]))
        with mock.patch.dict(sys.modules, {"sentencepiece": None}):
            with self.assertRaisesRegex(TokenizerError, "python3-sentencepiece"):
                attnres.make_tokenizer("sp:t.model")
        # a model without an end-of-text piece is refused with the C++'s advice
        import sentencepiece as spm
        spm.SentencePieceTrainer.Train(input=self.tmp("corpus", "doc0.txt"), model_prefix=self.tmp("plain"),
                                       vocab_size=30, minloglevel=2)
        with self.assertRaisesRegex(TokenizerError, "no '<\\|endoftext\\|>' piece"):
            attnres.make_tokenizer("sp:" + self.tmp("plain.model"))


if __name__ == "__main__":
    unittest.main()
