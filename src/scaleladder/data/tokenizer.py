"""The caption tokenizer: a real WordPiece tokenizer (HF ``tokenizers``), stored beside the shards.

Two ways to get one, both at shard time:

* **trained** on the data set's captions (``--vocab-size``, default 1024 so that it
  fits ``flava-debug``; with few distinct words the trained vocabulary is smaller);
* **loaded** from a BERT-style ``vocab.txt`` (``--vocab``), e.g. ``bert-base-uncased``'s
  30522 tokens for the real FLAVA flavors.

Either way it is written as ``tokenizer.json`` (plus ``vocab.txt``) in the shard
directory and the manifest points to it. Token ids follow BERT: ``[PAD]`` is 0
(the model and ``mlm_labels`` rely on it), and ``[UNK] [CLS] [SEP] [MASK]`` exist.
Text is lower-cased (uncased BERT, as FLAVA uses).

The model's vocabulary must cover the tokenizer's; a smaller tokenizer is allowed, and said: :func:`check_vocab`.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

from scaleladder.data.data_errors import DataError, one_line
from scaleladder.flavors import Flavor
from scaleladder.spec import SpecError

PAD, UNK, CLS, SEP, MASK = "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"
SPECIAL_TOKENS: tuple[str, ...] = (PAD, UNK, CLS, SEP, MASK)  # in id order when trained: [PAD] = 0
TOKENIZER_FILE = "tokenizer.json"
VOCAB_FILE = "vocab.txt"
DEFAULT_VOCAB_SIZE = 1024


def _pipeline(model: models.Model) -> Tokenizer:
    """BERT's text pipeline around a WordPiece model (what ``BertWordPieceTokenizer`` builds)."""
    tok = Tokenizer(model)
    tok.normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True, lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece(prefix="##")
    return tok


def _check_specials(vocab: dict[str, int], where: str) -> None:
    missing = [t for t in SPECIAL_TOKENS if t not in vocab]
    if missing:
        raise DataError(f"{where}: vocabulary lacks special token(s) {' '.join(missing)}")
    if vocab[PAD] != 0:
        raise DataError(f"{where}: {PAD} has id {vocab[PAD]}, but scaleladder needs it to be 0 (padding and mlm labels)")


def _finish(tok: Tokenizer, where: str) -> Tokenizer:
    vocab = tok.get_vocab()
    _check_specials(vocab, where)
    tok.add_special_tokens(list(SPECIAL_TOKENS))
    tok.post_processor = processors.TemplateProcessing(
        single=f"{CLS} $A {SEP}", special_tokens=[(CLS, vocab[CLS]), (SEP, vocab[SEP])]
    )
    return tok


def train_wordpiece(captions: Iterable[str], vocab_size: int = DEFAULT_VOCAB_SIZE) -> Tokenizer:
    """Train a WordPiece vocabulary of at most ``vocab_size`` tokens on ``captions``. Deterministic."""
    captions = list(captions)
    tok = _pipeline(models.WordPiece(unk_token=UNK))
    # Trap (huggingface/tokenizers#1794): the trainer creates the "##x" continuing-subword
    # tokens in hash-map order, and those ids break ties between equally frequent merges,
    # so the same captions give a different vocabulary each run (and our shard sets would
    # not be reproducible). Declaring every "##x" up front, sorted, fixes their ids.
    assert tok.normalizer is not None and tok.pre_tokenizer is not None
    continuing: set[str] = set()
    unique = sorted(set(captions))
    for i in range(0, len(unique), 512):
        # Many captions per call (the per-call cost dominated for short captions): BERT's
        # normaliser turns the newline into a space and the pre-tokenizer splits there,
        # so the words, and their letters, are those of the captions one by one.
        text = tok.normalizer.normalize_str("\n".join(unique[i:i + 512]))
        for word, _span in tok.pre_tokenizer.pre_tokenize_str(text):
            continuing.update(word[1:])
    seeded = list(SPECIAL_TOKENS) + [f"##{ch}" for ch in sorted(continuing)]
    trainer = trainers.WordPieceTrainer(vocab_size=vocab_size, special_tokens=seeded, show_progress=False)
    tok.train_from_iterator(captions, trainer=trainer)
    # Rebuild from the plain vocabulary so that only the five real specials are "special"
    # (the seeded "##x" must stay ordinary tokens).
    vocab = tok.get_vocab()
    if len(vocab) > vocab_size:
        raise DataError(
            f"the captions' alphabet alone needs {len(vocab)} tokens, more than --vocab-size {vocab_size}"
        )
    return _finish(_pipeline(models.WordPiece(vocab=vocab, unk_token=UNK)), "trained tokenizer")


