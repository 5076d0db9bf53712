"""The twin's tokens: a deterministic tokenizer, synthetic output and logprobs, the drift knob, and the prefix cache's
block keys over token ids.

Tokenizer (documented so clients can predict counts): a token is a run of up to 6 word characters (`\\w`) or one
other non-space character; whitespace is free. Its id is 16 + crc32(piece) mod (vocab - 16); ids 0-15 are
special. A chat prompt is, per message, <|im_start|> role-token content <|im_end|>, then <|im_start|> assistant:
3 tokens per message + 2. A completions prompt given as a list of token ids is taken as is.

Output: a word from a fixed 4-6 letter vocabulary per token, each sent as " word" (one token, and it
re-tokenizes to the same id, so multi-turn prompts that quote earlier answers hit the prefix cache).
Greedy (temperature 0) tokens depend only on (seed, prompt): two twins with the same seed answer alike. `drift`
in [0, 1] makes that fraction of positions pick another token (and shifts logprobs), deterministically, so a
quality-drift check can compare a drift=0 twin with a drifted one. The natural answer length (where a model
would stop, used unless ignore_eos) is also a function of (seed, prompt): 32 to 511 tokens.
"""

from __future__ import annotations

import functools
import re
import zlib
from array import array
from collections.abc import Sequence

import numpy as np

PIECE = re.compile(r"\w{1,6}|[^\w\s]")
SPECIAL = 16
BLOCK = 16  # tokens a prefix-cache block holds
IM_START, IM_END, EOS = 1, 2, 3
ROLES = {"system": 4, "user": 5, "assistant": 6, "tool": 7, "developer": 8, "function": 9}
MASK = (1 << 64) - 1
_C, _V = "bdfgklmnprstvz", "aeiou"
WORDS = [a + b + c + d for a in _C for b in _V for c in _C for d in _V][:512] + ["the", "and", "of", "to"]


def mix(x: int) -> int:
    """splitmix64 finaliser: a well-spread 64-bit hash of an int."""
    x = (x + 0x9E3779B97F4A7C15) & MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK
    return x ^ (x >> 31)


class Tokenizer:
    """Tokenizing is most of a twin's CPU under load (a coding agent's request carries ~12k tokens, most of them the
    same system prompt and earlier turns again), and a twin that falls behind measures its host, not the modelled
    GPU: so each piece's id is kept, and each recent text's ids too."""

    PIECES_KEPT = 1 << 20  # distinct pieces remembered (a client sending random text cannot grow it further)

    def __init__(self, vocab_size: int) -> None:
        self.span = vocab_size - SPECIAL
        self.word_ids = [self.piece_id(w) for w in WORDS]
        self._ids: dict[str, int] = {}
        self._text_ids = functools.lru_cache(maxsize=512)(self._encode)

    def piece_id(self, piece: str) -> int:
        return SPECIAL + zlib.crc32(piece.encode()) % self.span

    def encode(self, text: str) -> list[int]:
        return list(self._text_ids(text))

    def _encode(self, text: str) -> tuple[int, ...]:
        if len(self._ids) > self.PIECES_KEPT:
            self._ids.clear()
        ids, piece_id = self._ids, self.piece_id
        return tuple([ids.get(p) or ids.setdefault(p, piece_id(p)) for p in PIECE.findall(text)])

    def encode_chat(self, messages: Sequence[dict]) -> list[int]:
        ids: list[int] = []
        for m in messages:
            ids += (IM_START, ROLES.get(m.get("role"), 5))
            ids += self.encode(message_text(m.get("content")))
            ids.append(IM_END)
        return ids + [IM_START, ROLES["assistant"]]


def message_text(content) -> str:
    """Text of a message's content: a string, or the text parts of a list of parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return " ".join(p.get("text", "") for p in content if isinstance(p, dict))


def prompt_digest(ids: Sequence[int]) -> int:
    return zlib.crc32(array("I", ids).tobytes()) ^ (len(ids) << 32)


class Synth:
    """Output token i of one request: word index, its logprob and the top alternatives."""

    def __init__(self, digest: int, seed: int, drift: float, nonce: int = 0) -> None:
        self.base = mix(digest ^ mix(seed) ^ mix(nonce << 1))
        self.drift_base = mix(self.base ^ 0xD1F7)
        self.drift, self.drift_cut = drift, int(drift * (1 << 64))

    def natural_length(self) -> int:
        return 32 + mix(self.base ^ 0xE05) % 480

    def _drifted(self, i: int) -> bool:
        return self.drift_cut > 0 and mix(self.drift_base + i) < self.drift_cut

    def word(self, i: int) -> int:
        h = mix(self.base + i)
        w = h % len(WORDS)
        if self._drifted(i):
            w = (w + 1 + (h >> 20) % (len(WORDS) - 1)) % len(WORDS)
        return w

    def logprob(self, i: int) -> float:
        h = mix(self.base + i + (0x5EED if self._drifted(i) else 0))
        return -((h >> 11) % 1000) / 1000 * 0.7

    def top(self, i: int, n: int) -> list[tuple[int, float]]:
        """The chosen word first, then n-1 others with lower logprobs."""
        w, lp = self.word(i), self.logprob(i)
        out = [(w, lp)]
        for j in range(1, n):
            h = mix(self.base + i * 31 + j)
            gap = 0.5 * j + (h >> 40) % 100 / 100
            if self.drift_cut:  # a drifting twin's distribution differs a little at every position, not just
                gap *= 1 + 2 * self.drift * ((mix(self.drift_base + i * 31 + j) % 1000) / 1000 - 0.5)  # its choices
            out.append(((w + j * 7 + h % 3) % len(WORDS), lp - gap))
        return out


_CHUNK = 1024  # blocks of weights made when a prompt first needs them, not at import (every run imports this)


@functools.cache
def _weight_chunk(k: int) -> np.ndarray:
    return np.random.default_rng((0x7E1, k)).integers(1, 1 << 62, size=(_CHUNK, BLOCK), dtype=np.uint64) | np.uint64(1)


def _weights(n_blocks: int) -> np.ndarray:
    chunks = [_weight_chunk(k) for k in range(-(-n_blocks // _CHUNK))]
    return (chunks[0] if len(chunks) == 1 else np.concatenate(chunks))[:n_blocks]


def chain_keys(ids: list[int], n_blocks: int) -> list[int]:
    """Block keys chained over token ids: a block's key depends on every token before it. Key b is the sum over
    all tokens up to block b of token x an odd weight of its position (mod 2^64): two prefixes that differ in one
    token never share a key, and a 12k-token prompt's 750 keys take 0.3 ms, not the 1.5 ms of chained tuple hashes
    (a twin's CPU per request is what decides whether it keeps its modelled pace)."""
    if n_blocks <= 0:
        return []
    tokens = np.asarray(ids[:n_blocks * BLOCK], dtype=np.uint64).reshape(n_blocks, BLOCK)
    with np.errstate(over="ignore"):
        return np.cumsum((tokens * _weights(n_blocks)).sum(axis=1, dtype=np.uint64), dtype=np.uint64).tolist()
