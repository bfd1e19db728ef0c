"""Sampling and scoring with the controls and conventions of `attnres sample` and `attnres eval --text`.

generate() follows src/cli/train_commands.cpp's run_sample step for step: the prompt is prefixed with
the end-of-text token (training documents start after one), the next token is drawn from the first
tokenizer.vocab_size logits with the temperature (0: greedy) and top-k, generation stops at
end-of-text, after max_tokens, or when the context is full. Its random numbers are attnres's own
(attnres.sampling.Rng is src/util/rng.hpp: xoshiro256** seeded through splitmix64 from
seed ^ fnv1a64("sample")) and the draw is the same computation, so with the same checkpoint, prompt,
seed and controls it produces the text `attnres sample` prints, unless a float32 rounding difference
between the two implementations' logits moves a draw across a boundary (rare; tested).
"""
from __future__ import annotations

import math
from typing import Iterator, List, Optional, Sequence, Union

import numpy as np
import torch

from .model import AttnResModel
from .tokenizers import Tokenizer, make_tokenizer

_MASK = (1 << 64) - 1


def _splitmix64(state: int):
    state = (state + 0x9E3779B97F4A7C15) & _MASK
    z = state
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return state, z ^ (z >> 31)


def fnv1a64(text: str, h: int = 0xCBF29CE484222325) -> int:
    for c in text.encode("utf-8"):
        h = ((h ^ c) * 0x100000001B3) & _MASK
    return h


class Rng:
    """attnres::Rng (src/util/rng.hpp), bit for bit: a stream keyed by (seed, name)."""

    def __init__(self, seed: int, name: Optional[str] = None):
        seed &= _MASK
        if name is not None:
            seed ^= fnv1a64(name)
        self.s = []
        for _ in range(4):
            seed, word = _splitmix64(seed)
            self.s.append(word)

    @staticmethod
    def _rotl(x: int, k: int) -> int:
        return ((x << k) | (x >> (64 - k))) & _MASK

    def next_u64(self) -> int:
        s = self.s
        result = (self._rotl((s[1] * 5) & _MASK, 7) * 9) & _MASK
        t = (s[1] << 17) & _MASK
        s[2] ^= s[0]
        s[3] ^= s[1]
        s[1] ^= s[2]
        s[0] ^= s[3]
        s[2] ^= t
        s[3] = self._rotl(s[3], 45)
        return result

    def uniform(self) -> float:
        """Uniform in [0, 1) with 53 random bits."""
        return (self.next_u64() >> 11) * 2.0 ** -53


def sample_token(logits: Sequence[float], temperature: float, top_k: int, rng: Rng) -> int:
    """The next token from logits (float32 values), exactly as attnres's sample_token: greedy takes the
    largest logit (the largest id among equal ones); otherwise the top-k (ordered by logit, then id)
    or all tokens in id order, weights exp((l - max) / temperature) in float64, and the first token
    whose running subtraction takes u * sum to <= 0."""
    l = np.asarray(logits, dtype=np.float32).astype(np.float64)
    n = l.size
    if temperature <= 0:
        return int(n - 1 - np.argmax(l[::-1]))
    idx = np.arange(n)
    if 0 < top_k < n:
        idx = np.lexsort((idx, -l))[:top_k]  # logit descending, then id ascending
    kept = l[idx]
    w = np.exp((kept - kept.max()) / temperature)
    total = np.cumsum(w)[-1]  # left to right, as the C++ sums
    u = rng.uniform() * total
    remaining = np.subtract.accumulate(np.concatenate(([u], w)))[1:]  # u - w0, (u - w0) - w1, ...
    hit = np.flatnonzero(remaining <= 0)
    return int(idx[hit[0]] if hit.size else idx[-1])


def _tokenizer_of(model: AttnResModel, tokenizer) -> Tokenizer:
    if tokenizer is None:
        if model.tokenizer_spec is None:
            raise ValueError("the model does not name its tokenizer (a checkpoint written before attnres recorded it does not); "
                             "pass tokenizer='bytes' | 'gpt2:DIR' | 'sp:FILE'")
        tokenizer = model.tokenizer_spec
    tok = make_tokenizer(tokenizer)
    # By content, as attnres eval and sample (docs/data.md "Content hash"): a byte-identical copy anywhere is
    # accepted, a tokenizer retrained at the same path (or another one) refused.
    recorded = (getattr(model, "metadata", None) or {}).get("tokenizer_hash")
    if recorded is not None and tok.content_hash != recorded:
        where = getattr(model, "source_path", None)
        raise ValueError(f"tokenizer {tok.spec} has hash {tok.content_hash} but "
                         f"{repr(where) if where else 'the model'} was trained with a tokenizer of hash {recorded}; "
                         "tokenizers are matched by content: pass tokenizer= naming a byte-identical copy of it")
    if tok.vocab_size > model.config.vocab_size:
        raise ValueError(f"tokenizer '{tok.spec}' ({tok.vocab_size} ids) does not fit the model's vocabulary "
                         f"({model.config.vocab_size})")
    return tok