def from_vocab_file(path: str | Path) -> Tokenizer:
    """A BERT tokenizer from a ``vocab.txt`` (one token per line; line number = id)."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: vocabulary file does not exist")
    try:
        model = models.WordPiece.from_file(str(path), unk_token=UNK)
    except Exception as e:  # tokenizers raises a bare Exception for unreadable files
        raise DataError(f"{path}: not a readable WordPiece vocab.txt ({one_line(e)})") from None
    return _finish(_pipeline(model), str(path))


def save(tok: Tokenizer, directory: Path) -> Path:
    """Write ``tokenizer.json`` (what the loader reads) and ``vocab.txt`` (to reuse with ``--vocab``)."""
    path = directory / TOKENIZER_FILE
    tok.save(str(path), pretty=False)
    vocab = tok.get_vocab()
    (directory / VOCAB_FILE).write_text("".join(t + "\n" for t in sorted(vocab, key=vocab.__getitem__)), encoding="utf-8")
    return path


def load_tokenizer(path: str | Path) -> Tokenizer:
    """The ``tokenizer.json`` at ``path`` (the manifest's ``tokenizer_path``), checked for the specials and ``[PAD]`` = 0.

    The one way a tokenizer is read: the transforms' :class:`~scaleladder.data.transforms.TextCodec`
    (in each DataLoader worker) and the tests. The file is used as written (its pipeline and
    post-processor were set by :func:`save`); only its vocabulary is checked.
    """
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: tokenizer file does not exist")
    try:
        tok = Tokenizer.from_file(str(path))
    except Exception as e:  # tokenizers raises a bare Exception on a bad file
        raise DataError(f"{path}: not a tokenizers JSON file ({one_line(e)})") from None
    _check_specials(tok.get_vocab(), str(path))
    return tok


def check_vocab(tokenizer_vocab_size: int, flavor: Flavor, where: str = "the tokenizer") -> str | None:
    """Check that ``flavor``'s embedding covers every id the tokenizer can emit; return a notice, if any.

    The rule is ``tokenizer vocab <= model vocab``:

    * larger: a SpecError. Ids past the embedding table fail deep inside the forward
      (a device-side assert on GPU, an IndexError on CPU).
    * smaller: allowed, with a one-line notice (returned, for the caller to print).
      The model keeps its published vocabulary, so that its FLOPs and memory match
      the seeds; the rows past the tokenizer's ids are simply never used. A run
      records the tokenizer's size (``ShardLoader.record_attrs``) to make it visible.
    * equal: silent.

    Asked for the inputs that read text (data/loader.py's ``INPUT_KINDS``: FLAVA's); ViT reads none.
    """
    if tokenizer_vocab_size > flavor.vocab_size:
        raise SpecError(
            f"{where} has {tokenizer_vocab_size} tokens but model {flavor.name} has a vocabulary of "
            f"{flavor.vocab_size}; re-shard with --vocab-size <= {flavor.vocab_size} or pick a larger flavor"
        )
    if tokenizer_vocab_size < flavor.vocab_size:
        return (
            f"{where} has {tokenizer_vocab_size} tokens, model {flavor.name} keeps its published vocabulary of "
            f"{flavor.vocab_size} (so FLOPs and memory match the seeds): {flavor.vocab_size - tokenizer_vocab_size} "
            "embedding rows go unused"
        )
    return None
