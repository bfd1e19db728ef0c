"""The package against the C++ code on checkpoints trained here by the built `attnres` binary, in every
residual mode and control and the baselines (support.CLI_BASELINES): fp32 logits and depth weights against the C++ Model (through the test
helper attnres_cpp_forward: the CLI prints neither), the loss against `attnres eval --text`, sampling
against `attnres sample`, the newest checkpoint against model.safetensors, and a model saved from
Python read back by `attnres eval`."""
import json
import os
import subprocess
import unittest

import numpy as np
import torch

import support
import attnres
from attnres import safetensors
from attnres.checkpoint import checkpoints

import rounding  # the fp32 tolerance from the computation's rounding sensitivity (tests/reference/rounding.py)


class CliTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        support.need_binary(cls)
        support.need_binary(cls, support.CPP_FORWARD)
        cls.tmp = support.TempDir("cli")
        cls.data = support.prepare_synthetic_data(cls.tmp.path)
        cls.runs = {}
        for name, residual, route in support.VARIANTS:
            out = cls.tmp("runs", name)
            support.cli("train", *support.TINY, "--set", f"model.residual={residual}", "--set",
                        f"model.value_route={route}", "--data", cls.data, "--out", out)
            cls.runs[name] = out
        baselines = dict(support.BASELINES)
        for name in support.CLI_BASELINES:
            out = cls.tmp("runs", name)
            support.cli("train", *support.TINY, *support.set_flags(baselines[name]), "--data", cls.data, "--out", out)
            written = attnres.read_config(out).to_json()
            assert all(written[k] == v for k, v in baselines[name].items()), (name, written)
            cls.runs[name] = out
        with open(cls.tmp("corpus", "doc3.txt")) as f:
            cls.text = f.read()[:600]
        with open(cls.tmp("doc.txt"), "w") as f:
            f.write(cls.text)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def cpp_forward(self, weights, inputs):
        path_in, path_out = self.tmp("inputs.safetensors"), self.tmp("forward.safetensors")
        safetensors.save(path_in, {"inputs": inputs.numpy().astype(np.int32)})
        r = subprocess.run([support.CPP_FORWARD, weights, path_in, path_out], capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stderr)
        return safetensors.load(path_out)[0]

    def perturbed(self, name):
        """The baseline run's model with its own parameters (DWA weights, value-residual lambdas, HC, mHC and
        MUDD modules, Delta AttnRes's reads) moved far from their initial values (8 training steps barely move them), saved for the C++
        to read."""
        model = attnres.load(self.runs[name])
        g = torch.Generator().manual_seed(5)
        with torch.no_grad():
            for n, t in model.named_parameters():
                delta_read = model.config.residual in ("delta", "delta_block") and "_res." in n
                if n.startswith(("dwa.", "hc.", "mhc.", "mudd.", "gr.", "gr_final.")) or n.endswith("vres_lambda") \
                        or delta_read:
                    small = n.endswith((".phi", ".w_down", ".w_up", ".w_inject"))  # products over n d inputs
                    t.add_(torch.randn(t.shape, generator=g) * (0.05 if small else 0.5))
        path = self.tmp(f"{name}-perturbed.safetensors")
        attnres.save(model, path, tokenizer="bytes")
        return path

    def test_logits_and_depth_weights_match_the_cpp_model(self):
        g = torch.Generator().manual_seed(11)
        inputs = torch.randint(0, 257, (2, 32), generator=g)
        cases = [(name, os.path.join(run, "model.safetensors")) for name, run in self.runs.items()]
        cases += [(f"{name} perturbed", self.perturbed(name)) for name in support.CLI_BASELINES]
        for name, weights in cases:
            with self.subTest(name):
                model = attnres.load(weights)
                self.assertEqual(model.tokenizer_spec, "bytes")
                self.assertEqual(model.source_path, weights)
                cpp = self.cpp_forward(weights, inputs)
                with torch.no_grad():
                    logits, all_reads = model(inputs, return_weights=True)
                # Both sides compute in fp32: each within its rounding bound of the float64 result, so they
                # differ by at most twice that bound (tests/reference/rounding.py).
                exact = attnres.load(weights, dtype=torch.float64)

                def float64_outputs():
                    with torch.no_grad():
                        lg, rs = exact(inputs, return_weights=True)
                    out = {"logits": lg}
                    out.update({f"read.{r.read}.route.{q}": a for r in rs if r.mixer == "softmax"
                                for q, a in enumerate(r.routes)})
                    return out

                ref64 = float64_outputs()
                bound = rounding.rounding_estimate(float64_outputs)
                tolerance = lambda key: 2 * bound.tolerance(key, ref64[key])  # noqa: E731
                self.assertLessEqual(np.abs(logits.numpy() - cpp["logits"]).max(), tolerance("logits"), f"{name}: logits")
                # DenseFormer's DWAs: the C++ DwaPlan's sources and the weights it mixes with
                dwas = [r for r in all_reads if r.mixer == "dwa"]
                self.assertEqual([f"dwa.{r.read // 2}.sources" for r in dwas],
                                 sorted((k for k in cpp if k.startswith("dwa.") and k.endswith(".sources")),
                                        key=lambda k: int(k.split(".")[1])), name)
                for r in dwas:
                    self.assertEqual(list(r.sources), cpp[f"dwa.{r.read // 2}.sources"].tolist(), f"{name} DWA {r.read}")
                    self.assertTrue(np.array_equal(r.qk[1, 5].numpy(), cpp[f"dwa.{r.read // 2}.alpha"]), name)
                if model.config.residual == "denseformer":
                    self.assertTrue(dwas, name)
                reads = [r for r in all_reads if r.mixer == "softmax"]
                n_reads = len([k for k in cpp if k.startswith("read.") and k.endswith(".sources")])
                self.assertEqual(len(reads), n_reads, name)
                for r in reads:
                    self.assertEqual(list(r.sources), cpp[f"read.{r.read}.sources"].tolist(), f"{name} read {r.read}")
                    for q, alpha in enumerate(r.routes):
                        key = f"read.{r.read}.route.{q}"
                        self.assertLessEqual(np.abs(alpha.numpy() - cpp[key]).max(), tolerance(key),
                                             f"{name}: read {r.read} route {q}")
                    self.assertNotIn(f"read.{r.read}.route.{len(r.routes)}", cpp, f"{name}: read {r.read} routes")
                if reads and name != "rd_average":  # trained queries: the weights are not uniform
                    spread = max((r.qk - 1 / r.qk.shape[-1]).abs().max().item() for r in reads)
                    self.assertGreater(spread, 1e-3, name)

    def test_checkpoint_file_holds_the_same_weights(self):
        for name, run in self.runs.items():
            # every model key of the C++ config loads, and the package writes back the same keys and values
            written = json.loads(safetensors.load(os.path.join(run, "model.safetensors"))[1]["config"])
            self.assertEqual(attnres.read_config(run).to_json(), written, name)
            a = attnres.load(os.path.join(run, "model.safetensors"))
            b = attnres.load(checkpoints(run)[0])  # the newest checkpoint: flat params in ParamLayout order
            for (n, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items()):
                self.assertTrue(torch.equal(x, y), f"{name}: {n}")

    def test_loss_matches_attnres_eval(self):
        for name, run in self.runs.items():
            with self.subTest(name):
                r = support.cli("eval", "--checkpoint", os.path.join(run, "model.safetensors"), "--text",
                                self.tmp("doc.txt"), "--seq", "32", "--json")
                want = json.loads(r.stdout)
                got = attnres.score(attnres.load(run), self.text, seq=32)
                self.assertEqual(got["tokens"], want["tokens"])
                self.assertEqual(got["bytes"], want["bytes"])
                self.assertLess(abs(got["nll"] - want["nll"]) / want["nll"], 1e-6, f"{name}: nll")
                self.assertLess(abs(got["bits_per_byte"] - want["bits_per_byte"]) / want["bits_per_byte"], 1e-6)

    def test_sampling_matches_attnres_sample(self):
        prompt = "the depth "
        for name in ("block", "rd", "denseformer_vres_pair", "rd_vres_convex", "hc", "mudd"):  # the vres decode caches V'
            model = attnres.load(self.runs[name])
            tok = attnres.make_tokenizer("bytes")
            for temperature, top_k, seed in ((0, 0, 1), (1.0, 0, 3), (0.7, 5, 4), (1.3, 40, 5)):
                with self.subTest(f"{name} T={temperature} k={top_k} seed={seed}"):
                    out = subprocess.run([support.BINARY, "sample", "--checkpoint",
                                          os.path.join(self.runs[name], "model.safetensors"), "--prompt", prompt,
                                          "--max-tokens", "40", "--temperature", str(temperature), "--top-k",
                                          str(top_k), "--seed", str(seed)], capture_output=True, check=True).stdout
                    ids = list(attnres.generate_ids(model, [tok.eot_id] + tok.encode(prompt), max_tokens=40,
                                                    temperature=temperature, top_k=top_k, seed=seed,
                                                    vocab=tok.vocab_size, stop_id=tok.eot_id))
                    self.assertEqual(prompt.encode() + tok.decode_bytes(ids) + b"\n", out)
                    text = attnres.generate(model, prompt, max_tokens=40, temperature=temperature, top_k=top_k,
                                            seed=seed)
                    self.assertEqual(text, tok.decode(ids))

    def test_a_model_saved_from_python_reads_in_attnres(self):
        model = attnres.load(self.runs["rd"])
        g = torch.Generator().manual_seed(2)
        batch = torch.randint(0, 257, (4, 33), generator=g)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        for _ in range(3):  # a few fine-tuning steps
            opt.zero_grad()
            model.loss(batch).backward()
            opt.step()
        path = self.tmp("tuned.safetensors")
        # Any metadata text: its digest is the one attnres computes (escapes, non-ASCII).
        attnres.save(model, path, metadata={"note": 'fine-tuned in PyTorch: "héllo" \\ \n\t\x01 \u2028 😀'})
        r = support.cli("eval", "--checkpoint", path, "--text", self.tmp("doc.txt"), "--seq", "32", "--json")
        self.assertNotIn("carries no payload checksum", r.stderr)  # save wrote the digests, and they verify
        want = json.loads(r.stdout)
        got = attnres.score(model, self.text, seq=32)
        self.assertLess(abs(got["nll"] - want["nll"]) / want["nll"], 1e-6)
        info = support.cli("info", path)
        self.assertIn("rd", info.stdout)
        self.assertNotIn("carries no payload checksum", info.stderr)

    def test_damaged_checkpoints_are_refused_as_attnres_refuses_them(self):
        """A flipped byte in weights attnres wrote, and NaN weights: attnres.load refuses what attnres eval
        refuses, naming the same file and tensor (it used to load both and score them)."""
        weights = os.path.join(self.runs["block"], "model.safetensors")
        header, _, begin = safetensors.read_header(weights)
        name, entry = max(header.items(), key=lambda e: e[1]["data_offsets"][0])  # the last tensor in the file
        with open(weights, "rb") as f:
            raw = bytearray(f.read())
        raw[begin + entry["data_offsets"][0] + 1] ^= 0x01
        flipped = self.tmp("flipped.safetensors")
        with open(flipped, "wb") as f:
            f.write(raw)
        arrays, meta = safetensors.load(weights)
        arrays[name] = arrays[name].copy()
        arrays[name].reshape(-1)[3] = np.nan
        nan = self.tmp("nan.safetensors")
        safetensors.save(nan, arrays, meta)
        for path, message in ((flipped, f"'{flipped}': tensor '{name}' does not match its checksum"),
                              (nan, f"'{nan}': tensor '{name}' holds a NaN (element 3 of")):
            with self.subTest(path):
                r = support.cli("eval", "--checkpoint", path, "--text", self.tmp("doc.txt"), check=False)
                self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
                self.assertIn(message, r.stderr)
                with self.assertRaises(ValueError) as caught:
                    attnres.load(path)
                self.assertIn(message, str(caught.exception))


