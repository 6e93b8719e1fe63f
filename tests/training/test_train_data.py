"""Datasets and LlamaLoader: masking, padding, packing, distributed sampling. No process group."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("tokenizers")

from higgsfield.dataset import (  # noqa: E402
    AlpacaDataset,
    ChatDataset,
    MultiTurnDataset,
    PromptCompletionDataset,
    TextDataset,
    load_jsonl,
)
from higgsfield.loaders import IGNORE_INDEX, LlamaLoader  # noqa: E402


@pytest.fixture(scope="module")
def tok(tiny_llama_module):
    return tiny_llama_module.make_tokenizer()


def _sums(n):
    return [{"prompt": f"{i}+{i}=", "completion": str(2 * i)} for i in range(n)]


def test_formats_render_segments(tmp_path):
    assert PromptCompletionDataset(_sums(1))[0] == [("0+0=", False), ("0", True)]
    assert TextDataset(["abc", {"text": "d"}])[1] == [("d", True)]
    chat = ChatDataset([{"messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "U"},
                                      {"role": "assistant", "content": "A"}]}])[0]
    assert [t for t, train in chat if train] == ["A\n"]
    assert "".join(t for t, _ in chat) == "<|system|>\nS\n<|user|>\nU\n<|assistant|>\nA\n"
    turns = MultiTurnDataset([{"turns": ["q1", "a1", "q2", "a2"]}])[0]
    assert [t for t, train in turns if train] == ["a1\n", "a2\n"]
    alpaca = AlpacaDataset([{"instruction": "I", "input": "", "output": "O"}])[0]
    assert alpaca[1] == ("O", True) and "### Instruction:\nI" in alpaca[0][0]
    (tmp_path / "d.jsonl").write_text(json.dumps({"text": "x"}) + "\n\n" + json.dumps({"text": "y"}) + "\n")
    assert [r["text"] for r in load_jsonl(tmp_path / "d.jsonl")] == ["x", "y"]


def test_bad_rows_name_the_problem(tmp_path):
    with pytest.raises(ValueError, match="row 0 has no 'completion'"):
        PromptCompletionDataset([{"prompt": "a"}])[0]
    with pytest.raises(ValueError, match="role"):
        ChatDataset([{"messages": [{"content": "x"}]}])[0]
    (tmp_path / "bad.jsonl").write_text("{\n")
    with pytest.raises(ValueError, match="bad.jsonl:1"):
        load_jsonl(tmp_path / "bad.jsonl")


def test_prompt_is_masked_and_answer_trained(tok):
    loader = LlamaLoader(PromptCompletionDataset([{"prompt": "12+34=", "completion": "46"}]), tok,
                         max_sequence_length=16, batch_size_per_gpu=1, rank=0, world_size=1)
    batch = loader.batch(0)
    ids, labels = batch["input_ids"][0].tolist(), batch["labels"][0].tolist()
    assert tok.convert_ids_to_tokens(ids[:10]) == ["<s>", "1", "2", "+", "3", "4", "=", "4", "6", "</s>"]
    trained = [i for i, label in zip(ids, labels, strict=True) if label != IGNORE_INDEX]
    assert tok.convert_ids_to_tokens(trained) == ["4", "6", "</s>"]
    assert batch["input_ids"].shape[1] == 16 and batch["attention_mask"][0].sum() == 10
    assert int(batch["num_tokens"]) == 10


def test_distributed_sampling_splits_the_global_batch_and_sets_epochs(tok):
    ds = PromptCompletionDataset(_sums(40))
    ranks = [LlamaLoader(ds, tok, 16, 4, rank=r, world_size=2, seed=3) for r in range(2)]
    one = LlamaLoader(ds, tok, 16, 8, rank=0, world_size=1, seed=3)
    assert len(one) == len(ranks[0]) == 5
    for step in (0, 4, 5, 9):  # 5 and 9: the second epoch
        both = [r.batch(step)["input_ids"] for r in ranks]
        whole = one.batch(step)["input_ids"]
        rows = sorted(map(tuple, [*both[0].tolist(), *both[1].tolist()]))
        assert rows == sorted(map(tuple, whole.tolist()))  # same global batch on 1 or 2 ranks
    seen = [tuple(row) for s in range(5) for row in ranks[0].batch(s)["input_ids"].tolist()]
    seen += [tuple(row) for s in range(5) for row in ranks[1].batch(s)["input_ids"].tolist()]
    assert len(set(seen)) == 40  # one epoch covers every example once
    assert not one.batch(0)["input_ids"].equal(one.batch(5)["input_ids"])  # reshuffled per epoch
    one.set_epoch(1)
    assert next(iter(one))["input_ids"].equal(one.batch(5)["input_ids"])
    steps = [s for s, _ in one.iterate(3, max_steps=7)]
    assert steps == [3, 4, 5, 6]


def test_packing_fills_rows_and_keeps_examples_apart(tok):
    rows = [{"prompt": f"{i}+{i}=", "completion": str(2 * i)} for i in range(0, 100, 7)]
    padded = LlamaLoader(PromptCompletionDataset(rows), tok, 32, 1, rank=0, world_size=1, shuffle=False)
    packed = LlamaLoader(PromptCompletionDataset(rows), tok, 32, 1, packing=True, rank=0, world_size=1,
                         shuffle=False)
    assert len(packed.rows) < len(padded.rows) / 2
    batch = packed.batch(0)
    pos = batch["position_ids"][0].tolist()
    starts = [i for i, p in enumerate(pos) if p == 0]
    assert len(starts) >= 3 and "attention_mask" not in batch
    labels = batch["labels"][0].tolist()
    assert all(labels[i] == IGNORE_INDEX for i in starts)  # never predict across examples
    # every example's answer is still trained exactly once per epoch
    trained = sum(sum(1 for x in packed.batch(s)["labels"][0].tolist() if x != IGNORE_INDEX)
                  for s in range(len(packed)))
    assert trained == sum(len(r["completion"]) + 1 for r in rows)


def test_tokenizers_tokenizer_works_too(tok):
    raw = tok.backend_tokenizer
    loader = LlamaLoader(TextDataset(["12"]), raw, 8, 1, rank=0, world_size=1)
    assert loader.batch(0)["input_ids"][0, :4].tolist() == tok("<s>12</s>", add_special_tokens=False)["input_ids"]


class _OnlyEncode:
    """A tokenizer with an ``encode`` and nothing to batch with: the loader asks it text by text."""

    def __init__(self, tok):
        self.tok, self.bos_token_id, self.eos_token_id, self.pad_token_id = tok, 1, 2, 0
        self.calls = 0

    def convert_tokens_to_ids(self, token):
        return self.tok.convert_tokens_to_ids(token)

    def encode(self, text, add_special_tokens=False):
        self.calls += 1
        return self.tok.encode(text, add_special_tokens=add_special_tokens)


def test_batched_encoding_gives_every_segment_what_encoding_it_alone_gives(tok, monkeypatch):
    import higgsfield.loaders as loaders

    monkeypatch.setattr(loaders, "_BATCH", 7)   # 4 batch calls, the last of 2 examples
    chats = [{"messages": [{"role": "user", "content": f"{i}+{i}="}, {"role": "assistant", "content": str(2 * i)}]}
             for i in range(23)]
    ds = ChatDataset(chats, template="{content}")   # 3 segments an example, the middle one empty
    plain = _OnlyEncode(tok)
    for t in (tok, tok.backend_tokenizer, plain):
        loader = LlamaLoader(ds, t, 32, 1, rank=0, world_size=1)
        for i, (ids, labels) in enumerate(loader.examples):
            segments = [tok.encode(text, add_special_tokens=False) for text, _ in ds[i]]
            want = [1] + [x for seg in segments for x in seg] + [2]
            assert ids == want, (type(t).__name__, i, ids, want)
            assert labels[-len(segments[-1]) - 1:] == segments[-1] + [2]
    assert plain.calls == sum(len(ds[i]) for i in range(len(ds)))


def test_loader_errors(tok):
    with pytest.raises(ValueError, match="fewer than one global batch"):
        LlamaLoader(TextDataset(["1"]), tok, 8, 2, rank=0, world_size=2)
    with pytest.raises(ValueError, match="max_sequence_length"):
        LlamaLoader(TextDataset(["1"]), tok, 1, 1, rank=0, world_size=1)
