"""Contextual embeddings: extraction, standardisation, anisotropy, WSD, the sense plot.

The command line is `python -m bertjax.embed`; see `bertjax.embed` for its subcommands.
"""

from bertjax.embeddings.analysis import (Standardizer, anisotropy, cosine, report,
                                         rogue_dimensions)
from bertjax.embeddings.extract import Embedder, combine_layers, find_word, segments
from bertjax.embeddings.wsd import (Example, SenseInventory, evaluate, read_examples,
                                    read_jsonl, read_semcor_xml)

__all__ = ["Embedder", "Example", "SenseInventory", "Standardizer", "anisotropy",
           "combine_layers", "cosine", "evaluate", "find_word", "read_examples",
           "read_jsonl", "read_semcor_xml", "report", "rogue_dimensions", "segments"]