@torch.no_grad()
def generate_ids(model: AttnResModel, ids: Sequence[int], *, max_tokens: int = 200, temperature: float = 1.0,
                 top_k: int = 0, seed: int = 1, vocab: Optional[int] = None,
                 stop_id: Optional[int] = None) -> Iterator[int]:
    """Yields sampled token ids continuing ``ids`` (with the KV cache: one position of work per token).
    vocab: sample among the first `vocab` logits (default all); stop_id: stop before yielding it."""
    if temperature < 0:
        raise ValueError("temperature must be non-negative (0: greedy)")
    c = model.config
    ids = list(ids)
    if not ids:
        raise ValueError("generate_ids needs at least one token to start from")
    if len(ids) >= c.max_seq_len:
        raise ValueError(f"the prompt is longer than the model's context ({c.max_seq_len} tokens)")
    vocab = c.vocab_size if vocab is None else vocab
    device = model.tok_emb.weight.device
    cache = model.new_cache(1)
    logits = model(torch.tensor([ids], device=device), cache=cache)[0, -1]
    rng = Rng(seed, "sample")
    for _ in range(max_tokens):
        nxt = sample_token(logits[:vocab].float().cpu().numpy(), temperature, top_k, rng)
        if nxt == stop_id:
            return
        yield nxt
        if cache.length >= c.max_seq_len:
            return
        logits = model(torch.tensor([[nxt]], device=device), cache=cache)[0, -1]


def generate(model: AttnResModel, prompt: str, *, tokenizer: Union[str, Tokenizer, None] = None,
             max_tokens: int = 200, temperature: float = 1.0, top_k: int = 0, seed: int = 1) -> str:
    """The text generated after ``prompt`` (without the prompt), as `attnres sample --prompt PROMPT
    --max-tokens N --temperature T --top-k K --seed S` prints it after the prompt. tokenizer: a spec or
    Tokenizer (default: the checkpoint's)."""
    tok = _tokenizer_of(model, tokenizer)
    ids = [tok.eot_id] + tok.encode(prompt)
    out = list(generate_ids(model, ids, max_tokens=max_tokens, temperature=temperature, top_k=top_k, seed=seed,
                            vocab=tok.vocab_size, stop_id=tok.eot_id))
    return tok.decode(out)


@torch.no_grad()
def score(model: AttnResModel, text: Union[str, Sequence[str]], *, tokenizer: Union[str, Tokenizer, None] = None,
          seq: Optional[int] = None) -> dict:
    """Next-token log-likelihood of text(s), as `attnres eval --text FILE...`: each document is scored
    from an end-of-text token in windows of `seq` (default max_seq_len) predicted tokens overlapping by
    one, so every token after the first is predicted once. Returns nll (mean nats per token),
    perplexity, bits_per_byte, tokens, bytes, and per document its ids and per-token log-probabilities
    (logprobs[i] is log p(ids[i+1] | ids[:i+1])). Like attnres eval, raises ValueError when there is nothing
    to score (empty text) or the NLL is not finite."""
    tok = _tokenizer_of(model, tokenizer)
    seq = model.config.max_seq_len if seq is None else seq
    if not 1 <= seq <= model.config.max_seq_len:
        raise ValueError(f"seq {seq} must be between 1 and the model's max_seq_len {model.config.max_seq_len}")
    docs = [text] if isinstance(text, str) else list(text)
    device = model.tok_emb.weight.device
    nll_sum, tokens, nbytes, per_doc = 0.0, 0, 0, []
    for doc in docs:
        if doc.startswith("\ufeff"):  # a byte order mark opening a document is no text of it (docs/data.md)
            doc = doc[1:]
        ids = [tok.eot_id] + tok.encode(doc)
        nbytes += len(doc.encode("utf-8"))
        logprobs: List[float] = []
        for start in range(0, len(ids) - 1, seq):
            n = min(seq, len(ids) - 1 - start)
            window = torch.tensor([ids[start:start + n + 1]], device=device)
            lp = torch.log_softmax(model(window[:, :-1]).double(), dim=-1)
            logprobs += lp[0].gather(-1, window[0, 1:, None])[:, 0].tolist()
        nll_sum -= math.fsum(logprobs)
        tokens += len(logprobs)
        per_doc.append({"ids": ids, "logprobs": logprobs})
    # As attnres eval --text: nothing to score, or a score that is not finite, is an error, never an nll of nan.
    if tokens == 0:
        raise ValueError("nothing to score: the text is empty" if len(docs) <= 1 else
                         "nothing to score: every text is empty")
    nll = nll_sum / tokens
    if not math.isfinite(nll):
        where = f" of '{model.source_path}'" if getattr(model, "source_path", None) else ""
        raise ValueError(f"the NLL came out {nll}: the weights{where} are not usable")
    return {"nll": nll, "perplexity": math.exp(nll),
            "bits_per_byte": nll_sum / math.log(2) / nbytes if nbytes else 0.0, "tokens": tokens, "bytes": nbytes,
            "documents": per_doc}
