"""One small interface over the two tokenizer kinds users have (private).

``transformers`` tokenizers (``AutoTokenizer.from_pretrained(...)``) and raw
``tokenizers.Tokenizer`` objects differ in how they encode and name special
tokens; the loader only needs ``encode_many`` and the BOS/EOS/PAD ids.

``encode_many`` hands a whole list to the tokenizer's batch call: a fast
``transformers`` tokenizer then encodes it in Rust, on every core, where one
``encode`` call per text costs about 27 us of Python each (tiny_llama's 20,000
texts: 0.29 CPU-s batched against 0.55, in every rank). A tokenizer with no
batch call is asked text by text.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class TokenizerView:
    tokenizer: Any
    bos_id: int | None
    eos_id: int | None
    pad_id: int

    def encode_many(self, texts: list[str]) -> list[list[int]]:
        """Each text's ids without special tokens, from one batch call where the tokenizer has one."""
        if not texts:
            return []
        if self._raw():
            return [list(e.ids) for e in self.tokenizer.encode_batch(texts, add_special_tokens=False)]
        if getattr(self.tokenizer, "is_fast", False):   # transformers: __call__ on a list is its batch call
            return [list(ids) for ids in self.tokenizer(texts, add_special_tokens=False)["input_ids"]]
        return [list(self.tokenizer.encode(t, add_special_tokens=False)) for t in texts]

    def _raw(self) -> bool:
        """A ``tokenizers.Tokenizer``: its encodings carry ``.ids``."""
        return hasattr(self.tokenizer, "encode_batch") and not hasattr(self.tokenizer, "convert_tokens_to_ids")


def view(tokenizer: Any) -> TokenizerView:
    if tokenizer is None:
        raise ValueError("LlamaLoader needs a tokenizer, and none is downloaded for you: pass e.g. "
                         "transformers.AutoTokenizer.from_pretrained('meta-llama/Llama-2-7b-hf') or a local one")
    if not hasattr(tokenizer, "encode"):
        raise ValueError(f"tokenizer must be a transformers tokenizer or a tokenizers.Tokenizer, "
                         f"got {type(tokenizer).__name__}")
    if hasattr(tokenizer, "convert_tokens_to_ids"):  # transformers
        bos, eos, pad = tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id
    else:  # tokenizers.Tokenizer: look the usual names up
        def find(*names: str) -> int | None:
            for n in names:
                i = tokenizer.token_to_id(n)
                if i is not None:
                    return int(i)
            return None
        bos, eos, pad = find("<s>", "<bos>", "<|begin_of_text|>"), find("</s>", "<eos>", "<|end_of_text|>"), \
            find("<pad>", "[PAD]")
    if pad is None:
        pad = eos if eos is not None else 0
    return TokenizerView(tokenizer, bos, eos, int(pad))
