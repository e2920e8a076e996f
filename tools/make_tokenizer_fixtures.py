"""Tokenizer fixtures for loom's tokenizer tests, made by the reference Python packages.

    python make_tokenizer_fixtures.py OUT_DIR

OUT_DIR gets sp_bpe.model (a Llama 2-style SentencePiece BPE: identity normalization, byte
fallback, split digits), sp_unigram.model (SentencePiece Unigram, default nmt_nfkc
normalization), qwen_style.json (a Qwen2/Qwen3-style tokenizer.json made with `tokenizers`: NFC
normalizer, Split with Qwen's regex, ByteLevel, BPE), nfkc_style.json (the same with NFKC),
added_style.json (nfkc_style with added tokens: special ones with lstrip / rstrip matched in the
raw text, normalized ordinary ones matched after NFKC; several texts hold them), and
expected.json: {"texts": [...100 texts...], "<fixture>": [[ids...] per text]} from
sentencepiece's encode(text) and tokenizers' encode(text, add_special_tokens=False).ids.
"""
import json
import os
import random
import sys

import sentencepiece as spm
from tokenizers import (AddedToken, Regex, Tokenizer, decoders, models, normalizers,
                        pre_tokenizers, trainers)

QWEN_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
                r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

WORDS = ("the quick brown fox jumps over the lazy dog while 42 cats watch 1999 stars "
         "Grüße naïve café façade Köln Zürich résumé Ελληνικά русский текст 日本語 中文 한국어 "
         "العربية עברית हिन्दी ไทย emoji 🎉 🚀 👍 don't it's we're I'll they've").split()

SPECIAL_TEXTS = [
    "", " ", "  leading spaces", "trailing spaces   ", "tabs\tin\tthe\ttext", "line\nbreaks\n\n\n",
    "\r\nwindows\r\nlines", "multiple     inner      spaces", "digits 1234567890 and 3.14159",
    "Hello, World! HELLO world? hello...", "e\u0301 composed? \u00e9 precomposed", "Å vs A\u030a",
    "ﬁ ligature ﬂ and ｆｕｌｌｗｉｄｔｈ ＡＢＣ １２３", "①②③ circled", "ℌ𝔢𝔩𝔩𝔬 math letters",
    "rare 𓀀𓀁 hieroglyphs ꙮ and 𝄞 clef", "zero\u200bwidth\u200bspace", "family 👩‍👩‍👧‍👦 flags 🇯🇵🇫🇷",
    "skin tones 👍🏽👍🏿", "mixed 日本語とEnglishと123", "ALL CAPS SHOUTING", "CamelCaseIdentifier",
    "snake_case_identifier = value_42", "def f(x):\n    return x ** 2\n", "<html><b>bold</b></html>",
    "URL https://example.com/path?q=1&r=2", "email someone@example.org", "€100 £50 ¥1000 $5",
    "quotes “curly” ‘single’ «guillemets»", "em—dash en–dash hyphen-minus", "ÀÉÎÕÜ àéîõü",
    "İstanbul ıi ŞşĞğ", "ß ẞ straße", "Ǆ ǅ ǆ digraphs", "ı̇ dotless", "\u0000nul\u0001ctl",
    "\u00a0no-break\u00a0space", "a\u3000ideographic\u3000space", "한글 자모 각", "ﾊﾝｶｸ halfwidth",
    # Added tokens inside text: `tokenizers` encodes them as their ids, even without
    # add_special_tokens.
    "<|endoftext|> in the middle<|im_start|>of text", "a <mask> b [R]   c  \t<mask>[R]\u3000d",
    "ﬁne fine reﬁned hello world hello  world <|endoftext", "hello world<|endoftext|>hello world",
    "[R]\t \tz <mask>\t x\t\t[R] \t", "  <mask>",
]


def texts():
    rng = random.Random(7)
    out = list(SPECIAL_TEXTS)
    while len(out) < 100:
        n = rng.randint(1, 14)
        sep = rng.choice([" ", " ", " ", "  ", "\n", "\t", ", "])
        out.append(sep.join(rng.choice(WORDS) for _ in range(n)))
    return out


def corpus(path):
    rng = random.Random(1)
    with open(path, "w", encoding="utf-8") as f:
        for _ in range(3000):
            f.write(" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 20))) + "\n")
        for t in SPECIAL_TEXTS[2:20]:
            f.write(t.replace("\n", " ") + "\n")
    return path


def train_sentencepiece(out, corpus_path):
    spm.SentencePieceTrainer.train(
        input=corpus_path, model_prefix=os.path.join(out, "sp_bpe"), model_type="bpe",
        vocab_size=600, byte_fallback=True, split_digits=True, normalization_rule_name="identity",
        remove_extra_whitespaces=False, character_coverage=0.99, minloglevel=2)
    spm.SentencePieceTrainer.train(
        input=corpus_path, model_prefix=os.path.join(out, "sp_unigram"), model_type="unigram",
        vocab_size=300, hard_vocab_limit=False, character_coverage=0.995, minloglevel=2)


def hf_tokenizer(corpus_path, normalizer):
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizer
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=700, special_tokens=["<|endoftext|>", "<|im_start|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train([corpus_path], trainer)
    return tok


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    corpus_path = corpus(os.path.join(out, "corpus.txt"))
    train_sentencepiece(out, corpus_path)
    expected = {"texts": texts()}
    for name in ("sp_bpe", "sp_unigram"):
        sp = spm.SentencePieceProcessor(model_file=os.path.join(out, name + ".model"))
        expected[name] = [sp.encode(t) for t in expected["texts"]]
    for name, normalizer in (("qwen_style", normalizers.NFC()), ("nfkc_style", normalizers.NFKC()),
                             ("added_style", normalizers.NFKC())):
        tok = hf_tokenizer(corpus_path, normalizer)
        if name == "added_style":
            tok.add_special_tokens([AddedToken("<mask>", lstrip=True, normalized=False),
                                    AddedToken("[R]", rstrip=True, normalized=False)])
            tok.add_tokens([AddedToken("ﬁne", normalized=True),
                            AddedToken("hello world", normalized=True),
                            AddedToken("hello", normalized=True),
                            AddedToken("\t", normalized=False)])
        tok.save(os.path.join(out, name + ".json"))
        tok = Tokenizer.from_file(os.path.join(out, name + ".json"))
        expected[name] = [tok.encode(t, add_special_tokens=False).ids for t in expected["texts"]]
    with open(os.path.join(out, "expected.json"), "w", encoding="utf-8") as f:
        json.dump(expected, f, ensure_ascii=False)


if __name__ == "__main__":
    main()