class SavedTokenizerTest(unittest.TestCase):
    """attnres.save keeps the tokenizer's content hash (issue #47: it wrote the spec alone, and `attnres eval` then
    scored the saved weights with a tokenizer of another content, exit 0): the hash the model was loaded with, or
    the given tokenizer's; eval and attnres.score refuse a tokenizer of another hash."""

    def setUp(self):
        support.need_binary(self)
        self.tmp = support.TempDir("saved-tokenizer")
        self.addCleanup(self.tmp.cleanup)
        with open(self.tmp("doc.txt"), "w") as f:
            f.write("a short text to score " * 8)

    def hash_of(self, path):
        return safetensors.read_header(path)[1].get("tokenizer_hash")

    def test_save_records_and_keeps_the_tokenizer_hash(self):
        info = support.cli("tokenizer", "info", "--tokenizer", "bytes").stdout
        model = attnres.AttnResModel(attnres.ModelConfig(vocab_size=257, d_model=16, n_layers=2, n_heads=2,
                                                         mlp_hidden=32, residual="rd"))
        first = self.tmp("first.safetensors")
        attnres.save(model, first, tokenizer="bytes")
        self.assertIsNotNone(self.hash_of(first))
        self.assertIn(self.hash_of(first), info)  # the hash attnres computes
        again = self.tmp("again.safetensors")
        attnres.save(attnres.load(first), again)  # the loaded model's tokenizer, hash kept
        self.assertEqual(self.hash_of(again), self.hash_of(first))
        support.cli("eval", "--checkpoint", again, "--text", self.tmp("doc.txt"), "--seq", "16")
        # Weights trained with another tokenizer at that spec (retrained since): saving them again keeps their
        # hash, and both readers refuse the tokenizer now at the spec.
        other = self.tmp("other.safetensors")
        attnres.save(model, other, tokenizer="bytes", metadata={"tokenizer_hash": "0123456789abcdef"})
        resaved = self.tmp("resaved.safetensors")
        attnres.save(attnres.load(other), resaved)
        self.assertEqual(self.hash_of(resaved), "0123456789abcdef")
        r = support.cli("eval", "--checkpoint", resaved, "--text", self.tmp("doc.txt"), "--seq", "16", check=False)
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        self.assertIn("was trained with a tokenizer of hash 0123456789abcdef", r.stderr)
        with self.assertRaisesRegex(ValueError, "trained with a tokenizer of hash 0123456789abcdef"):
            attnres.score(attnres.load(resaved), "some text", seq=16)


