"""The data pipeline: ``scaleladder shard`` (sources -> WebDataset shards + tokenizer +
manifest) and the loader that feeds every rung from them.

Modules, one idea each:

* ``synthetic``  the embedded default data set (shapes, captions, labels)
* ``digits``     scikit-learn's handwritten digits as image folders (``scaleladder digits``), for ``shard``
* ``sources``    where samples come from (synthetic, folder, CSV/JSONL table, existing shards)
* ``labels``     integer labels, or class names mapped to sorted ids
* ``jpeg``       cheap JPEG checks: the header's frame and the end-of-image marker
* ``prepare``    each source image validated (re-encoded only where needed) on a read-ahead thread pool
* ``tarout``     a deterministic tar writer whose hashing and writing run beside the caller
* ``shard``      the atomic, deterministic shard writer
* ``slices``     sharding as N parallel jobs: ``--slice K/N`` writes one slice, ``--gather N`` the set
* ``manifest``   the wids-style shard list with checksums and statistics
* ``tokenizer``  WordPiece tokenizer (trained or from a BERT vocab.txt), ``check_vocab``
* ``transforms`` FLAVA pretraining and ViT sample transforms (masks, MLM, ITM negatives)
* ``pair_transforms`` a models-file model's sample transforms by its inputs: image (labels from the shards, else synthetic), text, image-text
* ``readers``    a reader = (rank, DataLoader worker): shard assignment and seeds
* ``preflight``  every shard checked before the first batch, the verdict shared by all ranks
* ``loader``     the WebDataset loader: exactly ``steps`` batches on every rank
* ``cores``      the rank's cores: which the loader's workers may run on, and ``--workers auto``
* ``devnorm``    uint8 images normalised to float32 on the device (the rank's half of the uint8 transport)
* ``devdecode``  JPEG decode and the image transforms, batched on the device (``--decode gpu``)
* ``data_errors`` ``DataError``: bad input, one line naming the file and key; which rank prints it
* ``shard_command`` ``scaleladder shard``: its arguments and its run

Nothing heavy is imported here, so ``import scaleladder.data.shard_command`` stays cheap.
"""
