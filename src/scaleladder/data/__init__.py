"""The data pipeline: ``scaleladder shard`` (sources -> WebDataset shards + tokenizer +
manifest) and the loader that feeds every rung from them.

Modules, one idea each:

* ``synthetic``  the embedded default data set (shapes, captions, labels)
* ``sources``    where samples come from (synthetic, folder, CSV/JSONL table, existing shards)
* ``labels``     integer labels, or class names mapped to sorted ids
* ``shard``      the atomic, deterministic shard writer
* ``manifest``   the wids-style shard list with checksums and statistics
* ``tokenizer``  WordPiece tokenizer (trained or from a BERT vocab.txt), ``check_vocab``
* ``transforms`` FLAVA pretraining and ViT sample transforms (masks, MLM, ITM negatives)
* ``readers``    a reader = (rank, DataLoader worker): shard assignment and seeds
* ``preflight``  every shard checked before the first batch, the verdict shared by all ranks
* ``loader``     the WebDataset loader: exactly ``steps`` batches on every rank
* ``errors``     ``DataError``: bad input, one line naming the file and key
* ``cli``        ``scaleladder shard`` argument parsing

Nothing heavy is imported here, so ``import scaleladder.data.cli`` stays cheap.
"""