class ByteOrderMarkTest(unittest.TestCase):
    """A byte order mark opening a document is not scored, by `attnres eval --text` nor by attnres.score (issue #47:
    it was three byte tokens)."""

    def test_a_leading_byte_order_mark_is_not_scored(self):
        support.need_binary(self)
        tmp = support.TempDir("bom")
        self.addCleanup(tmp.cleanup)
        model = attnres.AttnResModel(attnres.ModelConfig(vocab_size=257, d_model=16, n_layers=2, n_heads=2,
                                                         mlp_hidden=32, residual="rd"))
        weights = tmp("m.safetensors")
        attnres.save(model, weights, tokenizer="bytes")
        text = "a document that an editor saved with a byte order mark\n"
        for name, data in (("plain.txt", text.encode()), ("bom.txt", b"\xef\xbb\xbf" + text.encode())):
            with open(tmp(name), "wb") as f:
                f.write(data)
        evals = [json.loads(support.cli("eval", "--checkpoint", weights, "--text", tmp(name), "--seq", "32",
                                        "--json").stdout) for name in ("plain.txt", "bom.txt")]
        self.assertEqual(evals[0], evals[1])
        self.assertEqual(evals[1]["bytes"], len(text.encode()))
        got = attnres.score(model, "\ufeff" + text, tokenizer="bytes", seq=32)
        self.assertEqual(got["tokens"], evals[1]["tokens"])
        self.assertLess(abs(got["nll"] - evals[1]["nll"]) / evals[1]["nll"], 1e-5)


class ConfigKeysTest(unittest.TestCase):
    """python/attnres/config.py accepts exactly the model keys `attnres config --keys` lists."""

    def test_the_package_accepts_exactly_the_listed_model_keys(self):
        support.need_binary(self)
        import dataclasses
        from attnres import config
        listed = {line.split()[0][len("model."):] for line in support.cli("config", "--keys").stdout.splitlines()
                  if line.startswith("model.")}
        accepted = {f.name for f in dataclasses.fields(config.ModelConfig)}
        self.assertTrue(listed)
        self.assertEqual(listed, accepted)


if __name__ == "__main__":
    unittest.main()
