"""One small interface over the two tokenizer kinds users have (private).

``transformers`` tokenizers (``AutoTokenizer.from_pretrained(...)``) and raw
``tokenizers.Tokenizer`` objects differ in how they encode and name special
tokens; the loader only needs ``encode`` and the BOS/EOS/PAD ids.
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

    def encode(self, text: str) -> list[int]:
        if hasattr(self.tokenizer, "encode_batch") and not hasattr(self.tokenizer, "convert_tokens_to_ids"):
            return list(self.tokenizer.encode(text, add_special_tokens=False).ids)  # tokenizers.Tokenizer
        return list(self.tokenizer.encode(text, add_special_tokens=False))


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
